"""Mode bench without a run: which checkpoints it picks, the best-checkpoint rule, the table."""

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from trinity.config.checks import check_config
from trinity.config.schema import TrinityConfig
from trinity.launcher.bench import (
    BenchPoint,
    bench_points,
    best_checkpoints,
    progress_line,
    select,
    write_table,
)

FOUND = [BenchPoint(f"global_step_{s}", f"/r/global_step_{s}", s) for s in (10, 20, 30, 40, 50)]


def _cfg(choice="all", latest=False, startup=False):
    explorer = SimpleNamespace(
        bench_checkpoints=choice, bench_on_latest_checkpoint=latest, eval_on_startup=startup
    )
    model = SimpleNamespace(external_model=SimpleNamespace(enable=False))
    return SimpleNamespace(explorer=explorer, model=model)


def test_select_all_latest_every_and_a_list():
    steps = lambda ps: [p.step for p in ps]  # noqa: E731
    assert steps(select(FOUND, "all")) == [10, 20, 30, 40, 50]
    assert steps(select(FOUND, "latest")) == [50]
    assert steps(select(FOUND, "every:20")) == [20, 40, 50]  # multiples of 20, and the latest
    assert steps(select(FOUND, "every:25")) == [50]
    assert steps(select(FOUND, [20, 50])) == [20, 50]
    with pytest.raises(ValueError, match=r"steps \[35\] that have no checkpoint"):
        select(FOUND, [35, 50])


def test_bench_points_add_the_base_model(tmp_path):
    for s in (1, 2, 3):
        (tmp_path / f"global_step_{s}").mkdir()
    points, line = bench_points(_cfg("every:2", startup=True), tmp_path, "base")
    assert [p.step for p in points] == [0, 2, 3] and "every:2" in line
    points, _ = bench_points(_cfg([0, 1]), tmp_path, "base")  # step 0 names the base model
    assert [(p.label, p.step) for p in points] == [
        ("base (model.model_path)", 0),
        ("global_step_1", 1),
    ]
    points, _ = bench_points(_cfg("all", latest=True), tmp_path, "base")
    assert [p.step for p in points] == [3]


def test_the_config_key_is_checked():
    with pytest.raises(ValidationError, match="every:N"):
        TrinityConfig.model_validate({"explorer": {"bench_checkpoints": "every:0"}})
    both = {"bench_checkpoints": "every:2", "bench_on_latest_checkpoint": True}
    problems = check_config(TrinityConfig.model_validate({"explorer": both}))
    assert any(
        p.path == "explorer.bench_checkpoints" and "bench_on_latest_checkpoint is true" in str(p)
        for p in problems
    )
    steps = TrinityConfig.model_validate({"explorer": {"bench_checkpoints": [0, 50]}})
    assert steps.explorer.bench_checkpoints == [0, 50]


def test_best_checkpoint_rule_and_table(tmp_path):
    rows = [
        {"checkpoint": "base", "step": 0, "eval/a/accuracy": 0.2, "eval/a/avg@4": 0.2,
         "eval/a/avg@4_ci_low": 0.1, "eval/a/avg@4_ci_high": 0.3, "eval/a/pass@4": 0.5},
        {"checkpoint": "global_step_1", "step": 1, "eval/a/accuracy": 0.7, "eval/a/avg@4": 0.7,
         "eval/a/avg@4_ci_low": 0.6, "eval/a/avg@4_ci_high": 0.8, "eval/a/pass@4": 0.9},
        {"checkpoint": "global_step_2", "step": 2, "eval/a/accuracy": 0.7, "eval/a/avg@4": 0.7,
         "eval/a/avg@4_ci_low": 0.6, "eval/a/avg@4_ci_high": 0.8, "eval/a/pass@4": 0.95},
    ]  # fmt: skip
    best = best_checkpoints(rows)
    assert best["a"]["checkpoint"] == "global_step_1"  # a tie at 0.7: the earlier step
    assert best["a"]["ci"] == [0.6, 0.8] and "ties: earliest step" in best["a"]["rule"]
    path, table = write_table(tmp_path, rows)
    assert json.loads(path.read_text())["best"] == best
    assert json.loads(path.read_text())["rows"] == rows
    assert table.splitlines()[0].split() == [
        "checkpoint",
        "step",
        "eval/a/accuracy",
        "eval/a/pass@4",
    ]
    assert table.splitlines()[-1] == (
        "best checkpoint for a: global_step_1 (step 1), accuracy 0.700 [0.600, 0.800] "
        "(95% interval); rule: highest eval/a/accuracy (avg@n, failed samples as wrong); "
        "ties: earliest step"
    )
    assert progress_line(2, 5, 60.0) == "bench: 2/5 evaluated, 30.0 s each, ETA 90 s"


def test_a_stages_summary_keeps_accuracy_pass_at_k_and_their_intervals():
    from trinity.launcher.reports import accuracies
    from trinity.launcher.summary import eval_lines

    metrics = {
        "eval/s/accuracy": 0.5, "eval/s/avg@4": 0.5, "eval/s/avg@4_ci_low": 0.4,
        "eval/s/avg@4_ci_high": 0.6, "eval/s/pass@1": 0.5, "eval/s/pass@1_ci_low": 0.4,
        "eval/s/pass@1_ci_high": 0.6, "eval/s/pass@2": 0.7, "eval/s/pass@2_ci_low": 0.61,
        "eval/s/pass@2_ci_high": 0.79, "eval/s/maj@4": 0.55, "eval/s/failed": 0.0,
        "eval/s/response_length": 3.0, "eval/g/accuracy": 1.0, "timing/eval": 2.0,
    }  # fmt: skip
    kept = accuracies(metrics)
    assert set(kept) == {
        "eval/s/accuracy", "eval/s/avg@4_ci_low", "eval/s/avg@4_ci_high", "eval/s/pass@1",
        "eval/s/pass@1_ci_low", "eval/s/pass@1_ci_high", "eval/s/pass@2", "eval/s/pass@2_ci_low",
        "eval/s/pass@2_ci_high", "eval/g/accuracy",
    }  # fmt: skip
    assert eval_lines(kept) == [  # by set, accuracy first
        ("eval/g/accuracy", "1.000"),
        ("eval/s/accuracy", "0.500 [0.400, 0.600]"),
        ("eval/s/pass@2", "0.700 [0.610, 0.790]"),
    ]
