"""Named timers whose names are also their metric keys (`timing/<name>` in seconds)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timers:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self, prefix: str = "timing/") -> dict[str, float]:
        return {prefix + k: v for k, v in self.seconds.items()}
