"""`benchmarks/curriculum.py` end to end at a tiny size: both selectors run from one SFT model,
and the result file has each run's curve and steps to target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_e2e import ROOT


@pytest.mark.long  # an SFT run and two GRPO runs of 2 steps (about 50 s on 2 cores)
@pytest.mark.parametrize("reference", [False, pytest.param(True, marks=pytest.mark.long)])
def test_the_curriculum_benchmark_runs_end_to_end(tmp_path, reference):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "curriculum.py"), "--seeds", "5",
           "--steps", "2", "--eval-interval", "1", "--tasks", "12", "--eval-tasks", "3",
           "--batch-size", "4", "--sft-steps", "2", "--target", "0.0",
           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results")]  # fmt: skip
    cmd += ["--reference"] if reference else []
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = "curriculum_seeds_5_reference" if reference else "curriculum_seeds_5"
    result = json.loads((tmp_path / "results" / f"{name}.json").read_text())
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
    if reference:  # the SFT model's pass rate on each of the 12 training tasks, in [0, 1]
        lines = (tmp_path / "work" / "seed_5" / "reference_tasks.jsonl").read_text().splitlines()
        rates = [json.loads(x)["sft_pass_rate"] for x in lines]
        assert len(rates) == 12 and all(0.0 <= r <= 1.0 for r in rates)
        cfg = yaml.safe_load((tmp_path / "work/seed_5/grpo_difficulty_based.yaml").read_text())
        selector = cfg["stages"][0]["buffer"]["explorer_input"]["taskset"]["data_selector"]
        assert selector["feature_keys"] == ["sft_pass_rate"]


def test_levels_and_weights_shape_the_taskset_and_the_held_out_mean(monkeypatch):
    """`--levels carry three_digit --weights 1 7`: the training set draws those two levels 1 : 7
    (`arithmetic_levels` weights by level index), and only their held-out sets are evaluated and
    averaged."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import curriculum

    args = argparse.Namespace(levels=["carry", "three_digit"], weights=[1, 7], tasks=640,
                              eval_tasks=100, batch_size=16, steps=80, eval_interval=1,
                              bots={})  # fmt: skip
    rl_stage = {"algorithm": {"repeat_times": 8}, "buffer": {}}
    stage = curriculum.grpo_stage(rl_stage, "random", args)
    inputs = stage["buffer"]["explorer_input"]
    assert inputs["taskset"]["generator_args"] == {"num_tasks": 640, "weights": [0, 1, 7]}
    evals = {e["name"]: e["generator_args"]["weights"] for e in inputs["eval_tasksets"]}
    assert evals == {"heldout_carry": [0, 1, 0], "heldout_three_digit": [0, 0, 1]}
    records = [{"step": 3, "eval/heldout_carry/accuracy": 0.8,
                "eval/heldout_three_digit/accuracy": 0.0}]  # fmt: skip
    curve = curriculum.accuracy_by_step(records, args.levels)
    assert curve == {3: [0.8, 0.0]} and curriculum.steps_to_target(curve, 0.4) == 3
    assert curriculum.steps_to_target(curve, 0.41) is None
