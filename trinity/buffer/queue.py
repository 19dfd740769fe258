"""The `queue` storage: a FIFO of experiences shared by explorer and trainer, crash-safe.

    buffer.trainer_input.experience_buffer: {name: exp_buffer, storage_type: queue}

`QueueStorage` is the in-process object; `QueueActor` is the same thing as a named Ray actor so
explorers and trainers in other processes meet through it. Writes go through to SQLite
(`<run_dir>/buffer/<name>.db`) before they are visible, so a restarted run finds every experience
that was written and not yet read.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.common.experience import Experience


class BufferClosed(Exception):
    """Raised by `read` when the writers are done and nothing is left."""


class QueueStorage:
    def __init__(self, path: str | Path | None, capacity: int = 10000) -> None:
        self.capacity = capacity
        self.log = SQLiteLog(path) if path is not None else None
        self._items: collections.deque[tuple[int, Experience]] = collections.deque()
        self._cond = asyncio.Condition()
        self._closed = False
        self._next_local_id = -1
        if self.log is not None:
            self._items.extend(self.log.unconsumed())
        self.written = 0
        self.read_count = 0

    async def write(self, experiences: list[Experience]) -> int:
        """Append experiences (blocks while the queue is at capacity). Returns the queue size."""
        async with self._cond:
            await self._cond.wait_for(lambda: len(self._items) < self.capacity or self._closed)
            if self._closed:
                raise BufferClosed("write to a closed buffer")
            if self.log is not None:
                ids = self.log.append(experiences)
            else:
                ids = list(range(self._next_local_id, self._next_local_id - len(experiences), -1))
                self._next_local_id -= len(experiences)
            self._items.extend(zip(ids, experiences, strict=True))
            self.written += len(experiences)
            self._cond.notify_all()
            return len(self._items)

    async def read(
        self, n: int, timeout: float | None = None, min_version: int | None = None
    ) -> list[Experience]:
        """Take the next `n` experiences (FIFO).

        Blocks until `n` are there. When the writers have closed the buffer, returns what is left
        (fewer than `n`), and raises `BufferClosed` once nothing is. `min_version` drops (and marks
        consumed) experiences produced by older weights. Raises TimeoutError after `timeout` s.
        """

        def ready() -> bool:
            self._drop_stale(min_version)
            return len(self._items) >= n or self._closed

        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(ready), timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"buffer read of {n} experiences timed out after {timeout}s "
                    f"({len(self._items)} available)"
                ) from e
            if not self._items:
                raise BufferClosed("buffer closed and drained")
            taken = [self._items.popleft() for _ in range(min(n, len(self._items)))]
            if self.log is not None:
                self.log.mark_consumed([i for i, _ in taken if i >= 0])
            self.read_count += len(taken)
            self._cond.notify_all()
            return [e for _, e in taken]

    def _drop_stale(self, min_version: int | None) -> None:
        if min_version is None:
            return
        stale = [(i, e) for i, e in self._items if e.model_version < min_version]
        if stale:
            self._items = collections.deque(
                (i, e) for i, e in self._items if e.model_version >= min_version
            )
            if self.log is not None:
                self.log.mark_consumed([i for i, _ in stale if i >= 0])

    async def close(self) -> None:
        """Writers are done: pending and future reads drain what is left, then see BufferClosed."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    async def reopen(self) -> None:
        async with self._cond:
            self._closed = False

    def size(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        return {"size": len(self._items), "written": self.written, "read": self.read_count}


class QueueActor(QueueStorage):
    """Ray actor face of QueueStorage (created with `ray.remote(QueueActor).options(name=...)`)."""
