"""Every rollout algorithm on the quickstart task, in the same budget, from the same SFT model.

    .venv/bin/python benchmarks/algorithms.py --seeds 0 1 --steps 60
    .venv/bin/python benchmarks/algorithms.py --algorithms grpo dapo gspo --seeds 0

Per seed: the quickstart's SFT stage runs once (`examples/quickstart/quickstart.yaml`, its own
fresh cache), then each algorithm runs the quickstart's RL stage from that SFT checkpoint with
only `algorithm.algorithm_type` changed (same tasks, samples per task, lr schedule, `--steps`
train steps). Reads held-out greedy and sampled accuracy after SFT and after the RL stage, and
the mean rollout reward of the RL stage's last 10 steps. Prints one row per (algorithm, seed),
then per algorithm the mean, std and range over seeds, and writes
`benchmarks/results/algorithms.json` (`--out-name` renames it).

Records that train offline (`sft`, `dpo`) are not rollout algorithms and are not run, nor is
`on_policy_distill` (this task has no teacher better than the student). Beyond
`algorithm_type`, three records get what they need: `mix` / `mix_chord` read the SFT stage's
teacher demonstrations as their expert buffer, `ppo`'s critic learns at the actor's lr (its
default 1e-5 is tuned for billion-parameter critics), and `dapo` runs without its overlong
penalty (the quickstart's budget, 6 tokens, is the longest right answer, "1:185" and the end
token, so the penalty's last-fifth zone would punish right answers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from quickstart_seeds import summary  # the same statistics (a script beside this one)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart" / "quickstart.yaml"
GREEDY, SAMPLED = "eval/add2_heldout/accuracy", "eval/add2_heldout_sampled/accuracy"
REWARD = "rollout/reward_mean"


def rollout_algorithms() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from trinity.algorithm import ALGORITHM

    return [
        n
        for n in ALGORITHM.names()
        if ALGORITHM.get(n).use_rollout and not ALGORITHM.get(n).teacher_from_auxiliary
    ]


def stage_for(algo: str, rl_stage: dict, expert: dict, steps: int) -> dict:
    """The quickstart's RL stage with `algorithm_type: algo` and what that record needs."""
    stage = json.loads(json.dumps(rl_stage))  # a deep copy
    stage["algorithm"]["algorithm_type"] = algo
    stage["buffer"]["total_steps"] = steps
    stage["explorer"]["eval_interval"] = 0  # the final evaluation only
    if algo in ("mix", "mix_chord"):  # the SFT stage's teacher demonstrations as experts
        stage["buffer"]["trainer_input"]["auxiliary_buffers"] = {"sft_dataset": expert}
    if algo == "ppo":
        lr = stage["algorithm"]["optimizer"]["lr"]
        stage.setdefault("trainer", {})["critic"] = {"optimizer": {"lr": lr}}
    if algo == "dapo":  # L_max = 6 is the longest right answer: the overlong zone would hit it
        stage["algorithm"]["overlong_penalty"] = {"enable": False}
    return stage


def run(config: dict, work: Path, name: str, env: dict) -> tuple[list[dict], float]:
    """`trinity run` on `config` (written to work/name.yaml); its metrics and wall time."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (work / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    run_dir = Path(env["TRINITY_CHECKPOINT_ROOT"]) / config["project"] / config["name"]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines], wall


def last(records: list[dict], key: str) -> float:
    return [r[key] for r in records if key in r][-1]


def run_seed(seed: int, algorithms: list[str], steps: int, work: Path) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(CONFIG.read_text())
    base["cluster"] = {"ray_address": "local"}  # its own Ray: never join another run's
    sft_stage, rl_stage = base.pop("stages")
    env = {
        **os.environ,
        "TRINITY_CACHE_DIR": str(work / "cache"),
        "TRINITY_CHECKPOINT_ROOT": str(work / "ckpt"),
    }
    sft_dir = work / "ckpt" / base["project"] / "sft"
    done_log = work / "rows.jsonl"  # finished (algorithm, seed) rows: a rerun skips them
    if not (sft_dir / "metrics.jsonl").exists() or not list(sft_dir.rglob("global_step_*")):
        sft = {**base, "seed": seed, "name": "sft", "stages": [sft_stage]}
        run(sft, work, "sft", env)
    records = [json.loads(x) for x in (sft_dir / "metrics.jsonl").read_text().splitlines()]
    ckpt = max(sft_dir.rglob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    greedy_sft, sampled_sft = last(records, GREEDY), last(records, SAMPLED)
    rows = [json.loads(x) for x in done_log.read_text().splitlines()] if done_log.exists() else []
    done = {r["algorithm"] for r in rows}
    expert = base["buffer"]["trainer_input"]["experience_buffer"]
    for algo in algorithms:
        if algo in done:
            continue
        stage = stage_for(algo, rl_stage, expert, steps)
        cfg = {**base, "seed": seed, "name": f"rl_{algo}", "stages": [stage]}
        # a folder left by an interrupted run would make trinity pick a fresh name
        shutil.rmtree(work / "ckpt" / base["project"] / f"rl_{algo}", ignore_errors=True)
        cfg["model"] = {**base["model"], "model_path": str(ckpt)}
        records, wall = run(cfg, work, f"rl_{algo}", env)
        rewards = [r[REWARD] for r in records if REWARD in r]
        rows.append(
            {
                "algorithm": algo,
                "seed": seed,
                "greedy_sft": greedy_sft,
                "greedy_rl": last(records, GREEDY),
                "sampled_sft": sampled_sft,
                "sampled_rl": last(records, SAMPLED),
                "reward_last10": statistics.fmean(rewards[-10:]),
                "wall_s": wall,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        with done_log.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
    return [r for r in rows if r["algorithm"] in algorithms]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--algorithms", nargs="+", default=None, help="default: every rollout record")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=60, help="RL train steps per algorithm")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--out-name", default="algorithms", help="JSON file name, no suffix")
    ap.add_argument(
        "--work", type=Path, default=None,
        help="working folder; an existing one is resumed (its SFT models and finished rows kept)",
    )  # fmt: skip
    args = ap.parse_args()
    algorithms = args.algorithms or rollout_algorithms()
    work = args.work or Path(tempfile.mkdtemp(prefix="algorithms_"))
    rows = []
    for seed in args.seeds:
        rows += run_seed(seed, algorithms, args.steps, work / f"seed_{seed}")
    keys = ["greedy_sft", "greedy_rl", "sampled_rl", "reward_last10", "wall_s"]
    print(f"{'algorithm':>18} {'seed':>5} " + " ".join(f"{k:>13}" for k in keys))
    for r in rows:
        print(f"{r['algorithm']:>18} {r['seed']:>5} " + " ".join(f"{r[k]:>13.3f}" for k in keys))
    stats = {}
    print(f"\n{'algorithm':>18} " + " ".join(f"{k + ' mean±std':>22}" for k in keys[1:4]))
    for algo in algorithms:
        mine = [r for r in rows if r["algorithm"] == algo]
        stats[algo] = {k: summary(mine, k) for k in keys}
        cells = [f"{stats[algo][k]['mean']:.3f} ± {stats[algo][k]['std']:.3f}" for k in keys[1:4]]
        print(f"{algo:>18} " + " ".join(f"{c:>22}" for c in cells))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "config": str(CONFIG.relative_to(ROOT)),
        "steps": args.steps,
        "seeds": args.seeds,
        "runs": rows,
        "stats": stats,
        "logs": str(work),
    }
    (args.out / f"{args.out_name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"logs and checkpoints: {work}")


if __name__ == "__main__":
    main()
