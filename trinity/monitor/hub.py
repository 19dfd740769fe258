"""MetricsHub: a tiny Ray actor that explorer and trainer push metrics to; the driver drains it.

With a `journal` file every report is also appended there (and flushed) before `put` returns,
so reports the driver had not yet merged survive a driver killed with SIGKILL (the hub dies with
it); the next run's `Monitor` merges them (`Monitor.begin_stage`).

`replay` is a report sent again from where it was kept durably (an explore step's report, kept
in the buffer with the step, sent by the explorer that continues after it): the monitor writes
it only when no record of its step holds it yet (`Monitor.add(replay=True)`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple


class Report(NamedTuple):
    source: str
    step: int
    metrics: dict[str, Any]
    replay: bool = False


class MetricsHub:
    def __init__(self, journal: str | None = None) -> None:
        self._events: list[Report] = []
        self._stage = ""
        self._journal = Path(journal) if journal else None

    def begin_stage(self, stage: str) -> None:
        """The stage the next reports belong to (recorded in the journal)."""
        self._stage = stage

    def put(self, source: str, step: int, metrics: dict[str, Any], replay: bool = False) -> None:
        if self._journal is not None:
            entry = {"stage": self._stage, "source": source, "step": step, "metrics": metrics}
            if replay:
                entry["replay"] = True
            with self._journal.open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
        self._events.append(Report(source, step, dict(metrics), replay))

    def replay(self, source: str, step: int, metrics: dict[str, Any]) -> None:
        """`put` a report kept durably elsewhere, again (module docstring)."""
        self.put(source, step, metrics, replay=True)

    def drain(self) -> list[Report]:
        events, self._events = self._events, []
        return events
