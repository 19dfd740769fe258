"""MetricsHub: a tiny Ray actor that explorer and trainer push metrics to; the driver drains it.

With a `journal` file every report is also appended there (and flushed) before `put` returns,
so reports the driver had not yet merged survive a driver killed with SIGKILL (the hub dies with
it); the next run's `Monitor` merges them (`Monitor.begin_stage`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsHub:
    def __init__(self, journal: str | None = None) -> None:
        self._events: list[tuple[str, int, dict[str, Any]]] = []
        self._stage = ""
        self._journal = Path(journal) if journal else None

    def begin_stage(self, stage: str) -> None:
        """The stage the next reports belong to (recorded in the journal)."""
        self._stage = stage

    def put(self, source: str, step: int, metrics: dict[str, Any]) -> None:
        if self._journal is not None:
            entry = {"stage": self._stage, "source": source, "step": step, "metrics": metrics}
            with self._journal.open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
        self._events.append((source, step, dict(metrics)))

    def drain(self) -> list[tuple[str, int, dict[str, Any]]]:
        events, self._events = self._events, []
        return events
