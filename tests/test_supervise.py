"""`launcher.supervise`: the forked run's exit code comes back, and a run killed by a signal is
reported by the parent from the record it kept."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

from rich.console import Console

from trinity.launcher.summary import Progress, StopRecord
from trinity.launcher.supervise import supervise
from trinity.trainer.checkpoint import MANIFEST, TRAINER_STATE


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, highlight=False), out


def test_the_child_s_exit_code_comes_back():
    console, out = _console()
    assert supervise(lambda record: 0, console) == 0
    assert supervise(lambda record: 130, console) == 130
    assert out.getvalue() == ""


def test_a_killed_run_is_reported_from_its_record(tmp_path: Path):
    stage_dir = tmp_path / "run"
    ckpt = stage_dir / "global_step_4"
    ckpt.mkdir(parents=True)
    (ckpt / TRAINER_STATE).write_bytes(b"xyz")
    (ckpt / MANIFEST).write_text(json.dumps({"files": {TRAINER_STATE: 3}}))

    def killed(record: Path) -> int:
        progress = Progress("main", offset=0, total=10, stage_dir=stage_dir)
        StopRecord(progress, {"trainer": 5, "explorer": 6}, "both", False, None).write(record)
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
        return 0

    console, out = _console()
    assert supervise(killed, console) == 1
    lines = out.getvalue().splitlines()
    assert lines == [
        "stopped in stage main at train step 5 of 10",
        f"the last checkpoint is step 4 ({ckpt})",
        "run the same command with --set continue_from_checkpoint=true to continue",
        "the run's one process ended by SIGKILL (an out-of-memory kill?); with "
        "cluster.one_process: false each part has its own process, and Ray restarts a crashed "
        "engine's",
    ]


def test_a_run_killed_before_its_first_record_says_there_is_nothing_to_continue():
    console, out = _console()
    # SIGKILL: a catchable signal may meet a handler the test process installed before
    assert supervise(lambda record: os.kill(os.getpid(), signal.SIGKILL) or 0, console) == 1
    assert out.getvalue().startswith("stopped before its first stage began")
    assert "ended by SIGKILL" in out.getvalue()


def test_a_record_round_trips(tmp_path: Path):
    record = StopRecord(Progress("rl", 3, None, tmp_path), {"explorer": 4}, "explore", True, "x_1")
    record.write(tmp_path / "stop.json")
    assert StopRecord.read(tmp_path / "stop.json") == record
    assert StopRecord.read(tmp_path / "missing.json") is None


def test_the_forked_run_s_start_up_timeline_counts_from_the_command_s_start():
    from trinity.common.startup import process_started_at

    here = process_started_at()

    def child(record: Path) -> int:  # its own start is now; the command began at the parent's
        return 0 if abs(process_started_at() - here) < 0.05 else 3

    assert supervise(child, _console()[0]) == 0


def test_an_error_that_escapes_the_run_is_printed_and_exits_1(capfd):
    def broken(record: Path) -> int:
        raise RuntimeError("a bug outside the run's own handling")

    assert supervise(broken, _console()[0]) == 1
    assert "RuntimeError: a bug outside the run's own handling" in capfd.readouterr().err
