"""A run without Ray, watched by a parent process that can still speak when the run is killed.

    code = supervise(lambda record: run_and_exit_code(cfg, plan, record), console)

A one-process run without Ray (`common.local_host`) is the whole run in one process: an
out-of-memory kill, a segfault in a native kernel or a `kill -9` ends it before it can say where
it stood. With Ray, the driver outlived a crashed worker and said so. Here the `trinity run`
process forks before the run starts: the child runs it, keeping its `StopRecord` in a file as it
goes (after each report and each stage's start); the parent waits. When the child ends by a
signal, the parent prints what the child would have said (where it stood, its newest
checkpoint, the command that continues it) and why it ended, and exits 1.

Forked, not started afresh: the child has the parent's imports and loaded config already (no
second start-up), and the pages they share count once. Signals: a terminal's Ctrl-C reaches both
processes (one process group); the parent passes SIGINT, SIGTERM and SIGHUP on to the child, so a
signal sent to the parent alone stops the run as well; the child takes a repeat of a stop within
a second as the same stop (`ray_init.stops_as_interrupts`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from trinity.common.startup import count_from_parent
from trinity.launcher.summary import StopRecord

PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def supervise(run: Callable[[Path], int], console: Console) -> int:
    """Run `run(record)` in a forked child and return its exit code; a child killed by a
    signal is reported from its record (module doc) and returns 1."""
    with tempfile.TemporaryDirectory(prefix="trinity-stop-") as folder:
        record = Path(folder) / "stop.json"  # the child writes it once it has something to say
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the run, then out without Python's exit (module doc)
            _child(run, record)

        def pass_on(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: waitpid has it
                os.kill(pid, signum)

        before = {sig: signal.signal(sig, pass_on) for sig in PASSED_ON}
        try:
            _, status = os.waitpid(pid, 0)
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
        if os.WIFSIGNALED(status):
            _say_killed(StopRecord.read(record), os.WTERMSIG(status), console)
            return 1
        return os.waitstatus_to_exitcode(status)


def _child(run: Callable[[Path], int], record: Path) -> NoReturn:
    """The forked process: the run, its exit code, and out with `os._exit` (threads of a
    stopped run may still run). What escapes `run` is printed, never lost with the process."""
    code = 1
    try:
        count_from_parent()  # its start-up timeline counts from the command's start
        code = run(record)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _say_killed(record: StopRecord | None, signum: int, console: Console) -> None:
    name = signal.Signals(signum).name
    why = " (an out-of-memory kill?)" if signum == signal.SIGKILL else ""
    lines = (
        record.lines()
        if record is not None
        else ["stopped before its first stage began: nothing to continue; run it again"]
    )
    lines.append(
        f"the run's one process ended by {name}{why}; with cluster.one_process: false each "
        "part has its own process, and Ray restarts a crashed engine's"
    )
    for line in lines:
        console.print(f"[yellow]{line}[/]", soft_wrap=True)
