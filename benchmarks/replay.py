"""Replay: explore steps to a held-out accuracy target with experience replay and without.

    .venv/bin/python benchmarks/replay.py --seeds 0 1 2
    .venv/bin/python benchmarks/replay.py --seeds 7 --steps 30 --work /tmp/replay_pilot

Per seed: the quickstart's SFT stage runs once (shared with `curriculum.py`'s: the same
function and folder layout, so a `--work` of either serves both), then the quickstart's GRPO
stage runs twice from that SFT checkpoint, with an explorer slower than its trainer: each
task's rollout first waits `--delay` s (`plugins/slow_episodes.py`, a stand-in for an
environment, a tool or a sandbox), and `sync_style: trainer_driven`, so the explorer samples
with the newest weights the trainer has. The two runs differ only in the experience buffer:

- `plain`: a queue; the trainer trains each group once and waits for the explorer;
- `replay`: the same queue with `replay_buffer` (reuse at once, each group at most `--uses`
  times, `decay_limit_randomization`, copies at most `--max-staleness` versions behind); the
  trainer trains copies while the explorer works.

Each run has the same explore-step budget (`--steps`; `total_steps` counts train steps, so the
replay run's is `--uses` times larger, and its cosine schedule is stretched with it). Held-out
greedy accuracy (500 problems, the quickstart's `add2_heldout`) is evaluated at the start and
every `--eval-interval` explore steps; the result of a run is the first explore step at which
it reaches `--target`. Prints one row per (buffer, seed), then per buffer the mean ± std of the
explore steps to target, and the ratio replay / plain; writes
`benchmarks/results/replay_seeds_<seeds>.json`.

How much is reused depends on how long the trainer waits, so it is recorded beside each row
(train steps, copies trained): a busy machine changes it, never the explore-step budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import yaml
from algorithms import run  # `trinity run` and its metrics (a script beside this one)
from curriculum import sft_checkpoint, stats_ratio, steps_to_target_stats

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart" / "quickstart.yaml"
PLUGINS = Path(__file__).resolve().parent / "plugins"
ACCURACY = "eval/add2_heldout/accuracy"
BUFFERS = ("plain", "replay")


def rl_stage_for(buffer: str, rl_stage: dict, args: argparse.Namespace) -> dict:
    """The quickstart's GRPO stage with slow rollouts, trainer-driven sync and `buffer`."""
    stage = json.loads(json.dumps(rl_stage))  # a deep copy
    b = stage["buffer"]
    uses = args.uses if buffer == "replay" else 1
    b["total_steps"] = args.steps * uses  # train steps: the same explore-step budget
    experience = b["trainer_input"]["experience_buffer"]
    if buffer == "replay":
        experience["replay_buffer"] = {
            "enable": True,
            "priority_fn": "decay_limit_randomization",
            "priority_fn_args": {"use_count_limit": args.uses},
            "reuse_cooldown_time": 0,
            "max_staleness": args.max_staleness,
        }
    stage["explorer"] = {"eval_on_startup": True, "eval_interval": args.eval_interval}
    stage["synchronizer"] = {"sync_style": "trainer_driven"}
    return stage


def explore_curve(records: list[dict], budget: int) -> dict[int, float]:
    """Held-out greedy accuracy at each evaluated explore step (the run's closing evaluation,
    after its last train step, is numbered by train steps: it is the run's `final`)."""
    return {r["step"]: r[ACCURACY] for r in records if ACCURACY in r and r["step"] <= budget}


def run_seed(seed: int, args: argparse.Namespace, work: Path) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(CONFIG.read_text())
    base["cluster"] = {"ray_address": "local"}  # its own Ray: never join another run's
    base["monitor"] = {"monitor_type": "jsonl"}
    sft_stage, rl_stage = base.pop("stages")
    # the explorer's eval sets: the greedy held-out one alone
    base["buffer"]["explorer_input"]["eval_tasksets"] = base["buffer"]["explorer_input"][
        "eval_tasksets"
    ][:1]
    base["buffer"]["explorer_input"]["default_workflow_type"] = "slow_episodes.SlowMathWorkflow"
    base["buffer"]["explorer_input"]["taskset"]["workflow_args"] = {"delay_s": args.delay}
    env = {
        **os.environ,
        "TRINITY_CACHE_DIR": str(work / "cache"),
        "TRINITY_CHECKPOINT_ROOT": str(work / "ckpt"),
        "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    ckpt = sft_checkpoint(seed, sft_stage, base, work, env, args.sft_steps)
    done_log = work / "replay_rows.jsonl"  # finished (buffer, seed) rows: a rerun skips them
    rows = [json.loads(x) for x in done_log.read_text().splitlines()] if done_log.exists() else []
    for buffer in args.buffers:
        if any(r["buffer"] == buffer for r in rows):
            continue
        name = f"replay_{buffer}"
        shutil.rmtree(work / "ckpt" / base["project"] / name, ignore_errors=True)
        stage = rl_stage_for(buffer, rl_stage, args)
        cfg = {**base, "seed": seed, "name": name, "stages": [stage]}
        cfg["model"] = {**base["model"], "model_path": str(ckpt)}
        records, wall = run(cfg, work, name, env)
        curve = explore_curve(records, args.steps)
        reused = [r.get("replay/reused", 0.0) for r in records if "train/loss" in r]
        explore_steps = sum(1 for r in records if "rollout/reward_mean" in r)
        reached = next((s for s in sorted(curve) if curve[s] >= args.target), None)
        rows.append(
            {
                "buffer": buffer,
                "seed": seed,
                "steps_to_target": reached,
                "start": curve[min(curve)],
                "final": [r[ACCURACY] for r in records if ACCURACY in r][-1],
                "best": max(curve.values()),
                "curve": {str(s): v for s, v in sorted(curve.items())},
                "explore_steps": explore_steps,
                "train_steps": len(reused),
                "copies_trained": sum(reused),
                "wall_s": wall,
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
        with done_log.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
    return [r for r in rows if r["buffer"] in args.buffers]


def report(rows: list[dict], args: argparse.Namespace) -> dict:
    fmt = "{:>7} {:>5} {:>15} {:>6} {:>6} {:>6} {:>8} {:>8} {:>7}"
    print(fmt.format("buffer", "seed", "steps_to_target", "start", "best", "final",
                     "train", "copies", "wall_s"))  # fmt: skip
    for r in rows:
        reached = r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"
        print(fmt.format(r["buffer"], r["seed"], reached, f"{r['start']:.3f}", f"{r['best']:.3f}",
                         f"{r['final']:.3f}", r["train_steps"], f"{r['copies_trained']:.0f}",
                         f"{r['wall_s']:.0f}"))  # fmt: skip
    stats = steps_to_target_stats(rows, "buffer", args.buffers, args.target, args.steps)
    ratio = stats_ratio(stats, BUFFERS)
    if ratio is not None:
        print(f"replay / plain (mean explore steps to target): {ratio:.3f}")
    stats["ratio_replay_over_plain"] = ratio
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--buffers", nargs="+", default=list(BUFFERS), choices=BUFFERS)
    ap.add_argument("--steps", type=int, default=40, help="explore-step budget per run")
    ap.add_argument("--target", type=float, default=0.9, help="held-out greedy accuracy")
    ap.add_argument("--eval-interval", type=int, default=2, help="explore steps between evals")
    ap.add_argument("--delay", type=float, default=2.0, help="seconds each task's rollout waits")
    ap.add_argument("--uses", type=int, default=2, help="replay: times a group is trained")
    ap.add_argument("--max-staleness", type=int, default=4, help="replay: versions a copy may lag")
    ap.add_argument("--sft-steps", type=int, default=0, help="0: the quickstart's (1200)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out-name", default=None, help="JSON file name, no suffix")
    ap.add_argument("--work", type=Path, default=None, help="working folder (resumed if it exists)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="replay_"))
    rows = []
    for seed in args.seeds:
        rows += run_seed(seed, args, work / f"seed_{seed}")
    stats = report(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "out_name", "work")}
    result = {"config": str(CONFIG.relative_to(ROOT)), "settings": settings, "runs": rows,
              "stats": stats, "logs": str(work)}  # fmt: skip
    name = args.out_name or "replay_seeds_" + "_".join(str(s) for s in args.seeds)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"logs and checkpoints: {work}")


if __name__ == "__main__":
    main()
