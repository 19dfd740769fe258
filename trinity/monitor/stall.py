"""The stall doctor: when no part of a run has progressed for `monitor.stall_timeout`, say which
part waits on which, name the one that holds the others up, and dump every process's stacks.

    doctor = StallDoctor(run_dir, timeout=None, on_stall="warn", print_fn=console.print)
    doctor.check()        # from the driver's wait loop: None, or the report it printed

It reads the snapshots every process of the run writes (`common.heartbeat`): each service's
progress counter, when it last progressed, and the waits it has open. A *stall* is no progress
anywhere (no service's counter moved) for the timeout. The diagnosis follows the waits: from the
oldest open wait, to the part it waits on, to that part's own oldest wait, and so on. It ends

- at something that is not a service of the run (an engine, a reward function, a weight load):
  that is what stopped answering, with how long it has been waited on;
- or at a service that waits on nothing: it is stuck in its own code (its stack shows where),
  e.g. a trainer that stopped reading the buffer its explorer fills.

Stacks: this process's threads with `faulthandler`; the run's other processes on this host by
`py-spy dump` when py-spy is installed, else by the signal their beacon registered
(`heartbeat.STACK_SIGNAL`), which appends to `stacks-<host>-<pid>.txt` in the heartbeat folder.

`timeout=None` is automatic: 10 minutes, or 10 times the slowest step seen so far when that is
longer (a step is a move of the `explorer`'s or the `trainer`'s counter of steps). `on_stall`:
`warn` prints the report and keeps waiting (and reports again after another timeout without
progress); `fail` raises `RunStalled`, which fails the run with exit 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity.common import heartbeat

AUTO_MIN_S = 600.0  # the automatic timeout's floor
AUTO_STEPS = 10.0  # ... and its multiple of the slowest step seen
STALE_S = 10 * heartbeat.BEAT_S  # a snapshot older than this: its process stopped beating
STACK_LINES = 200  # per process, printed (the files hold all)


class RunStalled(RuntimeError):
    """No part of the run progressed for `monitor.stall_timeout` (`monitor.on_stall: fail`)."""


@dataclass
class _Wait:
    service: str
    on: str
    detail: str
    since: float


class StallDoctor:
    def __init__(
        self,
        run_dir: str | Path,
        timeout: float | None = None,
        on_stall: str = "warn",
        print_fn: Callable[[str], None] = print,
        now: Callable[[], float] = time.time,
    ) -> None:
        """`timeout`: seconds without progress that make a stall (None: automatic, module doc;
        0: never). `now`: the clock (tests)."""
        self.folder = Path(run_dir) / "heartbeat"
        self.timeout, self.on_stall = timeout, on_stall
        self.print, self.now = print_fn, now
        self.started = now()
        self._last_total: int | None = None
        self._progress_at = self.started  # the newest progress seen anywhere
        self._steps: dict[str, tuple[int, float]] = {}  # service: (its step count, seen at)
        self.slowest_step = 0.0
        self._reported_at: float | None = None  # the stall already reported, if any

    def limit(self) -> float:
        """The timeout in force (automatic: module doc)."""
        if self.timeout is not None:
            return self.timeout
        return max(AUTO_MIN_S, AUTO_STEPS * self.slowest_step)

    def snapshots(self) -> list[dict[str, Any]]:
        """The run's processes' snapshots written since this doctor started."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):  # replaced or torn as we read: next time
                snap = json.loads(path.read_text())
                if snap["time"] >= self.started - STALE_S:
                    out.append(snap)
        return out

    def check(self) -> str | None:
        """Look once; report a stall (and raise `RunStalled` with `on_stall: fail`). Returns the
        report printed, or None."""
        if self.timeout == 0:
            return None
        now, snaps = self.now(), self.snapshots()
        self._observe(snaps, now)
        idle = now - self._progress_at
        if idle < self.limit():
            self._reported_at = None
            return None
        if self._reported_at is not None and now - self._reported_at < self.limit():
            return None  # reported already; again after another timeout without progress
        self._reported_at = now
        report = self.diagnose(snaps, now, idle)
        self.print(report)
        if self.on_stall == "fail":
            raise RunStalled(report.splitlines()[0] + " (monitor.on_stall: fail)")
        return report

    def _observe(self, snaps: list[dict[str, Any]], now: float) -> None:
        total = 0
        for snap in snaps:
            for name, s in snap["services"].items():
                total += s["progress"]
                if name.split(" ")[0] in ("explorer", "trainer") and "steps" in s:
                    count, seen = self._steps.get(name, (s["steps"], now))
                    if s["steps"] != count:
                        self.slowest_step = max(self.slowest_step, now - seen)
                        seen = now
                    self._steps[name] = (s["steps"], seen)
        if total != self._last_total:  # a counter moved (or a process came or went)
            self._last_total = total
            self._progress_at = now

    def diagnose(self, snaps: list[dict[str, Any]], now: float, idle: float) -> str:
        """The report: the headline, every service's state, the chain of waits and its end
        (module doc), and the stacks."""
        lines = [
            f"stall: no part of the run has progressed for {idle:.0f} s "
            f"(monitor.stall_timeout: {self.limit():.0f} s)"
        ]
        waits: list[_Wait] = []
        services: dict[str, dict[str, Any]] = {}
        for snap in snaps:
            age = now - snap["time"]
            for name, s in snap["services"].items():
                if name in services and services[name]["progressed_at"] > s["progressed_at"]:
                    s = {**s, "progressed_at": services[name]["progressed_at"]}  # its ranks
                services[name] = s
                state = f"{s['progress']} progress marks, last {now - s['progressed_at']:.0f} s ago"
                open_waits = [_Wait(name, *w) for w in s["waits"]]
                waits += open_waits
                if open_waits:
                    w = open_waits[0]
                    more = f" (+{len(open_waits) - 1} more)" if len(open_waits) > 1 else ""
                    state += f"; waiting {now - w.since:.0f} s on {w.on}: {w.detail}{more}"
                if age > STALE_S:
                    state += f"; its process {snap['pid']} stopped beating {age:.0f} s ago"
                lines.append(f"  {name}: {state}")
        lines += ["  " + line for line in _chain(waits, services, now)]
        lines += self._stacks(snaps)
        return "\n".join(lines)

    def _stacks(self, snaps: list[dict[str, Any]]) -> list[str]:
        """Dump every process's stacks (module doc); the lines to print."""
        lines = ["stacks:"]
        for snap in snaps:
            key = heartbeat.process_key(snap["host"], snap["pid"])
            path = self.folder / f"stacks-{key}.txt"
            if snap["host"] != socket.gethostname():
                lines.append(f"  process {key}: on another node; its stacks: {path} there")
                continue
            shown = _with_frames(_dump(snap["pid"], path))[:STACK_LINES] or ["(no stacks written)"]
            lines.append(f"  process {key} (all in {path}):")
            lines += ["    " + line for line in shown]
        return lines


def _dump(pid: int, path: Path) -> str:
    """Append process `pid`'s stacks to `path` (module doc); returns what was appended."""
    start = path.stat().st_size if path.exists() else 0
    spy = shutil.which("py-spy")
    if pid == os.getpid():
        with path.open("a", encoding="utf-8") as f:
            heartbeat.dump_own_stacks(f)
    elif spy is not None:
        got = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
        with path.open("a", encoding="utf-8") as f:
            f.write(got.stdout or got.stderr)
    else:  # its beacon's handler appends to the file
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, heartbeat.STACK_SIGNAL)
        time.sleep(0.5)
    return path.read_bytes()[start:].decode("utf-8", "replace") if path.exists() else ""


def _with_frames(text: str) -> list[str]:
    """The lines of a stack dump without the threads that show no Python frame (idle native
    threads of a Ray worker, a pool's parked threads: a header and nothing under it)."""
    blocks = [b.strip().splitlines() for b in text.split("\n\n")]
    return [line for b in blocks if len(b) > 1 for line in [*b, ""]]


def _chain(waits: list[_Wait], services: dict[str, Any], now: float) -> list[str]:
    """Follow the waits from the oldest one (module doc): the lines of the chain, then the
    cause."""
    if not waits:
        return [
            "cause: no part of the run waits on another: each is stuck in its own code "
            "(see the stacks)"
        ]
    by_service: dict[str, list[_Wait]] = {}
    for w in sorted(waits, key=lambda w: w.since):
        by_service.setdefault(w.service, []).append(w)
    w = min(waits, key=lambda w: w.since)
    lines, seen = [], {w.service}
    while True:
        waited = now - w.since
        lines.append(f"{w.service} waits on {w.on} ({w.detail}) for {waited:.0f} s")
        targets = [name for name in services if _kind(name) == _kind(w.on)]
        if not targets:  # not a service of the run: what stopped answering
            return [*lines, f"cause: {w.on} has not answered for {waited:.0f} s ({w.detail})"]
        waiting = [t for t in targets if t in by_service and t not in seen]
        if not waiting and any(t in by_service for t in targets):  # back to one in the chain
            return [*lines, "cause: the parts above wait on each other (a deadlock)"]
        if not waiting:
            t = targets[0]
            idle = now - services[t]["progressed_at"]
            return [
                *lines,
                f"cause: {t} has not progressed for {idle:.0f} s and waits on no other part of "
                "the run: it is stuck in its own code (see its stack)",
            ]
        w = by_service[waiting[0]][0]
        seen.add(w.service)


def _kind(name: str) -> str:
    """A service's kind: `explorer 'a'` and `explorer` are explorers."""
    return name.split(" ")[0]
