"""Async modes, weight-sync cost, start-up time and memory of the decoupled runtime, in one run.

    .venv/bin/python benchmarks/async_modes.py [--preset 10m] [--steps 8] [--sync-presets 10m 50m]

Table 1 (modes): the same train steps (4 tasks x 8 samples, up to 64 response tokens each) in
  sync          sync_interval 1, sync_offset 0 (on-policy lockstep)
  sync (shared) the same with sync_method shared (the engine maps the trainer's weights)
  off-policy    sync_offset 1 (the explorer produces step s+1 while the trainer trains s)
  interval 4    sync_interval 4
  async         mode explore and mode train as two `trinity run` processes on a
                `ray start --head` cluster (the explorer takes the newest weights, never waits)
  for a CPU-bound workflow (math_workflow) and for one that waits 0.2 s per task on its
  environment (simulated I/O). Seconds per step are taken between the arrival of the first and
  the last step's metrics (start-up excluded); speed-up is against sync with the same workflow.
Table 2 (sync): one weight sync (trainer half in one Ray actor, engine half in another, until the
  engine holds the weights as the engine does: a method that hands its tensors over is kept,
  `nccl`'s buckets are copied into the engine's own tensors) per method for each preset's
  weights, against a plain in-process memory copy (`clone`) of the same bytes. Median of 3
  after a warm-up.
Table 3 (start-up): `trinity run` start to the first finished step, and the peak PSS of the whole
  process tree (driver, Ray, actors), from the sync run with the CPU-bound workflow.
Writes benchmarks/results/async_modes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from trinity.common.memory import tree_pss_bytes  # noqa: E402

SLOW_WORKFLOW = """\
import asyncio
from trinity.workflows.math_workflow import MathWorkflow

class WaitsOnEnvironment(MathWorkflow):
    async def run(self, task, model):
        await asyncio.sleep(0.2)  # the environment answers after 0.2 s
        return await super().run(task, model)
"""

MODES = {
    "sync": ["synchronizer.sync_interval=1", "synchronizer.sync_offset=0"],
    "sync (shared)": [
        "synchronizer.sync_interval=1",
        "synchronizer.sync_offset=0",
        "synchronizer.sync_method=shared",
    ],
    "off-policy": ["synchronizer.sync_interval=1", "synchronizer.sync_offset=1"],
    "interval 4": ["synchronizer.sync_interval=4", "synchronizer.sync_offset=0"],
}


def write_config(tmp: Path, preset: str, steps: int, workflow: str) -> Path:
    cfg = tmp / f"{workflow.replace('.', '_')}.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: bench
        name: async
        checkpoint_root_dir: {tmp / "ckpt"}
        seed: 0
        model: {{model_path: "tiny://{preset}?seed=0", max_response_tokens: 64}}
        algorithm: {{algorithm_type: grpo, repeat_times: 8}}
        buffer:
          batch_size: 4
          total_steps: {steps}
          explorer_input:
            taskset:
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 2, num_tasks: 2000}}
              format: {{prompt_key: question, response_key: answer}}
            default_workflow_type: {workflow}
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue}}
        explorer: {{runner_per_model: 32, eval_interval: 0}}
        trainer: {{micro_batch_size_per_gpu: 32, use_dynamic_bsz: false, save_interval: 0}}
        monitor: {{monitor_type: jsonl}}
        """)
    )
    return cfg


def tree_pss_mb(root_pid: int) -> float:
    """PSS (MB) of a process and all its descendants (`trinity.common.memory`)."""
    return tree_pss_bytes(root_pid) / 2**20


def watch(
    procs: list[subprocess.Popen], metrics: Path, timeout: float, also: tuple[int, ...] = ()
) -> dict:
    """Wait for `procs`, noting when each step's train metrics arrive and the peak PSS of their
    process trees and those of the pids in `also` (a `ray start` head and its workers)."""
    t0, seen, arrivals, peak, last_pss = time.perf_counter(), 0, {}, 0.0, 0.0
    while any(p.poll() is None for p in procs):
        now = time.perf_counter()
        if now - t0 > timeout:
            for p in procs:
                p.kill()
            raise TimeoutError(f"run did not finish in {timeout}s")
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            for line in lines[seen:]:
                rec = json.loads(line)
                if "train/loss" in rec:
                    arrivals.setdefault(rec["step"], now - t0)
            seen = len(lines)
        if now - last_pss > 0.5:
            pss = sum(tree_pss_mb(pid) for pid in [*(p.pid for p in procs), *also])
            peak, last_pss = max(peak, pss), now
        time.sleep(0.05)
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"run failed (exit {p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
    if metrics.exists():  # steps written after the last poll
        for line in metrics.read_text().splitlines()[seen:]:
            rec = json.loads(line)
            if "train/loss" in rec:
                arrivals.setdefault(rec["step"], time.perf_counter() - t0)
    steps = sorted(arrivals)
    per_step = (arrivals[steps[-1]] - arrivals[steps[0]]) / max(1, len(steps) - 1)
    return {
        "steps": len(steps),
        "s_per_step": per_step,
        "first_step_s": arrivals[steps[0]],
        "wall_s": time.perf_counter() - t0,
        "peak_pss_mb": peak,
    }


def trinity(cfg: Path, sets: list[str], env: dict) -> subprocess.Popen:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg), *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_mode(cfg: Path, mode: str, env: dict, timeout: float) -> dict:
    run_dir = cfg.parent / "ckpt" / "bench" / "async"
    shutil.rmtree(run_dir, ignore_errors=True)
    if mode != "async":
        sets = MODES[mode]
        return watch([trinity(cfg, sets, env)], run_dir / "metrics.jsonl", timeout)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))  # short: Ray's socket paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**env, "RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "token"}
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", f"--num-cpus={os.cpu_count()}", "--include-dashboard=false",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("ray start --head did not come up") from None
                time.sleep(0.5)
        common = [f"cluster.ray_address=127.0.0.1:{port}"]
        procs = [trinity(cfg, [*common, f"mode={m}"], env) for m in ("train", "explore")]
        return watch(procs, run_dir / "metrics.trainer.jsonl", timeout, also=(head.pid,))
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        subprocess.run(["pkill", "-f", str(ray_tmp)], check=False)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def sync_rows(presets: list[str], tmp: Path) -> list[dict]:
    """One weight sync per method and preset, trainer and engine in separate Ray actors."""
    import ray
    import torch

    from trinity.common.rollout import Peers
    from trinity.sync.method import state_nbytes, sync_method

    @ray.remote(num_cpus=0)
    class Side:
        def __init__(self, preset: str) -> None:
            from transformers import Qwen2ForCausalLM

            from trinity.models.tiny import preset_config

            torch.set_num_threads(1)
            torch.manual_seed(0)
            self.state = Qwen2ForCausalLM(preset_config(preset)).state_dict()

        def nbytes(self) -> int:
            return state_nbytes(self.state)

        def send(self, method: str, version: int, sync_dir: str) -> list:
            return sync_method(method).send(self.state, version, Path(sync_dir))

        def receive(self, method: str, payload: list) -> int:
            # until the engine holds the weights, as the engine does (`load_weights`): a method
            # that hands its tensors over is kept (object-store views, tensors read from the
            # file, the trainer's mapped parameters), any other copied into the engine's own
            transport = sync_method(method)
            got = transport.receive(payload, Peers())
            if transport.hands_over:
                self.held = got
            else:
                for k, t in got.items():
                    self.state[k].copy_(t)
            return len(got)

        def discard(self, method: str, payload: list) -> None:
            sync_method(method).discard(payload)

        def copy_s(self) -> float:
            t0 = time.perf_counter()
            copied = {k: v.clone() for k, v in self.state.items()}
            del copied
            return time.perf_counter() - t0

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for preset in presets:
            trainer, engine = Side.remote(preset), Side.remote(preset)
            nbytes = ray.get(trainer.nbytes.remote())
            copies = sorted(ray.get(trainer.copy_s.remote()) for _ in range(4))[1:]
            copy_s = statistics.median(copies)
            rows.append({"preset": preset, "method": "memory copy (clone)", "mb": nbytes / 2**20,
                         "seconds": copy_s, "vs_copy": 1.0})  # fmt: skip
            for method in ("memory", "checkpoint", "nccl", "shared"):
                times = []
                for version in range(1, 5):  # the first is a warm-up
                    t0 = time.perf_counter()
                    payload = ray.get(trainer.send.remote(method, version, str(tmp / "sync")))
                    ray.get(engine.receive.remote(method, payload))
                    times.append(time.perf_counter() - t0)
                    ray.get(trainer.discard.remote(method, payload))
                secs = statistics.median(times[1:])
                rows.append({"preset": preset, "method": method, "mb": nbytes / 2**20,
                             "seconds": secs, "vs_copy": secs / copy_s})  # fmt: skip
            ray.kill(trainer)
            ray.kill(engine)
    finally:
        ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="10m", help="model of the mode runs")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sync-presets", nargs="+", default=["10m", "50m"])
    ap.add_argument("--modes", nargs="*", default=[*MODES, "async"], help="none: sync table only")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "async_modes.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="async_modes_"))
    (tmp / "benchpkg").mkdir()
    (tmp / "benchpkg" / "__init__.py").write_text("")
    (tmp / "benchpkg" / "slow.py").write_text(SLOW_WORKFLOW)
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}"}
    workflows = {"cpu-bound": "math_workflow", "waits 0.2 s": "benchpkg.slow.WaitsOnEnvironment"}
    mode_rows = []
    try:
        for wname, workflow in workflows.items():
            cfg = write_config(tmp, args.preset, args.steps, workflow)
            base = None
            for mode in args.modes:
                r = run_mode(cfg, mode, env, args.timeout)
                base = r["s_per_step"] if mode == "sync" else base
                r |= {"workflow": wname, "mode": mode}
                r["speedup_vs_sync"] = base / r["s_per_step"] if base else None
                mode_rows.append(r)
                print(f"{wname:12} {mode:11} {r['s_per_step']:6.2f} s/step", flush=True)
        sync = sync_rows(args.sync_presets, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n## Modes ({args.preset} model, {args.steps} steps, 4 tasks x 8 samples x 64 tokens)")
    print("| workflow | mode | s/step | speed-up vs sync | first step (s) | peak PSS (MB) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in mode_rows:
        sp = f"{r['speedup_vs_sync']:.2f}x" if r["speedup_vs_sync"] else ""
        print(f"| {r['workflow']} | {r['mode']} | {r['s_per_step']:.2f} | {sp} | "
              f"{r['first_step_s']:.1f} | {r['peak_pss_mb']:.0f} |")  # fmt: skip
    print("\n## One weight sync (trainer actor -> engine actor)")
    print("| model | method | MB | seconds | vs memory copy |")
    print("|---|---|---:|---:|---:|")
    for r in sync:
        print(f"| {r['preset']} | {r['method']} | {r['mb']:.0f} | {r['seconds']:.3f} | "
              f"{r['vs_copy']:.1f}x |")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "preset": args.preset, "steps": args.steps}
    out.write_text(json.dumps({"meta": meta, "modes": mode_rows, "sync": sync}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
