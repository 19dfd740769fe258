"""Curriculum: train steps until a held-out accuracy target, `random` against `difficulty_based`.

    .venv/bin/python benchmarks/curriculum.py --seeds 0 1 2
    .venv/bin/python benchmarks/curriculum.py --seeds 7 --steps 40 --target 0.5 --out-name pilot

Per seed: the quickstart's SFT stage runs once (`examples/quickstart/quickstart.yaml`: the
teacher that forgets the carry, 2-digit sums only; its own fresh cache), then the quickstart's
GRPO stage runs once per selector from that SFT checkpoint, on a taskset of mixed difficulty
(`arithmetic_levels`, `--tasks` problems, each of `--levels` by `--weights`: 2-digit sums
without a carry, solved after SFT; with a carry, learnable; 3-digit sums, out of reach) with only
`data_selector.selector_type` changed. Both selectors run with the same seed, taskset, batch
(`--batch-size` tasks × 8 samples), lr schedule, step budget (`--steps`) and experience pipeline
(`pass_rate_calculator`, which changes nothing trained: it reports `selection/valid_ratio`, the
share of a step's tasks whose samples disagree, the ones GRPO learns from).
`difficulty_based` takes the settings of Trinity-RFT's BOTS example (`examples/bots/bots.yaml`:
lamb 0.1, rho 0.1, target_reward 0.5, tau 0, do_sample) with m = the samples per task, and no
offline reference columns (this taskset has none: the posterior learns from rollouts alone).

Held-out accuracy (greedy, `--eval-tasks` problems of each level that no training set holds) is
evaluated at the start and every `--eval-interval` steps; its mean over the levels is the
accuracy of the mix. The result of a run is the first evaluated step at which that mean
reaches `--target`, or "not reached" within the budget. Prints one row per (selector, seed),
then per selector the mean ± std of the steps to target (over the seeds that reached it), the
ratio difficulty_based / random of the means, and writes
`benchmarks/results/curriculum_seeds_<seeds>.json` (`--out-name` renames it).

`--reference` runs BOTS as designed, with an offline pass-rate column: before the GRPO runs
of a seed, `curriculum_reference.py` measures the SFT model's pass rate on each training task
(its workflow, reward and sampling), both selectors read the taskset from that file, and
`difficulty_based` gets the column as `feature_keys` (the result file ends in `_reference`).

Steps, not seconds: on-policy runs with one seed are the same bit for bit on a busy machine, so
other load on the cores changes the wall times recorded beside them, never the steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from algorithms import run  # `trinity run` and its metrics (a script beside this one)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart" / "quickstart.yaml"
SELECTORS = ("random", "difficulty_based")
BOTS = {"lamb": 0.1, "rho": 0.1, "target_reward": 0.5, "tau": 0, "do_sample": True}
LEVELS = ("no_carry", "carry", "three_digit")  # arithmetic_levels' levels 0, 1, 2
REFERENCE_COLUMN = "sft_pass_rate"  # curriculum_reference.py's


def levels_set(name: str, split: str, num_tasks: int, weights: list[int]) -> dict:
    return {
        "name": name,
        "storage_type": "synthetic",
        "path": "arithmetic_levels",
        "split": split,
        "generator_args": {"num_tasks": num_tasks, "weights": weights},
        "format": {"prompt_key": "question", "response_key": "answer"},
    }


def grpo_stage(
    rl_stage: dict, selector: str, args: argparse.Namespace, reference: Path | None = None
) -> dict:
    """The quickstart's GRPO stage on the mixed taskset, ordered by `selector`; with
    `reference`, the taskset is that file (its rows and their offline pass rates)."""
    stage = json.loads(json.dumps(rl_stage))  # a deep copy
    repeat = stage["algorithm"]["repeat_times"]
    share = dict(zip(args.levels, args.weights or [1] * len(args.levels), strict=True))
    weights = [share.get(name, 0) for name in LEVELS]
    taskset = levels_set("levels", "train", args.tasks, weights)
    if reference is not None:  # the same rows, with their offline pass rate, from a file
        taskset = {"name": "levels", "storage_type": "file", "path": str(reference),
                   "format": taskset["format"]}  # fmt: skip
    taskset["data_selector"] = {"selector_type": selector}
    if selector == "difficulty_based":
        taskset["data_selector"]["kwargs"] = {"m": repeat, **BOTS, **args.bots}
        if reference is not None:
            taskset["data_selector"]["feature_keys"] = [REFERENCE_COLUMN]
    evals = [
        levels_set(f"heldout_{name}", "test", args.eval_tasks, [int(k == i) for k in range(3)])
        for i, name in enumerate(LEVELS)
        if name in args.levels
    ]
    buffer = stage["buffer"]
    buffer["batch_size"] = args.batch_size
    buffer["total_steps"] = args.steps
    # enough epochs for the budget: each selector serves ceil(epochs · tasks / batch) batches
    buffer["total_epochs"] = math.ceil(args.steps * args.batch_size / args.tasks) + 1
    buffer["explorer_input"] = {
        "taskset": taskset,
        "eval_tasksets": evals,
        "default_workflow_type": "math_workflow",  # the quickstart's
        "default_reward_fn_type": "arithmetic_reward",  # the last number against the true sum
    }
    stage["explorer"] = {"eval_on_startup": True, "eval_interval": args.eval_interval}
    stage["data_processor"] = {
        "experience_pipeline": {"operators": [{"name": "pass_rate_calculator"}]}
    }
    return stage


def accuracy_by_step(records: list[dict], levels: list[str]) -> dict[int, list[float]]:
    """Held-out greedy accuracy of each of `levels` at each evaluated step."""
    keys = [f"eval/heldout_{name}/accuracy" for name in levels]
    return {r["step"]: [r[k] for k in keys] for r in records if all(k in r for k in keys)}


def task_spread(records: list[dict]) -> dict[str, float | None]:
    """Means over the run's steps of the shares of the step's tasks (`pass_rate_calculator`)
    whose samples disagree (GRPO learns from them), all passed, all failed."""
    key = "experience_pipeline/selection/{}"
    out: dict[str, float | None] = {}
    for name, ratio, flip in (("valid_ratio_mean", "valid_ratio", False),
                              ("all_passed_mean", "<1_ratio", True),
                              ("all_failed_mean", ">0_ratio", True)):  # fmt: skip
        values = [r[key.format(ratio)] for r in records if key.format(ratio) in r]
        mean = statistics.fmean(values) if values else None
        out[name] = 1 - mean if flip and mean is not None else mean
    return out


def steps_to_target(curve: dict[int, list[float]], target: float) -> int | None:
    """The first evaluated step whose mean accuracy over the levels is >= target."""
    return next((s for s in sorted(curve) if statistics.fmean(curve[s]) >= target), None)


def sft_checkpoint(seed: int, sft_stage: dict, base: dict, work: Path, env: dict, steps: int):
    """The quickstart's SFT stage for `seed` (kept in `work`: a rerun reuses it)."""
    sft_dir = work / "ckpt" / base["project"] / "sft"
    if not list(sft_dir.glob("global_step_*")):
        shutil.rmtree(sft_dir, ignore_errors=True)
        stage = json.loads(json.dumps(sft_stage))
        if steps:
            stage["buffer"]["total_steps"] = steps
        run({**base, "seed": seed, "name": "sft", "stages": [stage]}, work, "sft", env)
    return max(sft_dir.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))


def measure_reference(cfg: dict, work: Path, out: Path, env: dict) -> None:
    """`curriculum_reference.py` on `cfg`'s taskset and model: `out`, the rows with their
    `sft_pass_rate`."""
    path = work / "reference.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    script = Path(__file__).with_name("curriculum_reference.py")
    cmd = [sys.executable, str(script), "--config", str(path), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (work / "reference.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"reference pass rates: exit {proc.returncode}\n{proc.stderr[-3000:]}")


def run_seed(seed: int, args: argparse.Namespace, work: Path) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(CONFIG.read_text())
    base["cluster"] = {"ray_address": "local"}  # its own Ray: never join another run's
    base["monitor"] = {"monitor_type": "jsonl"}
    base["model"]["max_response_tokens"] = 7  # "1:1998" and the end token
    base["trainer"]["num_threads"] = args.threads  # the trainer's and the engine's: one process
    base["explorer"]["rollout_model"] = {"num_threads": args.threads}
    sft_stage, rl_stage = base.pop("stages")
    env = {
        **os.environ,
        "TRINITY_CACHE_DIR": str(work / "cache"),
        "TRINITY_CHECKPOINT_ROOT": str(work / "ckpt"),
    }
    ckpt = sft_checkpoint(seed, sft_stage, base, work, env, args.sft_steps)
    # finished (selector, seed) rows: a rerun skips them; a --variant keeps its own
    done_log = work / (f"rows_{args.variant}.jsonl" if args.variant else "rows.jsonl")
    suffix = f"_{args.variant}" if args.variant else ""
    rows = [json.loads(x) for x in done_log.read_text().splitlines()] if done_log.exists() else []

    def config(selector: str, reference: Path | None) -> dict:
        stage = grpo_stage(rl_stage, selector, args, reference)
        cfg = {**base, "seed": seed, "name": f"grpo_{selector}{suffix}", "stages": [stage]}
        # a stage's keys merge into the top level's: the quickstart's taskset must not leak in
        cfg["buffer"] = {**base["buffer"], "explorer_input": stage["buffer"]["explorer_input"]}
        cfg["model"] = {**base["model"], "model_path": str(ckpt)}
        return cfg

    reference = None
    if args.reference:  # the SFT model's pass rate on each training task, measured once
        reference = work / f"reference_tasks{suffix}.jsonl"
        if not reference.exists():
            measure_reference(config("random", None), work, reference, env)
    for selector in args.selectors:
        if any(r["selector"] == selector for r in rows):
            continue
        name = f"grpo_{selector}{suffix}"
        shutil.rmtree(work / "ckpt" / base["project"] / name, ignore_errors=True)
        records, wall = run(config(selector, reference), work, name, env)
        curve = accuracy_by_step(records, args.levels)
        rows.append(
            {
                "selector": selector,
                "seed": seed,
                "steps_to_target": steps_to_target(curve, args.target),
                "start": curve[min(curve)],
                "final": curve[max(curve)],
                "curve": {str(s): v for s, v in sorted(curve.items())},
                **task_spread(records),
                "wall_s": wall,
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
        with done_log.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
    return [r for r in rows if r["selector"] in args.selectors]


def mean_std(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def steps_to_target_stats(
    rows: list[dict], arm: str, names: list[str], target: float, budget: int
) -> dict:
    """Per `arm` value in `names`: mean ± std of `steps_to_target` over the rows (seeds) that
    reached it, and how many did not; printed one line each."""
    stats: dict = {}
    for name in names:
        mine = [r for r in rows if r[arm] == name]
        steps = [r["steps_to_target"] for r in mine if r["steps_to_target"] is not None]
        stats[name] = {"steps_to_target": mean_std(steps), "not_reached": len(mine) - len(steps)}
        s = stats[name]["steps_to_target"]
        cell = f"{s['mean']:.1f} ± {s['std']:.1f}" if s["mean"] is not None else "-"
        print(f"{name}: steps to {target} = {cell} over {s['n']} seeds reaching it "
              f"({stats[name]['not_reached']} not within {budget} steps)")  # fmt: skip
    return stats


def stats_ratio(stats: dict, pair: tuple[str, str]) -> float | None:
    """Mean steps of pair[1] over pair[0]'s, where both have one (and pair[0]'s is not 0)."""
    means = [stats[n]["steps_to_target"]["mean"] for n in pair if n in stats]
    return means[1] / means[0] if len(means) == 2 and None not in means and means[0] else None


def report(rows: list[dict], args: argparse.Namespace) -> dict:
    """Print the table; the per-selector statistics."""
    fmt = "{:>17} {:>5} {:>15} {:>20} {:>20} {:>20} {:>7}"
    print(fmt.format("selector", "seed", "steps_to_target", "start (by level)",
                     "final (by level)", "tasks mixed/1/0", "wall_s"))  # fmt: skip
    for r in rows:
        reached = r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"
        levels = ["/".join(f"{x:.2f}" for x in r[k]) for k in ("start", "final")]
        keys = ("valid_ratio_mean", "all_passed_mean", "all_failed_mean")
        spread = "/".join(f"{r[k]:.2f}" if r[k] is not None else "-" for k in keys)
        print(fmt.format(r["selector"], r["seed"], reached, *levels, spread, f"{r['wall_s']:.0f}"))
    stats = steps_to_target_stats(rows, "selector", args.selectors, args.target, args.steps)
    ratio = stats_ratio(stats, SELECTORS)
    if ratio is not None:
        print(f"difficulty_based / random (mean steps to target): {ratio:.3f}")
    stats["ratio_difficulty_based_over_random"] = ratio
    paired = {}
    for seed in args.seeds:
        steps = {r["selector"]: r["steps_to_target"] for r in rows if r["seed"] == seed}
        if steps.get("random") and steps.get("difficulty_based") is not None:
            paired[seed] = steps["difficulty_based"] / steps["random"]
    if paired:
        print("per seed, difficulty_based / random: "
              + ", ".join(f"seed {k}: {v:.3f}" for k, v in paired.items()))  # fmt: skip
    stats["ratio_per_seed"] = paired
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--selectors", nargs="*", default=list(SELECTORS), choices=SELECTORS,
        help="none: only the SFT models, to prepare a --work folder",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=80, help="GRPO step budget per run")
    ap.add_argument("--target", type=float, default=0.58, help="held-out accuracy of the mix")
    ap.add_argument("--eval-interval", type=int, default=1, help="steps between evaluations")
    ap.add_argument(
        "--levels", nargs="+", default=list(LEVELS), choices=LEVELS,
        help="the levels in the taskset (equal shares) and in the held-out mean",
    )  # fmt: skip
    ap.add_argument(
        "--weights", type=int, nargs="+", default=None,
        help="each of --levels' share of the training problems (default: equal)",
    )  # fmt: skip
    ap.add_argument("--tasks", type=int, default=240, help="training problems")
    ap.add_argument("--eval-tasks", type=int, default=100, help="held-out problems per level")
    ap.add_argument("--batch-size", type=int, default=16, help="tasks per step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument(
        "--reference", action="store_true",
        help="BOTS as designed: measure the SFT model's pass rate on each training task first "
        "(curriculum_reference.py) and give it to difficulty_based as a feature_keys column",
    )  # fmt: skip
    ap.add_argument(
        "--bots", type=lambda kv: dict([kv.split("=", 1)]), action="append", default=[],
        metavar="KEY=VALUE",
        help="a difficulty_based kwarg over the BOTS example's (a YAML value; repeatable)",
    )  # fmt: skip
    ap.add_argument(
        "--variant", default="",
        help="a name for these settings: its runs and rows are kept apart in --work",
    )  # fmt: skip
    ap.add_argument("--sft-steps", type=int, default=0, help="0: the quickstart's (1200)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out-name", default=None, help="JSON file name, no suffix")
    ap.add_argument(
        "--work", type=Path, default=None,
        help="working folder; an existing one is resumed (its SFT models and finished rows kept)",
    )  # fmt: skip
    args = ap.parse_args()
    args.bots = {k: yaml.safe_load(v) for d in args.bots for k, v in d.items()}
    work = args.work or Path(tempfile.mkdtemp(prefix="curriculum_"))
    rows = []
    for seed in args.seeds:
        rows += run_seed(seed, args, work / f"seed_{seed}")
    if not args.selectors:
        print(f"SFT models ready in {work}")
        return
    stats = report(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "out_name", "work")}
    result = {"config": str(CONFIG.relative_to(ROOT)), "settings": settings,
              "bots": {**BOTS, **args.bots},
              "runs": rows, "stats": stats, "logs": str(work)}  # fmt: skip
    name = args.out_name or "curriculum_seeds_" + "_".join(str(s) for s in args.seeds)
    name += "_reference" if args.reference and not args.out_name else ""
    name += f"_{args.variant}" if args.variant and not args.out_name else ""
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"logs and checkpoints: {work}")


if __name__ == "__main__":
    main()
