"""MetricsHub: a tiny Ray actor that explorer and trainer push metrics to; the driver drains it.

With a `journal` file every report is also appended there (and flushed) before `put` returns,
so reports the driver had not yet merged survive a driver killed with SIGKILL (the hub dies with
it); the next run's `Monitor` merges them (`Monitor.begin_stage`).

The driver takes reports with `reports(timeout)`, which returns as soon as there is one, so a
step's record reaches the monitor (and `metrics.jsonl`) when the step ends rather than on a
polling grid; `wake` ends a waiting `reports` call at once. Those two are coroutines, so the
hub runs as an async actor: every method runs on its event loop, `put` included.

`replay` is a report sent again from where it was kept durably (an explore step's report, kept
in the buffer with the step, sent by the explorer that continues after it): the monitor writes
it only when no record of its step holds it yet (`Monitor.add(replay=True)`).
"""

from __future__ import annotations

import asyncio
import contextlib
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
        self._arrived: asyncio.Event | None = None  # made on the event loop, by `reports`

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
        self._signal()

    def replay(self, source: str, step: int, metrics: dict[str, Any]) -> None:
        """`put` a report kept durably elsewhere, again (module docstring)."""
        self.put(source, step, metrics, replay=True)

    def drain(self) -> list[Report]:
        events, self._events = self._events, []
        return events

    async def reports(self, timeout: float) -> list[Report]:
        """`drain`, once a report is there or `timeout` seconds have passed (or `wake`)."""
        if not self._events:
            self._arrived = self._arrived or asyncio.Event()
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)
        return self.drain()

    async def wake(self) -> None:
        """End a waiting `reports` call now (the driver stops waiting for reports)."""
        self._signal()

    def _signal(self) -> None:
        if self._arrived is not None:
            self._arrived.set()
