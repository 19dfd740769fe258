"""A run folder that already holds a run: a fresh suffixed folder, or a clear refusal to resume."""

from datetime import datetime

from test_e2e import grpo_config, run_trinity
from typer.testing import CliRunner

from trinity.cli import app
from trinity.config import load_config
from trinity.config.run_folder import fresh_name, previous_run, run_folder_problems


def test_fresh_name_is_trinity_rft_s_timestamp_suffix():
    assert fresh_name("add2", datetime(2026, 11, 23, 5, 4, 3)) == "add2_20261123050403"


def test_previous_run_lists_checkpoints_and_buffers(tmp_path):
    run = tmp_path / "run"
    assert previous_run(run) == []
    (run / "tensorboard").mkdir(parents=True)
    assert previous_run(run) == []  # metrics alone are nothing to resume
    (run / "sft" / "global_step_5").mkdir(parents=True)
    (run / "grpo" / "buffer").mkdir(parents=True)
    (run / "grpo" / "buffer" / "exp.db").write_bytes(b"")
    assert previous_run(run) == ["1 checkpoint(s)", "1 experience buffer(s)"]


def test_rerun_gets_a_fresh_folder_and_never_trains_on_leftovers(tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    first = run_trinity(cfg)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    root = tmp_path / "ckpt" / "e2e"
    assert sorted(p.name for p in root.iterdir()) == ["grpo"]
    second = run_trinity(cfg)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 2 and names[0] == "grpo" and names[1].startswith("grpo_"), names
    assert "is in use by an earlier run" in second.stdout
    fresh = root / names[1]
    assert (fresh / "global_step_3").is_dir() and (fresh / "metrics.jsonl").is_file()
    # the first run's folder is as it left it: one metrics record per step, one final checkpoint
    steps = [line for line in (root / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4  # steps 0 (eval on start-up), 1, 2, 3

    # continue_from_checkpoint: true cannot resume yet: refused up front, by both verbs
    problems = run_folder_problems(
        load_config(cfg, ["continue_from_checkpoint=true"]), root / "grpo"
    )
    assert [p.path for p in problems] == ["continue_from_checkpoint"]
    assert "1 checkpoint(s), 1 experience buffer(s)" in problems[0].message
    for verb in ("validate", "run"):
        r = CliRunner().invoke(
            app, [verb, "--config", str(cfg), "--set", "continue_from_checkpoint=true"]
        )
        assert r.exit_code == 2, r.output
        assert "resuming it is not built yet" in " ".join(r.output.split())
    assert len(list(root.iterdir())) == 2  # nothing started
