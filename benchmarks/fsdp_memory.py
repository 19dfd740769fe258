"""Memory per trainer rank with FSDP2: a model that one rank cannot train under a memory cap
trains on 4 ranks under the same cap, side by side in one run.

    .venv/bin/python benchmarks/fsdp_memory.py                 # 136M-parameter Qwen2, cap 2.0 GB
    .venv/bin/python benchmarks/fsdp_memory.py --cap-gb 0      # no cap: peaks only

A Qwen2-shaped model (`--hidden`, `--layers`; the tiny tokenizer's vocabulary) is built at
random into a temporary folder, and a GRPO trainer (fp32, AdamW, no reference model) runs
`--steps` train steps of `--rows` experiences on `trainer_strategy: fsdp2` with world size 1,
then 4 (each world in a fresh Ray instance). Every rank process runs under the cap: Ray's
`worker_process_setup_hook` puts each worker into a memory cgroup of its own limited to
`--cap-gb` (cgroup v1 or v2, where this process may create one; otherwise the script says so and
reports peaks without a cap). A rank over the cap is killed by the kernel, and the world is
reported as not fitting. Reported per world: fits, each rank's peak RSS (`ru_maxrss`: model
loading included), step time. Prints a table and writes benchmarks/results/fsdp_memory.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CGROUP_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))


def cgroup_root() -> Path | None:
    """Where a memory cgroup can be made (v1's memory hierarchy, or v2's unified one)."""
    for root in CGROUP_ROOTS:
        probe = root / f"trinity_probe_{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        if (root / "memory.limit_in_bytes").exists() or (root / "cgroup.controllers").exists():
            return root
    return None


def cap_this_process() -> None:
    """Ray's worker_process_setup_hook: this worker into a cgroup of its own, capped."""
    root, cap = Path(os.environ["FSDP_BENCH_CGROUP"]), int(os.environ["FSDP_BENCH_CAP"])
    group = root / f"trinity_rank_{os.getpid()}"
    group.mkdir(exist_ok=True)
    limit = "memory.limit_in_bytes" if (root / "memory.limit_in_bytes").exists() else "memory.max"
    (group / limit).write_text(str(cap))
    swap = group / "memory.memsw.limit_in_bytes"  # v1: no swapping past the cap either
    if swap.exists():
        swap.write_text(str(cap))
    (group / "cgroup.procs").write_text(str(os.getpid()))


def peak_rss_gb(rank) -> float:  # run inside a rank actor (`__ray_call__`)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def build_model(folder: Path, hidden: int, layers: int) -> tuple[Path, int]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trinity.models.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def config(folder: Path, model: Path, rows: int, world: int):
    from trinity.config import load_config

    p = folder / f"cfg{world}.yaml"
    p.write_text(
        f"model: {{model_path: {model}, max_response_tokens: 64}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 4, kl_loss_fn: none, "
        "optimizer: {lr: 1.0e-5}}\n"
        f"trainer: {{trainer_strategy: fsdp2, world_size: {world}, use_dynamic_bsz: false, "
        f"micro_batch_size_per_gpu: {rows}}}\n"
        f"buffer: {{batch_size: {rows // 4}, explorer_input: {{taskset: {{path: t}}}}}}\n"
    )
    return load_config(p)


def experiences(vocab: int, rows: int, prompt: int, response: int):
    import torch

    from trinity.common.experience import EID, Experience

    g = torch.Generator().manual_seed(0)
    return [
        Experience(
            tokens=torch.randint(3, vocab, (prompt + response,), generator=g),
            prompt_length=prompt,
            logprobs=-torch.rand(response, generator=g),
            reward=float(i % 2),
            eid=EID(batch=1, task=i // 4, run=i % 4),
        )
        for i in range(rows)
    ]


def run_world(args, model: Path, world: int, cgroup: Path | None) -> dict:
    import ray

    from trinity.trainer.ranks import ShardedTrainer

    env = {}
    runtime_env = {}
    if cgroup is not None and args.cap_gb > 0:
        env = {"FSDP_BENCH_CGROUP": str(cgroup), "FSDP_BENCH_CAP": str(int(args.cap_gb * 1024**3))}
        runtime_env = {"env_vars": env, "worker_process_setup_hook": cap_this_process}
    ray.init(num_cpus=world, include_dashboard=False, log_to_driver=False,
             runtime_env=runtime_env)  # fmt: skip
    out: dict = {"world": world}
    try:
        cfg = config(Path(args.tmp), model, args.rows, world)
        exps = experiences(cfg_vocab(model), args.rows, args.prompt, args.response)
        t0 = time.perf_counter()
        st = ShardedTrainer(cfg, str(model), args.steps, world, 1, 1, 0)
        out["build_s"] = time.perf_counter() - t0
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            st.train_step(copy.deepcopy(exps))
            times.append(time.perf_counter() - t0)
        out["step_s"] = times
        out["peak_rss_gb"] = ray.get([r.__ray_call__.remote(peak_rss_gb) for r in st.ranks])
        out["fits"] = True
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
        out["fits"] = False
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    finally:
        ray.shutdown()
        if cgroup is not None:  # the ranks' groups, empty now
            for group in cgroup.glob("trinity_rank_*"):
                with contextlib.suppress(OSError):
                    group.rmdir()
    return out


def cfg_vocab(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["vocab_size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--cap-gb", type=float, default=2.0)
    ap.add_argument("--worlds", default="1,4")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/fsdp_memory.json"))
    args = ap.parse_args()
    cgroup = cgroup_root() if args.cap_gb > 0 else None
    if args.cap_gb > 0 and cgroup is None:
        print("no memory cgroup can be made here: peaks are reported without a cap")
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        model, params = build_model(Path(tmp) / "model", args.hidden, args.layers)
        results = [run_world(args, model, int(w), cgroup) for w in args.worlds.split(",")]
    cap = f"{args.cap_gb:.1f} GB per rank" if cgroup is not None else "none (peaks only)"
    print(f"\nmodel: Qwen2, {params / 1e6:.0f}M parameters, fp32, AdamW; cap: {cap}")
    print("| world | fits | peak RSS per rank (GB) | step s |")
    print("|---|---|---|---|")
    for r in results:
        peaks = ", ".join(f"{p:.2f}" for p in r.get("peak_rss_gb", [])) or "-"
        step = f"{sum(r['step_s']) / len(r['step_s']):.1f}" if r.get("step_s") else "-"
        print(
            f"| {r['world']} | {'yes' if r['fits'] else 'no: ' + r['error'][:80]} | {peaks} | {step} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"params": params, "cap_gb": args.cap_gb if cgroup else None, "results": results},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
