"""Where a whole run's memory goes: the peak PSS of a `trinity run` process tree, split by process.

    .venv/bin/python benchmarks/run_memory.py                      # the SmolLM2 example, 3 steps
    .venv/bin/python benchmarks/run_memory.py --config examples/quickstart/quickstart.yaml \\
        --set buffer.total_steps=5
    .venv/bin/python benchmarks/run_memory.py --set synchronizer.sync_method=memory

Runs `trinity run` as a subprocess on a private local Ray instance (RAY_ADDRESS=local, so the
driver's tree holds Ray's own processes and every actor) with its run folder in a temporary
directory, and samples the proportional set size of every process of the tree every `--interval`
seconds (/proc/<pid>/smaps_rollup: shared pages are divided among the processes that map them, so
the sum is what the run costs the machine). Each process is labelled by its title (`ray::Explorer`,
`raylet`, the driver `trinity`, ...). Prints, per label, the PSS at the moment of the whole tree's
peak and that label's own peak over the run, and writes the samples' summary to
`benchmarks/results/run_memory.json` (`--out`). A sample is a sample: a spike shorter than the
interval can be missed, so the reported peak is a lower bound on the true one.

The default is the SmolLM2 GRPO example cut to 3 steps (its peak is at the start evaluation and
the first steps: responses only get shorter later); `--set` takes the same dotted overrides as
`trinity run`, in order.
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
sys.path.insert(0, str(ROOT))
from trinity.common.memory import GB, tree_pss_by_process  # noqa: E402

DEFAULT_CONFIG = ROOT / "examples" / "real_model" / "smollm2_grpo.yaml"
DEFAULT_SETS = ["buffer.total_steps=3", "trainer.save_interval=0"]


TRAINER = "ray::TrainerRunner"  # the trainer's process title starts with this


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:  # it ended between the listing and this read
        pass
    return 0


def sample_until_exit(proc: subprocess.Popen, interval: float, timeout: float) -> tuple:
    """Sample `proc`'s tree until it exits: (peak bytes, bytes per label at the peak, each
    label's own peak, the most processes seen per label, seconds from the start to the peak,
    the trainer's RSS minus its PSS at the peak: the shared pages RSS counts whole)."""
    t0 = time.perf_counter()
    peak, at_peak, own_peak, counts, peak_at, shared_at_peak = 0, {}, {}, {}, 0.0, 0
    while proc.poll() is None:
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            raise TimeoutError(f"the run did not finish in {timeout:.0f} s")
        by_label: dict[str, int] = {}
        n: dict[str, int] = {}
        trainer_shared = 0
        for pid, (label, pss) in tree_pss_by_process(proc.pid).items():
            by_label[label] = by_label.get(label, 0) + pss
            n[label] = n.get(label, 0) + 1
            if label.startswith(TRAINER):
                trainer_shared += max(0, _rss_bytes(pid) - pss)
        for label, pss in by_label.items():
            own_peak[label] = max(own_peak.get(label, 0), pss)
            counts[label] = max(counts.get(label, 0), n[label])
        if (total := sum(by_label.values())) > peak:
            peak, at_peak, peak_at = total, by_label, time.perf_counter() - t0
            shared_at_peak = trainer_shared
        time.sleep(interval)
    return peak, at_peak, own_peak, counts, peak_at, shared_at_peak


def trainer_high_water(run_root: Path) -> float | None:
    """The largest per-step `memory/trainer_peak_rss_gb` in the run's metrics.jsonl: the
    kernel's own high-water mark of the trainer's RSS in each step, which no sampler misses."""
    values = [
        rec["memory/trainer_peak_rss_gb"]
        for f in run_root.rglob("metrics.jsonl")
        for line in f.read_text().splitlines()
        if line.strip() and "memory/trainer_peak_rss_gb" in (rec := json.loads(line))
    ]
    return max(values) if values else None


def estimated_peak(
    peak: int, at_peak: dict[str, int], shared: int, high_water: float | None
) -> float | None:
    """The run's peak (GB) with the trainer at its step high-water mark `high_water` (GB RSS):
    its PSS there taken as the mark less the `shared` pages that RSS counted whole at the sampled
    peak (a step's transients are private pages), the other processes as at the sampled peak
    (which falls inside a train step). None without the mark or the trainer."""
    trainer = sum(v for k, v in at_peak.items() if k.startswith(TRAINER))
    if high_water is None or not trainer:
        return None
    return (peak - trainer + max(high_water * GB - shared, trainer)) / GB


def run(config: Path, sets: list[str], interval: float, timeout: float) -> dict:
    """Run `trinity run` once and return its peak PSS, per label at the peak and each label's own
    peak (GB), the number of processes per label, and the wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RAY_ADDRESS": "local", "TRINITY_CHECKPOINT_ROOT": tmp}
        cmd = [str(ROOT / ".venv/bin/trinity"), "run", "--config", str(config)]
        cmd += [a for s in sets for a in ("--set", s)]
        t0 = time.perf_counter()
        with open(Path(tmp) / "run.log", "w+") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            peak, at_peak, own_peak, counts, peak_at, shared = sample_until_exit(
                proc, interval, timeout
            )
            seconds = time.perf_counter() - t0
            log.seek(0)
            if proc.returncode != 0:
                raise RuntimeError(f"trinity run exited {proc.returncode}:\n{log.read()[-4000:]}")
        high_water = trainer_high_water(Path(tmp))
    return {
        "peak_gb": peak / GB,
        "at_peak_gb": {k: v / GB for k, v in sorted(at_peak.items(), key=lambda kv: -kv[1])},
        "own_peak_gb": {k: v / GB for k, v in own_peak.items()},
        "processes": counts,
        "seconds": seconds,
        "peak_at_s": peak_at,
        # the kernel's high-water mark of the trainer's RSS in a step, which no sampler misses
        "trainer_step_peak_rss_gb": high_water,
        "estimated_peak_gb": estimated_peak(peak, at_peak, shared, high_water),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--set", action="append", default=None, dest="sets",
                    help=f"a dotted override (repeatable; default {' '.join(DEFAULT_SETS)})")  # fmt: skip
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between samples")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "run_memory.json")
    args = ap.parse_args()
    sets = DEFAULT_SETS if args.sets is None else args.sets
    r = run(args.config, sets, args.interval, args.timeout)
    print(f"{args.config.name} {' '.join(sets)}: peak PSS {r['peak_gb']:.2f} GB "
          f"(sampled every {args.interval} s) at {r['peak_at_s']:.0f} s of {r['seconds']:.0f} s")  # fmt: skip
    if r["estimated_peak_gb"] is not None:
        print(f"the trainer's step high-water mark: {r['trainer_step_peak_rss_gb']:.2f} GB RSS "
              f"(the kernel's); the run's peak with the trainer there: "
              f"{r['estimated_peak_gb']:.2f} GB PSS")  # fmt: skip
    print(
        "\n| process | count | PSS at the run's peak (GB) | its own peak (GB) |\n|---|---:|---:|---:|"
    )
    for label, gb in r["at_peak_gb"].items():
        print(f"| {label} | {r['processes'][label]} | {gb:.2f} | {r['own_peak_gb'][label]:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": str(args.config), "sets": sets, **r}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
