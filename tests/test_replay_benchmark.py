"""`benchmarks/replay.py` end to end at a tiny size: the plain and replay runs from one SFT
model, the replay run training copies, and the result file with each run's curve."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_e2e import ROOT


def replay_benchmark(tmp_path, seed: int, *args: str, timeout: int = 900) -> tuple[dict, dict]:
    """`benchmarks/replay.py --seeds seed *args` in tmp_path: (its result file, runs by buffer)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "replay.py"), "--seeds", str(seed), *args,
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results")]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "results" / f"replay_seeds_{seed}.json").read_text())
    return result, {run["buffer"]: run for run in result["runs"]}


@pytest.mark.long  # an SFT run and two GRPO runs of 2 explore steps (about 60 s on 2 cores)
def test_the_replay_benchmark_runs_end_to_end(tmp_path):
    result, runs = replay_benchmark(
        tmp_path, 5, "--steps", "2", "--eval-interval", "1", "--sft-steps", "2",
        "--target", "0.0", "--delay", "1.0",
    )  # fmt: skip
    assert sorted(runs) == ["plain", "replay"]
    for run in runs.values():
        assert sorted(run["curve"], key=int) == ["0", "1", "2"]  # at the start, every step
        assert run["steps_to_target"] == 0 and run["explore_steps"] == 2
    plain, replay = runs["plain"], runs["replay"]
    assert plain["train_steps"] == 2 and plain["copies_trained"] == 0
    # each of the 2 explore steps' groups trained at most twice: copies while the explorer waits
    assert 2 < replay["train_steps"] <= 4 and replay["copies_trained"] > 0
    assert result["stats"]["ratio_replay_over_plain"] is None  # 0 / 0


@pytest.mark.long  # the quickstart SFT stage and two 30-step GRPO runs (17 min at 100 GFLOP/s)
def test_replay_reaches_the_quickstart_target_in_fewer_explore_steps(tmp_path):
    """The learning gain, at the benchmark's full size, on its seed 1 (the widest margin of the
    three published in docs/benchmarks.md: 8 explore steps against 16; the claim over seeds
    lives in the benchmark). Reuse hangs on the explorer being slower than the trainer, which
    its 2 s rollouts make sure of on a busy machine too (copies are counted, and asserted)."""
    _, runs = replay_benchmark(tmp_path, 1, "--steps", "30", timeout=1700)
    plain, replay = runs["plain"], runs["replay"]
    assert replay["copies_trained"] >= 0.5 * 30 * 256, replay  # most groups were trained twice
    assert replay["steps_to_target"] is not None, replay
    assert plain["steps_to_target"] is None or replay["steps_to_target"] < plain["steps_to_target"]
