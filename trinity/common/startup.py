"""Where a run's start-up goes: the start-up timeline in the run's metrics.

Every mark is a wall-clock time (epoch seconds), reported as seconds since the driver's process
started (`started_at`: from /proc, so the interpreter's own start and the CLI's imports count),
under `startup/<mark>_s` in the record of the run's first step:

| mark | where | what has happened by then |
|---|---|---|
| `config` | driver | imports, the config loaded, pre-flight passed (`trinity validate`'s work) |
| `ray` | driver | Ray is up (a local instance started, or the cluster joined) |
| `<role>_process` | actor | Ray has started the actor's worker process |
| `<role>_imports` | actor | its modules are imported (its `__init__` begins) |
| `<role>_ready` | actor | its `prepare` is done (trainer: model, optimizer-free; explorer: tasksets, engines loaded) |
| `engine_process`, `engine_ready` | explorer | the last of its engines started / loaded its model |
| `first_rollout` | explorer | the first explore step's experiences are written |
| `first_update` | trainer | the first train step is done (and its weights published, when due) |

Marks across processes compare wall clocks, so on several nodes they are as good as the nodes'
clock sync. A Ray worker process may have been started before its actor was placed on it (Ray
pre-starts workers): then `<role>_process` is earlier than the actor's creation, and
`<role>_imports` still tells when the actor could begin.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PHASES = (
    "config",
    "ray",
    "trainer_process",
    "trainer_imports",
    "trainer_ready",
    "explorer_process",
    "explorer_imports",
    "engine_process",
    "engine_ready",
    "explorer_ready",
    "first_rollout",
    "first_update",
)


_FORKED_AT: float | None = None  # a run's forked process: its parent's start (count_from_parent)


def count_from_parent() -> None:
    """In a process forked to do the run (`launcher.supervise`): `process_started_at()` is the
    parent's start, where the command began, so the start-up timeline counts from there."""
    global _FORKED_AT
    _FORKED_AT = process_started_at(os.getppid())


def process_started_at(pid: int | str = "self") -> float:
    """When a process started (epoch seconds): now minus its age, the time since boot
    (/proc/uptime, to 10 ms) less its start in clock ticks after boot (/proc/<pid>/stat; /proc/stat's
    boot time is whole seconds, too coarse). Without /proc, now (a mark then counts from here).
    This process, forked to do a run: its parent's start (`count_from_parent`)."""
    if pid == "self" and _FORKED_AT is not None:
        return _FORKED_AT
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return time.time()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the comm's parenthesis
    return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


class StartupMarks:
    """One process's marks, named by phase: `mark(name)` stamps now; `as_metrics(since)` gives
    `startup/<name>_s` relative to `since`, once (later calls return nothing, so only the first
    step's record carries them)."""

    def __init__(self, role: str | None = None) -> None:
        self.marks: dict[str, float] = {}
        self._reported = False
        if role is not None:  # an actor: its process start, and its imports done (now)
            self.marks[f"{role}_process"] = process_started_at()
            self.marks[f"{role}_imports"] = time.time()

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.setdefault(name, time.time() if at is None else at)

    def as_metrics(self, since: float | None) -> dict[str, float]:
        if since is None or self._reported:
            return {}
        self._reported = True
        return {f"startup/{k}_s": max(0.0, v - since) for k, v in self.marks.items()}


def timeline(record: dict[str, float]) -> str:
    """One line: the marks of a record in the order of `PHASES` (those it has)."""
    parts = [
        f"{name.replace('_', ' ')} {record[f'startup/{name}_s']:.1f}"
        for name in PHASES
        if f"startup/{name}_s" in record
    ]
    return " → ".join(parts) + " s" if parts else ""
