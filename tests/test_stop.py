"""A run that stops before its end (Ctrl-C, SIGTERM, a crash) says where it stood, its newest
checkpoint, and the command that continues it; that command continues it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_e2e import ROOT, buffer_counts, grpo_config, run_trinity

from trinity.launcher.summary import Progress, stop_lines
from trinity.trainer.checkpoint import MANIFEST, TRAINER_STATE


def _sealed(folder: Path) -> Path:
    """A checkpoint folder `is_complete` accepts: a trainer state named by its manifest."""
    folder.mkdir(parents=True)
    (folder / TRAINER_STATE).write_bytes(b"x" * 3)
    (folder / MANIFEST).write_text(json.dumps({"files": {TRAINER_STATE: 3}}))
    return folder


def test_a_stopped_training_run_names_its_step_its_checkpoint_and_the_command(tmp_path):
    stage_dir = tmp_path / "grpo"
    _sealed(stage_dir / "global_step_1220")
    progress = Progress("grpo", offset=1200, total=300, stage_dir=stage_dir)
    lines = stop_lines(progress, {"explorer": 1231, "trainer": 1230}, "both", False, None)
    assert lines == [
        "stopped in stage grpo at train step 1230 of 1500",  # 1200 + 300, run-wide
        f"the last checkpoint is step 1220 ({stage_dir / 'global_step_1220'})",
        "run the same command with --set continue_from_checkpoint=true to continue",
    ]
    # already continuing; a run the launcher named afresh must be named to be found again
    again = stop_lines(progress, {"trainer": 1230}, "both", True, "add2_20261128")
    assert again[-1] == "run the same command with --set name=add2_20261128 to continue"


def test_a_stop_before_any_checkpoint_or_step_says_the_stage_starts_again(tmp_path):
    progress = Progress("main", offset=0, total=5, stage_dir=tmp_path)
    assert stop_lines(progress, {}, "both", False, None)[:2] == [
        "stopped in stage main before its first step",
        "no checkpoint of stage main yet: the stage starts again from its beginning",
    ]
    assert stop_lines(None, {}, "both", False, None) == [
        "stopped before its first stage began: nothing to continue; run it again"
    ]


def test_explorers_continue_after_their_cursor_and_bench_starts_over(tmp_path):
    progress = Progress("main", offset=0, total=None, stage_dir=tmp_path)
    explore = stop_lines(progress, {"explorer": 7}, "explore", False, None)
    assert explore[0] == "stopped in stage main at explore step 7"
    assert (
        "run the same command to continue (the explorer continues after its cursor" in (explore[1])
    )
    assert "run the same command again" in stop_lines(progress, {}, "bench", False, None)[1]


SETS = ["buffer.total_steps=10", "trainer.save_interval=2", "explorer.eval_interval=0"]


def _started_past_a_checkpoint(
    tmp_path: Path, model_dir: Path, more: list[str] = ()
) -> tuple[Path, subprocess.Popen]:
    """test_e2e's GRPO run of 10 steps (a checkpoint every 2) as a subprocess, returned once its
    checkpoint of step 2 exists: mid-stage, with something to continue from. `more`: `--set`s."""
    cfg = grpo_config(tmp_path, model_dir)
    args = [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg)]
    args += [a for s in [*SETS, *more] for a in ("--set", s)]
    env = {**os.environ, "TRINITY_CACHE_DIR": str(tmp_path / "cache")}
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while not list(run_dir.glob("global_step_2")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    return cfg, proc


@pytest.mark.slow  # two runs: one interrupted at its fourth step, then its continuation
@pytest.mark.parametrize(
    ("sig", "group"),
    [
        (signal.SIGINT, False),
        pytest.param(signal.SIGTERM, False, marks=pytest.mark.long),
        pytest.param(signal.SIGINT, True, marks=pytest.mark.long),
    ],
    ids=["SIGINT", "SIGTERM", "Ctrl-C"],
)  # fmt: skip
def test_an_interrupted_run_prints_the_command_that_continues_it(
    tmp_path, tiny_model_dir, sig, group
):
    """The signal reaches the run mid-stage (train steps 3+ of 10, a checkpoint every 2), sent
    to the `trinity run` process or, as a terminal's Ctrl-C, to its whole process group (the
    run's process then gets it twice: from the terminal and from its parent): the run ends with
    exit 130 and the resume line; that line, run as printed, finishes the run with every
    experience trained exactly once."""
    cfg, proc = _started_past_a_checkpoint(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    flat = " ".join(out.split())
    stopped = re.search(r"stopped in stage main at train step (\d+) of 10", flat)
    assert stopped, out[-3000:]
    assert 2 <= int(stopped.group(1)) < 10
    ckpt = re.search(r"the last checkpoint is step (\d+)", flat)
    assert ckpt and int(ckpt.group(1)) % 2 == 0 and int(ckpt.group(1)) >= 2
    command = re.search(r"run the same command with ((?:--set \S+ ?)+)to continue", flat)
    assert command, out[-3000:]
    more = command.group(1).split()[1::2]
    assert more == ["continue_from_checkpoint=true"]

    resumed = run_trinity(cfg, overrides=[*SETS, *more])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"global_step_{ckpt.group(1)}" in " ".join(resumed.stdout.split())
    assert (run_dir / "global_step_10").is_dir()
    counts = buffer_counts(cfg)
    assert counts["trained_twice"] == 0 and counts["pending"] == 0


@pytest.mark.slow  # two runs: one whose one process is killed, then its continuation
@pytest.mark.parametrize(
    "on_ray", [False, pytest.param(True, marks=pytest.mark.long)], ids=["without_ray", "on_ray"]
)
def test_a_crash_of_the_one_process_ends_the_run_with_the_command_that_continues_it(
    tmp_path, tiny_model_dir, on_ray
):
    """With no layout key set, explorer, engine and trainer are one process: SIGKILLed (as an
    out-of-memory kill would), it ends the run with exit 1, a word on why and the resume line,
    which finishes the run. Without Ray that process is the run itself, forked from the
    `trinity run` process, which says it (`launcher.supervise`); on Ray it is the ServiceHost
    actor, and the driver says it."""
    from test_e2e import descendants

    more = ["cluster.ray_address=local"] if on_ray else []
    cfg, proc = _started_past_a_checkpoint(tmp_path, tiny_model_dir, more)
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    below = descendants(proc.pid)
    what = "ServiceHost" if on_ray else "trinity.cli run"
    victims = [pid for pid, a in below.items() if what in a]
    assert len(victims) == 1, below
    if not on_ray:
        assert not any("raylet" in a for a in below.values()), below  # no Ray instance at all
    os.kill(victims[0], signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, out[-3000:]
    flat = " ".join(out.split())
    assert "the run's one process ended" in flat and "cluster.one_process: false" in flat
    stopped = re.search(r"stopped in stage main at train step (\d+) of 10", flat)
    assert stopped and int(stopped.group(1)) >= 2, out[-3000:]
    ckpt = re.search(r"the last checkpoint is step (\d+)", flat)
    assert ckpt and int(ckpt.group(1)) >= 2, out[-3000:]
    command = re.search(r"run the same command with ((?:--set \S+ ?)+)to continue", flat)
    assert command, out[-3000:]
    resumed = run_trinity(cfg, overrides=[*SETS, *more, *command.group(1).split()[1::2]])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert (run_dir / "global_step_10").is_dir()
    assert buffer_counts(cfg)["trained_twice"] == 0
