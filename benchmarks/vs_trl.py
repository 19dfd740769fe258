"""trinity against TRL's GRPOTrainer: the same tiny model, prompts, reward, budget and steps.

    .venv/bin/pip install -e '.[bench-trl]'       # TRL is an optional extra (trl==1.16.0)
    .venv/bin/python benchmarks/vs_trl.py [--model tiny://10m] [--steps 10] [--repeats 2]
    .venv/bin/python benchmarks/vs_trl.py --model tiny://1m --steps 3 --repeats 1   # a short check

Modes (`--modes`, default: trinity sync, trinity one-step-off, trl, trl defaults), each run a
fresh subprocess, interleaved (A B C A B C ...) `--repeats` times:
  trinity sync          `trinity run`, sync_interval 1, sync_offset 0 (on-policy lockstep)
  trinity one-step-off  the same with sync_offset 1 (the explorer samples step s+1 while the
                        trainer trains step s)
  trinity sync lean, trinity one-step-off lean
                        the same with the rollout engine in the explorer's process
                        (`explorer.rollout_model.in_explorer_process`): one process fewer
  trinity sync one-process, trinity one-step-off one-process
                        the same with `cluster.one_process`: explorer, engine, trainer and the
                        run's services are objects of one process (the default here)
  trinity sync on ray, trinity one-step-off on ray
                        one process on a private Ray instance (`cluster.ray_address: local`):
                        the layout before a one-process run left Ray out
  trl                   TRL's GRPOTrainer (use_cpu, no vLLM: transformers' `generate`), in
                        `benchmarks/vs_trl.py --worker trl`, torch threads `--threads`,
                        settings matched to trinity's (below)
  trl defaults          the same with TRL's own defaults where they differ from trinity's,
                        but fp32: gradient checkpointing on, linear lr decay (what a TRL user
                        meets; TRL's bf16 default on CPU is left out: bf16 trains many times
                        slower than fp32 on CPUs without native bf16 arithmetic)
With no layout key, `trinity sync` and `trinity one-step-off` run the layout the plan chooses
(one process on one CPU machine); `... processes` keep a process per part
(`cluster.one_process: false`). Each trinity run's layout line is printed and kept in the JSON.
Every mode does the same work per step: 4 prompts x 8 samples, up to 64 response tokens each,
GRPO advantages (group mean / std), beta 0 (no KL, no reference model), one optimizer update per
step (AdamW, `--lr` constant, no warm-up, weight decay 0, gradient clip 1.0), fp32, sampling at
temperature 1. The model is one Hugging Face folder for both: `--model` (a `tiny://` URL) is built
or found in trinity's cache first (`trinity.models.resolve_model_path`), and both load that folder.
The task is the quickstart's (examples/quickstart/quickstart.yaml): 2-digit additions with worked
answers (`arithmetic` generator, show_carry), the chat prompt being the bare question as a user
message; TRL gets the same problems in the same order (trinity's taskset reads them sequentially,
TRL's sampler with shuffle_dataset off) and the same 0/1 reward: trinity's `arithmetic_reward` (the
last number of the answer against the true sum), wrapped as a TRL reward function.

Per run, measured by this script on the subprocess (its clock starts just before the process
does):
  steps/s         (steps - 1) / (arrival of the last step's record - arrival of the first's),
                  so start-up and the first step are excluded
  tokens/s        generated response tokens of steps 2..N over that same span (trinity:
                  train/response_length x train/experiences of each step's record in
                  metrics.jsonl; TRL: completions/mean_length x 32 of each step's log)
  first step (s)  process start to the arrival of the first step's record
  peak PSS        the largest sum of the proportional set size over the process tree (for
                  trinity: the driver, its private local Ray instance (RAY_ADDRESS=local) and
                  every actor), sampled every `--interval` s (a lower bound on the true peak)
A step's record arrives when trinity writes its line to metrics.jsonl, or when TRL's `on_log`
callback (logging every step) writes it to this run's steps file; both files are polled every
0.05 s. Prints a table per run and the medians per mode with trinity / TRL ratios, and writes
`benchmarks/results/vs_trl.json` (`--out`). A random-init tiny model rarely emits the end token
or the right sum: responses run to about 64 tokens and rewards are 0 (flat groups, zero
advantages), the same on both sides, so this measures throughput, not learning.

Settings where TRL's defaults differ from trinity's are set to trinity's: fp32 (TRL defaults to
bf16 on CPU), no gradient checkpointing (TRL's default is on), a constant learning rate (TRL's
default decays linearly). Run it on an otherwise idle machine: where other work shares the cores,
torch's OpenMP threads spin-wait for each other and a 2-thread op can take many times as long
(transformers' `generate` of one step's batch on the 1m model: 20 s with 2 threads against
0.4 s with 1 thread or with OMP_WAIT_POLICY=PASSIVE, measured on a busy machine);
`--env OMP_WAIT_POLICY=PASSIVE` sets it for every run (trinity's Ray actors inherit it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from trinity.common.memory import tree_pss_by_process  # noqa: E402
from trinity.config.yaml_io import deep_merge  # noqa: E402

TASKS, SAMPLES, RESPONSE_TOKENS = 4, 8, 64  # per step: prompts, samples per prompt, max tokens
SEED = 0  # the default of --seed
# the quickstart's taskset (examples/quickstart/quickstart.yaml)
TASKSET_ARGS: dict[str, Any] = {
    "digits": 2,
    "min_operand": 10,
    "ops": "+",
    "show_carry": True,
    "num_tasks": 7000,
}
SYNC, OFF = {"sync_interval": 1, "sync_offset": 0}, {"sync_interval": 1, "sync_offset": 1}
LEAN = {"explorer": {"rollout_model": {"in_explorer_process": True}}}
ONE = {"cluster": {"one_process": True}}
ON_RAY = {"cluster": {"one_process": True, "ray_address": "local"}}
PROCESSES = {"cluster": {"one_process": False}}
TRINITY_MODES = {  # mode -> (synchronizer keys, config keys over `trinity_config`'s)
    "trinity sync": (SYNC, {}),
    "trinity one-step-off": (OFF, {}),
    "trinity sync processes": (SYNC, PROCESSES),
    "trinity one-step-off processes": (OFF, PROCESSES),
    "trinity sync lean": (SYNC, LEAN),
    "trinity one-step-off lean": (OFF, LEAN),
    "trinity sync one-process": (SYNC, ONE),
    "trinity one-step-off one-process": (OFF, ONE),
    "trinity sync on ray": (SYNC, ON_RAY),
    "trinity one-step-off on ray": (OFF, ON_RAY),
}
TRL_MODE = "trl"
TRL_DEFAULTS_MODE = "trl defaults"
TRL_MODES = (TRL_MODE, TRL_DEFAULTS_MODE)
ALL_MODES = [*TRINITY_MODES, *TRL_MODES]
DEFAULT_MODES = ["trinity sync", "trinity one-step-off", TRL_MODE, TRL_DEFAULTS_MODE]
INSTALL_HINT = "TRL is not installed: .venv/bin/pip install -e '.[bench-trl]'"
MB = 1024**2


# -- trinity ------------------------------------------------------------------------------------


def trinity_config(
    tmp: Path,
    model_dir: str,
    steps: int,
    lr: float,
    sync: dict[str, int],
    over: dict[str, Any],
    seed: int = SEED,
) -> dict[str, Any]:
    """A `trinity run` config: the quickstart's task and reward at this benchmark's budget, with
    the mode's keys (`over`) merged in."""
    taskset = {
        "storage_type": "synthetic",
        "path": "arithmetic",
        "split": "train",
        "generator_args": TASKSET_ARGS,
        "format": {"prompt_key": "question", "response_key": "answer"},
    }
    base = {
        "project": "bench",
        "name": "vs_trl",
        "checkpoint_root_dir": str(tmp / "ckpt"),
        "seed": seed,
        "model": {
            "model_path": model_dir,
            "max_response_tokens": RESPONSE_TOKENS,
            "temperature": 1.0,
        },
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": SAMPLES,
            "kl_loss_fn": "none",  # beta 0: no reference model
            "optimizer": {
                "lr": lr,
                "lr_warmup_steps": 0,
                "lr_scheduler_type": "constant",
                "weight_decay": 0.0,
                "clip_grad": 1.0,
            },
        },
        "buffer": {
            "batch_size": TASKS,
            "total_steps": steps,
            "explorer_input": {
                "taskset": taskset,
                "default_workflow_type": "math_workflow",
                "default_reward_fn_type": "arithmetic_reward",
            },
            "trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue"}},
        },
        "explorer": {
            "runner_per_model": TASKS * SAMPLES,
            "eval_interval": 0,
            "eval_on_startup": False,
            "rollout_model": {"dtype": "float32"},
        },
        "synchronizer": sync,
        "trainer": {
            "micro_batch_size_per_gpu": TASKS * SAMPLES,
            "use_dynamic_bsz": False,
            "save_interval": 0,  # only at the end, after the last step's record
            "dtype": "float32",
        },
        "monitor": {"monitor_type": "jsonl"},
    }
    return deep_merge(base, over)


def trinity_step(rec: dict[str, Any]) -> tuple[int, float] | None:
    """(step, response tokens) of a metrics.jsonl record that reports a train step."""
    if "train/loss" not in rec:
        return None
    return rec["step"], rec["train/response_length"] * rec["train/experiences"]


# -- TRL ----------------------------------------------------------------------------------------


def trl_step(rec: dict[str, Any]) -> tuple[int, float] | None:
    """(step, response tokens) of a line of the TRL worker's steps file."""
    if "completions/mean_length" not in rec:
        return None
    return rec["step"], rec["completions/mean_length"] * TASKS * SAMPLES


def trl_worker(args: argparse.Namespace) -> int:
    """Train with TRL's GRPOTrainer in this process; one JSON line per step to `args.log`."""
    import torch

    torch.set_num_threads(args.threads)
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        print(f"{INSTALL_HINT}\n(import trl: {e})", file=sys.stderr)
        return 2
    import transformers
    from datasets import Dataset
    from transformers import TrainerCallback

    from trinity.rewards.arithmetic import arithmetic_reward
    from trinity.tasks.synthetic import generate

    rows = generate("arithmetic", "train", args.seed, **TASKSET_ARGS)[: TASKS * args.steps]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
         for r in rows]
    )  # fmt: skip

    def arithmetic_accuracy(completions: list, answer: list[str], **_: Any) -> list[float]:
        """trinity's `arithmetic_reward` of each completion: 1.0 for the right last number."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [arithmetic_reward(t, a, {})["accuracy"] for t, a in zip(texts, answer, strict=True)]

    class StepLog(TrainerCallback):
        """Appends each step's logs to `args.log`, one flushed JSON line per step."""

        def __init__(self, log: Any) -> None:
            self.log = log

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.log.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    config = GRPOConfig(
        output_dir=str(args.out_dir),
        use_cpu=True,
        use_vllm=False,
        seed=args.seed,
        bf16=False,  # TRL's default is bf16 on CPU; fp32 as trinity
        fp16=False,
        # TRL's default is on; trinity's is off (`--trl-defaults`: TRL's own)
        gradient_checkpointing=args.trl_defaults,
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=TASKS * SAMPLES,  # completions: 4 prompts x 8
        gradient_accumulation_steps=1,
        num_generations=SAMPLES,
        max_completion_length=RESPONSE_TOKENS,
        temperature=1.0,
        beta=0.0,
        num_iterations=1,
        learning_rate=args.lr,
        lr_scheduler_type="linear" if args.trl_defaults else "constant",  # TRL's: linear
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.steps,
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "trl": trl.__version__}  # fmt: skip
    with open(args.log, "a", buffering=1) as log:  # line-buffered: the parent polls it
        log.write(json.dumps({"versions": versions}) + "\n")
        trainer = GRPOTrainer(
            model=args.model_dir,
            reward_funcs=[arithmetic_accuracy],
            args=config,
            train_dataset=dataset,
            callbacks=[StepLog(log)],
        )
        trainer.train()
    return 0


# -- running and watching -----------------------------------------------------------------------


def watch(
    proc: subprocess.Popen,
    t0: float,
    metrics: Path,
    parse: Callable[[dict[str, Any]], tuple[int, float] | None],
    interval: float,
    timeout: float,
) -> dict[str, Any]:
    """Until `proc` exits: note when each step's record arrives in `metrics` (seconds since `t0`)
    and its response tokens, and sample the PSS of `proc`'s process tree every `interval` s."""
    arrivals: dict[int, float] = {}
    tokens: dict[int, float] = {}
    extra: dict[str, Any] = {}
    peak, at_peak, last_sample, offset, buf = 0, {}, 0.0, 0, ""

    def read_new() -> None:
        nonlocal offset, buf
        if not metrics.exists() or metrics.stat().st_size == offset:
            return
        with open(metrics) as f:
            f.seek(offset)
            chunk = f.read()
            offset = f.tell()
        now = time.perf_counter() - t0
        buf += chunk
        *lines, buf = buf.split("\n")  # a partly written last line waits for the next read
        for line in filter(None, lines):
            rec = json.loads(line)
            if "startup/ray_s" in rec:  # trinity's start-up timeline (trinity.common.startup)
                extra["startup"] = {
                    k.removeprefix("startup/").removesuffix("_s"): v
                    for k, v in rec.items()
                    if k.startswith("startup/")
                }
            if "versions" in rec:
                extra["versions"] = rec["versions"]
            elif (got := parse(rec)) is not None:
                arrivals.setdefault(got[0], now)
                tokens.setdefault(got[0], got[1])

    while proc.poll() is None:
        now = time.perf_counter()
        if now - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise TimeoutError(f"the run did not finish in {timeout:.0f} s")
        read_new()
        if now - last_sample >= interval:
            by_label: dict[str, int] = {}
            for label, pss in tree_pss_by_process(proc.pid).values():
                by_label[label] = by_label.get(label, 0) + pss
            if (total := sum(by_label.values())) > peak:
                peak, at_peak = total, by_label
            last_sample = now
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    read_new()  # records written after the last poll
    if not arrivals:
        raise RuntimeError(f"no step records in {metrics}")
    steps = sorted(arrivals)
    first, last = steps[0], steps[-1]
    span = arrivals[last] - arrivals[first]
    later_tokens = sum(tokens[s] for s in steps[1:])
    return {
        "steps": len(steps),
        "steps_per_s": (len(steps) - 1) / span if span > 0 else None,
        "tokens_per_s": later_tokens / span if span > 0 else None,
        "response_tokens_per_step": statistics.mean(tokens.values()),
        "first_step_s": arrivals[first],
        "wall_s": wall,
        "peak_pss_mb": peak / MB,
        "pss_at_peak_mb": {k: v / MB for k, v in sorted(at_peak.items(), key=lambda kv: -kv[1])},
        "arrivals_s": [arrivals[s] for s in steps],
        **extra,
    }


def run_once(mode: str, model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of `mode` in a fresh subprocess (its own session) with a fresh temp folder."""
    import yaml

    tmp = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT), **args.env}  # fmt: skip
    parse: Callable[[dict[str, Any]], tuple[int, float] | None]
    if mode in TRINITY_MODES:
        cfg = tmp / "config.yaml"
        body = trinity_config(tmp, model_dir, args.steps, args.lr, *TRINITY_MODES[mode], args.seed)
        cfg.write_text(yaml.safe_dump(body, sort_keys=False))
        cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg)]
        env["RAY_ADDRESS"] = "local"  # a private Ray instance: its processes are the driver's
        metrics, parse = tmp / "ckpt" / "bench" / "vs_trl" / "metrics.jsonl", trinity_step
    else:
        metrics, parse = tmp / "steps.jsonl", trl_step
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "trl",
               "--model-dir", model_dir, "--steps", str(args.steps), "--lr", str(args.lr),
               "--threads", str(args.threads), "--log", str(metrics), "--seed", str(args.seed),
               "--out-dir", str(tmp / "trl_out")]  # fmt: skip
        cmd += ["--trl-defaults"] if mode == TRL_DEFAULTS_MODE else []
    try:
        with open(tmp / "run.log", "w+") as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            r = watch(proc, t0, metrics, parse, args.interval, args.timeout)
            out.seek(0)
            log = out.read()
            if proc.returncode != 0:
                raise RuntimeError(f"{mode} exited {proc.returncode}:\n{log[-4000:]}")
        if mode in TRINITY_MODES:  # the layout the run's plan chose and printed
            lines = log.splitlines()
            at = next((i for i, x in enumerate(lines) if x.startswith("layout: ")), None)
            ray_line = lines[at + 1] if at is not None and at + 1 < len(lines) else ""
            r["layout"] = None if at is None else lines[at]
            r["ray"] = ray_line if ray_line.startswith(("on Ray", "without Ray")) else None
        if r["steps"] != args.steps:
            raise RuntimeError(f"{mode}: {r['steps']} step records, expected {args.steps}")
        return {"mode": mode, **r}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# a bare Ray start as `trinity run` makes it (trinity.launcher.run.init_ray's options): its
# process starts, imports Ray, starts a local instance and gets one actor's first answer
RAY_FLOOR = """
import ray
ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=True)

@ray.remote(num_cpus=0)
class Ping:
    def ping(self):
        return "pong"

print(ray.get(Ping.remote().ping.remote()), flush=True)
"""


def ray_floor_once() -> float:
    """Seconds from a process's start to its first actor's answer on a fresh local Ray
    instance: the part of a run's start-up that is Ray's own, measured bare."""
    env = {**os.environ, "RAY_ADDRESS": "local"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RAY_FLOOR], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    seconds = time.perf_counter() - t0
    proc.wait(timeout=120)
    if line.strip() != "pong" or proc.returncode != 0:
        raise RuntimeError(f"the bare Ray start failed (exit {proc.returncode})")
    return seconds


def check_trl() -> None:
    """Exit 2 with the install command when `import trl` fails (in a throwaway process)."""
    r = subprocess.run([sys.executable, "-c", "import trl"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        print(f"{INSTALL_HINT}\n(import trl: {last})", file=sys.stderr)
        sys.exit(2)


# -- report -------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(runs: list[dict[str, Any]], modes: list[str]) -> list[dict[str, Any]]:
    """Medians per mode, and each trinity mode's ratios to TRL's medians."""
    keys = ("steps_per_s", "tokens_per_s", "response_tokens_per_step", "first_step_s",
            "peak_pss_mb", "wall_s")  # fmt: skip
    out = []
    for mode in modes:
        rows = [r for r in runs if r["mode"] == mode]
        out.append({"mode": mode, "runs": len(rows), **{k: median(rows, k) for k in keys}})
    for base, key in ((TRL_MODE, "vs_trl"), (TRL_DEFAULTS_MODE, "vs_trl_defaults")):
        trl = next((m for m in out if m["mode"] == base), None)
        for m in out:
            if trl is not None and m["mode"] not in TRL_MODES:
                m[key] = {k: ratio(m[k], trl[k]) for k in keys}
    return out


def print_tables(runs: list[dict[str, Any]], medians: list[dict[str, Any]]) -> None:
    print("\n## Runs")
    print("| # | mode | steps/s | tokens/s | response tokens/step | first step (s) "
          "| peak PSS (MB) | wall (s) |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(runs, 1):
        print(f"| {i} | {r['mode']} | {fmt(r['steps_per_s'], '.3f')} | "
              f"{fmt(r['tokens_per_s'], '.0f')} | {r['response_tokens_per_step']:.0f} | "
              f"{r['first_step_s']:.1f} | {r['peak_pss_mb']:.0f} | "
              f"{r['wall_s']:.1f} |")  # fmt: skip
    for key, against in (
        ("vs_trl", "TRL, settings matched"),
        ("vs_trl_defaults", "TRL with its defaults"),
    ):
        if not any(key in m for m in medians):
            continue
        print(
            f"\n## Medians (ratios: trinity / {against}; steps/s and tokens/s above 1 = "
            "trinity faster, first step and PSS above 1 = trinity slower / larger)"
        )
        print(
            "| mode | runs | steps/s | tokens/s | first step (s) | peak PSS (MB) "
            "| steps/s ratio | tokens/s ratio | first step ratio | PSS ratio |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for m in medians:
            v = m.get(key, {})
            keys = ("steps_per_s", "tokens_per_s", "first_step_s", "peak_pss_mb")
            cells = [f"{v[k]:.2f}x" if v.get(k) is not None else "" for k in keys]
            print(f"| {m['mode']} | {m['runs']} | {fmt(m['steps_per_s'], '.3f')} | "
                  f"{fmt(m['tokens_per_s'], '.0f')} | {fmt(m['first_step_s'], '.1f')} | "
                  f"{fmt(m['peak_pss_mb'], '.0f')} | {' | '.join(cells)} |")  # fmt: skip


def print_floor(medians: list[dict[str, Any]], floors: list[float]) -> float:
    """Each mode's time to its first step less the bare Ray start (`ray_floor_once`, median of
    one per round): what is left is the run's own share (imports, checks, model loads, the
    first rollout and update), to compare with TRL's whole time to its first step."""
    floor = statistics.median(floors)
    print(f"\n## Time to the first step less a bare Ray start ({floor:.1f} s, median of "
          f"{len(floors)}: a process's start to its first actor's answer on a fresh local "
          "instance)")  # fmt: skip
    print("| mode | first step (s) | less Ray's start (s) |")
    print("|---|---:|---:|")
    for m in medians:
        first = m["first_step_s"]
        rest = "" if m["mode"] in TRL_MODES or first is None else f"{first - floor:.1f}"
        print(f"| {m['mode']} | {fmt(first, '.1f')} | {rest} |")
    return floor


def print_startup(runs: list[dict[str, Any]]) -> None:
    """trinity's start-up timeline per mode: each mark's median over the runs (seconds since
    the driver's process start; docs/monitoring.md)."""
    from trinity.common.startup import PHASES

    modes = [m for m in dict.fromkeys(r["mode"] for r in runs) if m in TRINITY_MODES]
    if not any("startup" in r for r in runs):
        return
    print("\n## trinity's start-up (medians, s since the driver's process start)")
    print("| mark | " + " | ".join(modes) + " |")
    print("|---|" + "---:|" * len(modes))
    for phase in PHASES:
        cells = []
        for mode in modes:
            values = [r["startup"][phase] for r in runs
                      if r["mode"] == mode and phase in r.get("startup", {})]  # fmt: skip
            cells.append(f"{statistics.median(values):.1f}" if values else "")
        print(f"| {phase} | " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny://10m", help="a tiny:// URL (10m, 1m, ...)")
    ap.add_argument("--steps", type=int, default=10, help="train steps per run (at least 2)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the interleaved modes")
    ap.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=ALL_MODES)
    ap.add_argument("--seed", type=int, default=SEED,
                    help="the model's init, the tasks and their order, sampling (both sides)")  # fmt: skip
    ap.add_argument("--lr", type=float, default=1e-6, help="constant learning rate, both sides")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the TRL process")
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between PSS samples")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in every run's environment (repeatable)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_trl.json")
    # the TRL subprocess (`--worker trl`)
    ap.add_argument("--worker", choices=["trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--log", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--trl-defaults", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "trl":
        return trl_worker(args)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (steps/s is measured after the first step)")
    if bad := [e for e in args.env if "=" not in e]:
        ap.error(f"--env takes KEY=VALUE, got {bad}")
    args.env = dict(e.split("=", 1) for e in args.env)
    if set(TRL_MODES) & set(args.modes):
        check_trl()
    from trinity.models.loading import resolve_model_path

    model = args.model if "seed=" in args.model else f"{args.model}?seed={args.seed}"
    model_dir = resolve_model_path(model)  # built once here, before any run is timed
    runs: list[dict[str, Any]] = []
    floors: list[float] = []
    for rep in range(args.repeats):
        floors.append(ray_floor_once())
        print(f"{'bare Ray start':25} repeat {rep}: {floors[-1]:.1f} s", flush=True)
        for mode in args.modes:
            r = run_once(mode, model_dir, args) | {"repeat": rep}
            runs.append(r)
            print(f"{mode:25} repeat {rep}: {fmt(r['steps_per_s'], '.3f')} steps/s, "
                  f"{fmt(r['tokens_per_s'], '.0f')} tokens/s, "
                  f"first step {r['first_step_s']:.1f} s, "
                  f"peak PSS {r['peak_pss_mb']:.0f} MB"
                  + (f" ({r['layout']})" if r.get("layout") else ""), flush=True)  # fmt: skip
    medians = summarize(runs, args.modes)
    print_tables(runs, medians)
    print_startup(runs)
    floor = print_floor(medians, floors)
    versions = next((r["versions"] for r in runs if "versions" in r), None)
    meta = {"model": model, "model_dir": model_dir, "seed": args.seed, "steps": args.steps,
            "repeats": args.repeats,
            "lr": args.lr, "threads": args.threads, "cpus": os.cpu_count(),
            "per_step": {"prompts": TASKS, "samples": SAMPLES,
                         "max_response_tokens": RESPONSE_TOKENS},
            "pss_interval_s": args.interval, "env": args.env, "versions": versions}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    body = {"meta": meta, "runs": runs, "medians": medians,
            "ray_floor_s": {"runs": floors, "median": floor}}  # fmt: skip
    args.out.write_text(json.dumps(body, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
