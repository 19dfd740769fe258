"""MetricsHub: a tiny Ray actor that explorer and trainer push metrics to; the driver drains it."""

from __future__ import annotations

from typing import Any


class MetricsHub:
    def __init__(self) -> None:
        self._events: list[tuple[str, int, dict[str, Any]]] = []

    def put(self, source: str, step: int, metrics: dict[str, Any]) -> None:
        self._events.append((source, step, dict(metrics)))

    def drain(self) -> list[tuple[str, int, dict[str, Any]]]:
        events, self._events = self._events, []
        return events
