"""Mode bench: a run's saved checkpoints evaluated one by one, without touching the run's metrics."""

import json
import os

import pytest
from conftest import copy_run
from test_e2e import grpo_config, run_trinity

from trinity.launcher.bench import find_checkpoints


def _records(path):
    return {json.loads(x)["step"]: json.loads(x) for x in path.read_text().splitlines()}


def test_checkpoints_of_a_staged_run_are_numbered_run_wide(tmp_path):
    run = tmp_path / "run"
    # stage "sft" ran first (steps 1..100), then "grpo" (steps 1..30): names sort the other way
    for stage, steps, t in (("sft", (50, 100), 1000), ("grpo", (10, 30), 2000)):
        for s in steps:
            d = run / stage / f"global_step_{s}"
            d.mkdir(parents=True)
            os.utime(d, (t + s, t + s))
    (run / "sft" / "buffer").mkdir()  # other folders are not checkpoints
    (run / "grpo" / "global_step_x").mkdir()
    points = find_checkpoints(run)
    assert [(p.label, p.step) for p in points] == [
        ("sft/global_step_50", 50),
        ("sft/global_step_100", 100),
        ("grpo/global_step_10", 110),  # grpo's step 10 follows sft's last step, 100
        ("grpo/global_step_30", 130),
    ]
    assert find_checkpoints(tmp_path / "missing") == []


@pytest.mark.long  # ~40 s of bench runs on 2 cores: keeps `make test` under its 10 minutes
def test_bench_evaluates_every_checkpoint_as_the_training_run_did(
    tmp_path, tiny_model_dir, grpo_run
):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    copy_run(grpo_run, tmp_path)  # the run of `cfg` with trainer.save_interval=1
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    trained = (run_dir / "metrics.jsonl").read_text()

    r = run_trinity(cfg, overrides=["mode=bench"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bench = json.loads((run_dir / "bench.json").read_text())
    rows = bench["rows"]
    assert [(row["checkpoint"], row["step"]) for row in rows] == [
        (f"{tiny_model_dir} (model.model_path)", 0),  # explorer.eval_on_startup (default true)
        ("global_step_1", 1),
        ("global_step_2", 2),
        ("global_step_3", 3),
    ]
    assert "global_step_3" in r.stdout and "bench.json" in r.stdout  # the printed table
    assert "bench: 4/4 evaluated" in r.stdout and "ETA 0 s" in r.stdout  # progress lines
    # the best checkpoint: the highest accuracy, ties to the earliest step (the rule, printed)
    acc = [row["eval/add_eval/accuracy"] for row in rows]
    top = rows[acc.index(max(acc))]
    assert bench["best"]["add_eval"]["checkpoint"] == top["checkpoint"]
    assert f"best checkpoint for add_eval: {top['checkpoint']} (step {top['step']})" in r.stdout
    assert "ties: earliest step" in r.stdout
    # one sample record per task per checkpoint (greedy: n = 1), correct as the reward says
    samples = [json.loads(x) for x in (run_dir / "bench.samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 8 and {s["step"] for s in samples} == {0, 1, 2, 3}
    assert all(s["correct"] == (s["reward"] == 1.0) and s["prompt"] for s in samples)
    for row in rows:  # accuracy is the share of correct samples of the checkpoint
        mine = [s["correct"] for s in samples if s["step"] == row["step"]]
        assert row["eval/add_eval/accuracy"] == sum(mine) / 8
    assert (run_dir / "metrics.jsonl").read_text() == trained  # the run's metrics untouched
    # greedy evaluation is deterministic: the base model and the final weights score exactly as
    # the training run's start and final evaluations did
    train, bench = _records(run_dir / "metrics.jsonl"), _records(run_dir / "metrics.bench.jsonl")
    assert sorted(bench) == [0, 1, 2, 3]
    for step in (0, 3):
        for key in ("eval/add_eval/accuracy", "eval/add_eval/response_length"):
            assert bench[step][key] == train[step][key], (step, key)
    # each checkpoint was loaded into the engines (as the version of its step) and evaluated,
    # not the start model four times
    assert [bench[s]["eval/model_version"] for s in (0, 1, 2, 3)] == [0, 1, 2, 3]

    r = run_trinity(
        cfg,
        overrides=[
            "mode=bench",
            "explorer.bench_on_latest_checkpoint=true",
            "explorer.eval_on_startup=false",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((run_dir / "bench.json").read_text())["rows"]
    assert [(row["checkpoint"], row["step"]) for row in rows] == [("global_step_3", 3)]
    # no base model evaluated: the summary has no "at start" line, and the checkpoint's after
    summary = json.loads((run_dir / "summary.bench.json").read_text())["stages"][0]
    kept = (
        "accuracy",
        "avg@1_ci_low",
        "avg@1_ci_high",
        "pass@1",
        "pass@1_ci_low",
        "pass@1_ci_high",
    )
    assert summary["eval_start"] == {} and summary["eval_end"] == {
        f"eval/add_eval/{k}": rows[0][f"eval/add_eval/{k}"] for k in kept
    }
    assert "eval at start" not in r.stdout

    r = run_trinity(
        cfg,
        overrides=[
            "mode=bench",
            "explorer.bench_checkpoints=every:2",
            "explorer.eval_on_startup=false",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((run_dir / "bench.json").read_text())["rows"]
    # multiples of 2, and the latest
    assert [(row["checkpoint"], row["step"]) for row in rows] == [
        ("global_step_2", 2),
        ("global_step_3", 3),
    ]
