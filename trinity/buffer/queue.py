"""The `queue` storage: a FIFO of experiences shared by explorers and a trainer, crash-safe.

    buffer.trainer_input.experience_buffer: {name: exp_buffer, storage_type: queue}

Implements `trinity.buffer.storage.ExperienceStorage`. Writes go through to SQLite
(`<run_dir>/buffer/<name>.db`, `sqlite_log.py`) before they are visible; reads hand experiences
out under a lease that the trainer acks after its next checkpoint, so a restarted run finds every
experience that was written and not yet trained on, in write order.

At most `capacity` experiences are held in memory. A restart that finds more pending rows (the
leased ones come back on top of a full queue, or `capacity` was lowered) keeps the rest on disk
and pages them in, in write order, as reads make room; new writes queue behind them.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import STORAGE, BufferClosed, Cursor, Lease
from trinity.common.experience import Experience
from trinity.common.shared import RefCounted

__all__ = ["BufferClosed", "QueueStorage"]


@STORAGE.register("queue")
class QueueStorage(RefCounted):
    def __init__(
        self, path: str | Path | None, capacity: int = 10000, settled: list[int] = ()
    ) -> None:
        """`settled`: leases the checkpoint a resumed trainer starts from has trained (its
        `buffer_leases.json`); acked before recovery, in case the crash came between writing
        that checkpoint and its ack, so they are not handed out (and trained) again."""
        self.capacity = capacity
        self.log = SQLiteLog(path) if path is not None else None
        self._items: collections.deque[tuple[int, Experience]] = collections.deque()
        self._leases: dict[int, int] = {}  # lease id -> experiences in it (not yet acked)
        self._cond = asyncio.Condition()
        self._closed = False
        self._closed_for_good = False  # `close()`: no writer reopens it
        self._writers: set[str] = set()
        self._released: set[str] = set()
        self._next_local_id = -1
        self._cursors: dict[str, Cursor] = {}  # memory only (no log)
        self._next_lease = 1
        self._on_disk = 0  # pending rows in the log and not in memory: all after `_items`
        self._paged_to = 0  # id of the last row paged in from the log
        if self.log is not None:
            self.log.ack(list(settled))
            self._on_disk = self.log.recover()
            self._next_lease = self.log.max_lease() + 1
            self._page_in(capacity)
        self.written = 0
        self.read_count = 0

    async def write(self, experiences: list[Experience], cursor: Cursor | None = None) -> int:
        """Append experiences (blocks while the queue is at capacity), with the writer's cursor
        in the same transaction. Returns the queue size."""
        async with self._cond:
            await self._cond.wait_for(lambda: self.size() < self.capacity or self._closed)
            if self._closed:
                raise BufferClosed("write to a closed buffer")
            if self.log is not None:
                ids = self.log.append(experiences, cursor)
            else:
                if cursor is not None:
                    self._cursors[cursor.explorer] = cursor
                ids = list(range(self._next_local_id, self._next_local_id - len(experiences), -1))
                self._next_local_id -= len(experiences)
            if self._on_disk:  # behind the rows still on disk: paged in after them
                self._on_disk += len(experiences)
            else:
                self._items.extend(zip(ids, experiences, strict=True))
            self.written += len(experiences)
            self._cond.notify_all()
            return len(self._items)

    async def read(
        self, n: int, timeout: float | None = None, min_version: int | None = None
    ) -> Lease:
        """Take the next `n` experiences (FIFO) under a new lease.

        Blocks until `n` are there. When the writers are done, returns what is left (fewer than
        `n`), and raises `BufferClosed` once nothing is. `min_version` drops (for good)
        experiences produced by older weights. Raises TimeoutError after `timeout` s.
        """

        def ready() -> bool:
            self._page_in(max(n, self.capacity))
            self._drop_stale(min_version)
            return len(self._items) >= n or (self._closed and not self._on_disk)

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
            lease = self._next_lease
            self._next_lease += 1
            if self.log is not None:
                self.log.lease([i for i, _ in taken], lease)
            self._leases[lease] = len(taken)
            self.read_count += len(taken)
            self._cond.notify_all()
            return Lease(lease, [e for _, e in taken])

    async def cursor(self, explorer: str) -> Cursor | None:
        if self.log is not None:
            return self.log.cursor(explorer)
        return self._cursors.get(explorer)

    async def ack(self, lease_ids: list[int]) -> None:
        unknown = [i for i in lease_ids if i not in self._leases]
        if unknown:
            raise KeyError(f"ack of unknown or already acked leases {unknown}")
        if self.log is not None:
            self.log.ack(lease_ids)
        for i in lease_ids:
            del self._leases[i]

    def _page_in(self, room: int) -> None:
        """Move pending rows from the log into memory, in write order, up to `room` in memory."""
        while self._on_disk and len(self._items) < room and self.log is not None:
            rows = self.log.pending(self._paged_to, room - len(self._items))
            if not rows:
                raise RuntimeError(
                    f"buffer log {self.log.path}: {self._on_disk} pending rows expected on disk "
                    f"after id {self._paged_to}, none found"
                )
            self._items.extend(rows)
            self._on_disk -= len(rows)
            self._paged_to = rows[-1][0]

    def _drop_stale(self, min_version: int | None) -> None:
        if min_version is None:
            return
        stale = [(i, e) for i, e in self._items if e.model_version < min_version]
        if stale:
            self._items = collections.deque(
                (i, e) for i, e in self._items if e.model_version >= min_version
            )
            if self.log is not None:
                self.log.drop([i for i, _ in stale if i >= 0])

    async def register_writer(self, writer: str) -> None:
        """`writer` writes from now on. A writer may come back (an explore process run again
        after a crash or to explore more): that undoes its release and reopens the buffer if
        the releases had closed it (not an explicit `close`)."""
        async with self._cond:
            self._writers.add(writer)
            self._released.discard(writer)
            if self._closed and not self._closed_for_good:
                self._closed = False

    async def release_writer(self, writer: str) -> None:
        """`writer` is done; the last registered writer to release closes the buffer."""
        async with self._cond:
            if writer not in self._writers:
                raise ValueError(f"writer {writer!r} was never registered with this buffer")
            self._released.add(writer)
            if self._released == self._writers:
                self._closed = True
                self._cond.notify_all()

    async def close(self) -> None:
        """End writing now: pending and future reads drain what is left, then see BufferClosed."""
        async with self._cond:
            self._closed = self._closed_for_good = True
            self._cond.notify_all()

    def size(self) -> int:
        """Experiences waiting to be read (in memory and still on disk)."""
        return len(self._items) + self._on_disk

    def stats(self) -> dict[str, int]:
        if self.log is not None:
            return self.log.counts()
        return {
            "written": self.written,
            "trained": self.read_count - sum(self._leases.values()),
            "pending": len(self._items),
            "leased": sum(self._leases.values()),
            "dropped": self.written - self.read_count - len(self._items),
            "trained_twice": 0,
        }
