"""The quickstart over several seeds, each from an empty cache: the numbers the README quotes.

    .venv/bin/python benchmarks/quickstart_seeds.py --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/quickstart_seeds.py --seeds 5 6 --parallel 2 --threads 1
    .venv/bin/python benchmarks/quickstart_seeds.py --seeds 10 11 --set model.model_path='tiny://1m?seed=0' \
        --out-name quickstart_task_seeds   # one model init, different problems and sampling

Each seed runs `trinity run --config examples/quickstart/quickstart.yaml --set seed=S` as a
subprocess with its own fresh `TRINITY_CACHE_DIR` (so the tiny model is built from scratch, as on
a new machine) and its own checkpoint root, then reads what it wrote: held-out greedy and sampled
accuracy at the start, after the SFT stage and after the GRPO stage, the wall time from start
to summary (model build included) and each stage's, the layout the run chose, and the machine's
speed just before the run (`machine_speed.py`: a 1024² fp32 matmul's GFLOP/s on 2 threads). Prints one row per seed, then mean, standard deviation and range,
and writes `benchmarks/results/quickstart_seeds.json` (`--out-name` renames it).

Wall times are only comparable between runs that had the machine to themselves: with
`--parallel 2` the runs share the cores and each takes longer (pass `--threads 1` so they do not
oversubscribe them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart" / "quickstart.yaml"
GREEDY, SAMPLED = "eval/add2_heldout/accuracy", "eval/add2_heldout_sampled/accuracy"


def run_seed(seed: int, work: Path, threads: int | None, extra: list[str]) -> dict:
    """Run the quickstart once for `seed` in `work`; returns its numbers."""
    env = {
        **os.environ,
        "TRINITY_CACHE_DIR": str(work / f"cache_{seed}"),
        "TRINITY_CHECKPOINT_ROOT": str(work / f"ckpt_{seed}"),
    }
    cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(CONFIG)]
    cmd += ["--set", f"seed={seed}"]
    gflops = machine_gflops()  # the machine's speed just before this run (machine_speed.py)
    if threads:
        cmd += ["--set", f"trainer.num_threads={threads}"]
        cmd += ["--set", f"explorer.rollout_model.num_threads={threads}"]
    for override in extra:
        cmd += ["--set", override]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (work / f"seed_{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    run_dir = work / f"ckpt_{seed}" / "quickstart" / "add2"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def last(stage: str, key: str) -> float:
        return [r[key] for r in records if r.get("stage") == stage and key in r][-1]

    start = next(r for r in records if r["step"] == 0 and GREEDY in r)
    return {
        "seed": seed,
        "greedy_start": start[GREEDY],
        "greedy_sft": last("sft", GREEDY),
        "greedy_grpo": last("grpo", GREEDY),
        "sampled_start": start[SAMPLED],
        "sampled_sft": last("sft", SAMPLED),
        "sampled_grpo": last("grpo", SAMPLED),
        "wall_s": wall,
        "sft_s": summary_stage(run_dir, "sft"),
        "grpo_s": summary_stage(run_dir, "grpo"),
        "machine_gflops": gflops,
        "layout": next((x for x in proc.stdout.splitlines() if x.startswith("layout: ")), ""),
    }


def summary_stage(run_dir: Path, name: str) -> float:
    """Seconds the run's summary.json gives stage `name`."""
    stages = json.loads((run_dir / "summary.json").read_text())["stages"]
    return next(s["seconds"] for s in stages if s["name"] == name)


def machine_gflops() -> float:
    """`benchmarks/machine_speed.py`'s yardstick (1024² fp32 matmul, 2 threads), in a child."""
    script = Path(__file__).with_name("machine_speed.py")
    out = subprocess.run([sys.executable, str(script), "--json"], capture_output=True, text=True)
    return float(json.loads(out.stdout)["gflops"])


def summary(rows: list[dict], key: str) -> dict:
    values = [r[key] for r in rows]
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--parallel", type=int, default=1, help="runs at the same time")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per actor")
    ap.add_argument(
        "--set", dest="extra", action="append", default=[], help="KEY=VALUE override, repeatable"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out-name", default="quickstart_seeds", help="JSON file name, no suffix")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quickstart_seeds_"))
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda s: run_seed(s, work, args.threads, args.extra), args.seeds))
    keys = [k for k in rows[0] if k not in ("seed", "layout")]
    print(f"layout: {rows[0]['layout']}")
    header = f"{'seed':>5} " + " ".join(f"{k:>14}" for k in keys)
    print(header)
    for r in rows:
        print(f"{r['seed']:>5} " + " ".join(f"{r[k]:>14.3f}" for k in keys))
    stats = {k: summary(rows, k) for k in keys}
    for name in ("mean", "std", "min", "max"):
        print(f"{name:>5} " + " ".join(f"{stats[k][name]:>14.3f}" for k in keys))
    gain = [r["greedy_grpo"] - r["greedy_sft"] for r in rows]
    print(f"GRPO gain over SFT (greedy): mean {statistics.fmean(gain):.3f}, min {min(gain):.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": str(CONFIG.relative_to(ROOT)),
        "parallel": args.parallel,
        "threads": args.threads,
        "overrides": args.extra,
        "runs": rows,
        "stats": stats,
        "logs": str(work),
    }
    (args.out / f"{args.out_name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"logs and checkpoints: {work}")


if __name__ == "__main__":
    main()
