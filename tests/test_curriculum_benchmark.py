"""`benchmarks/curriculum.py` end to end at a tiny size: both selectors run from one SFT model,
and the result file has each run's curve and steps to target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_e2e import ROOT


@pytest.mark.slow  # an SFT run and two GRPO runs of 2 steps (about 90 s on 2 cores)
def test_the_curriculum_benchmark_runs_end_to_end(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "curriculum.py"), "--seeds", "5",
           "--steps", "2", "--eval-interval", "1", "--tasks", "12", "--eval-tasks", "3",
           "--batch-size", "4", "--sft-steps", "2", "--target", "0.0",
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results")]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "results" / "curriculum_seeds_5.json").read_text())
    runs = {run["selector"]: run for run in result["runs"]}
    assert sorted(runs) == ["difficulty_based", "random"]
    for run in runs.values():
        assert sorted(run["curve"], key=int) == ["0", "1", "2"]  # at the start, every step
        assert all(len(v) == 3 for v in run["curve"].values())  # the three levels
        assert run["steps_to_target"] == 0  # target 0: met by the first evaluation
        assert all(
            0.0 <= run[k] <= 1.0 for k in ("valid_ratio_mean", "all_passed_mean", "all_failed_mean")
        )
    assert result["stats"]["random"]["steps_to_target"] == {"mean": 0.0, "std": 0.0, "n": 1}
    assert result["stats"]["ratio_difficulty_based_over_random"] is None  # 0 / 0
