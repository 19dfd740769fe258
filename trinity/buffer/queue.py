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
import contextlib
import time
from pathlib import Path
from typing import ClassVar

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import STORAGE, BufferClosed, Cursor, Lease, Superseded
from trinity.common.experience import Experience
from trinity.common.shared import RefCounted

__all__ = ["BufferClosed", "QueueStorage", "Superseded"]


@STORAGE.register("queue")
class QueueStorage(RefCounted):
    log_type: ClassVar[type[SQLiteLog]] = SQLiteLog  # the durable log (the file storage's own)

    def __init__(
        self,
        path: str | Path | None,
        capacity: int = 10000,
        settled: list[int] = (),
        reopen: bool = False,
        name: str = "experience_buffer",
    ) -> None:
        """`settled`: leases the checkpoint a resumed trainer starts from has trained (its
        `buffer_leases.json`); acked before recovery, in case the crash came between writing
        that checkpoint and its ack, so they are not handed out (and trained) again. `name`:
        the buffer's name (its file is its own: the name is only told)."""
        self.name = name
        self.capacity = capacity
        self.log = self.log_type(path) if path is not None else None
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
        self.written = 0
        self.read_count = 0
        self.dropped = 0
        self._leased_items: dict[int, list[tuple[int, Experience]]] = {}  # memory only (no log)
        self._reader = 0  # the current trainer's token (`reader_started`)
        self._released_at: float | None = None  # when every writer had released (monotonic)
        self._tokens: dict[str, int] = {}  # writer -> its current process's token
        if self.log is not None:
            self._reload(settled)
            if reopen and self.log.finished():
                self.log.set_finished(False)
            self._closed = self._closed_for_good = self.log.finished()

    @classmethod
    def location(cls, configured: str | None, stage_dir: Path, name: str) -> str:
        """The log file of a run's buffer `name`: in the run's folder (a configured `path` is
        not read: the queue's file is the run's own)."""
        return str(stage_dir / "buffer" / f"{name}.db")

    def _reload(self, settled: list[int] = ()) -> None:
        """Rebuild the queue from the log: `settled` leases acked, every other lease handed out
        again (its reader is gone), pending rows in write order (up to `capacity` in memory)."""
        assert self.log is not None
        self.log.ack(list(settled))
        self._items.clear()
        self._leases.clear()
        self._paged_to = 0
        self._on_disk = self.log.recover()
        self._next_lease = max(self._next_lease, self.log.max_lease() + 1)
        self._page_in(self.capacity)

    async def reader_started(self, settled: list[int] = ()) -> dict[str, int]:
        """A trainer (re)starts reading: the leases of the checkpoint it resumes from
        (`settled`) are trained, every other outstanding lease belonged to a trainer that died
        and goes back to the queue, in write order, ahead of what was never read. A finished
        buffer reopens (the trainer continues with a larger step budget). The run has one
        trainer: whatever an earlier one had not acked is stale.

        Returns `reader`, the token this trainer passes to `read` (a read of an earlier trainer,
        still waiting in this actor after its process died, raises instead of taking
        experiences under a lease nobody acks), and `returned`, how many went back."""
        async with self._cond:
            back = sum(k for lease, k in self._leases.items() if lease not in settled)
            if self.log is not None:
                self._reload(settled)
                if self.log.finished():
                    self.log.set_finished(False)
            else:
                for lease in sorted(set(self._leased_items) - set(settled), reverse=True):
                    self._items.extendleft(reversed(self._leased_items[lease]))
                self._leased_items.clear()
                self._leases.clear()
                self.read_count -= back
            if self._closed_for_good:
                self._closed_for_good = False
                self._closed = bool(self._writers) and self._released == self._writers
            self._reader += 1  # a read still waiting for the dead trainer gets nothing
            self._cond.notify_all()
            return {"reader": self._reader, "returned": back}

    async def write(
        self, experiences: list[Experience], cursor: Cursor | None = None, token: int | None = None
    ) -> int:
        """Append experiences (blocks while the queue is at capacity), with the writer's cursor
        in the same transaction. Returns the queue size. `token`: the writer's, from
        `register_writer`; a write of a process that was since replaced raises `Superseded`."""

        def superseded() -> bool:
            return (
                token is not None
                and cursor is not None
                and self._tokens.get(cursor.explorer) != token
            )

        async with self._cond:
            await self._cond.wait_for(
                lambda: self.size() < self.capacity or self._closed or superseded()
            )
            if superseded():
                raise Superseded(f"explorer {cursor.explorer!r} was started again")
            if self._closed_for_good:
                raise BufferClosed("the trainer has finished: the buffer takes no more")
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
        self,
        n: int,
        timeout: float | None = None,
        min_version: int | None = None,
        linger: float = 0.0,
        reader: int | None = None,
    ) -> Lease:
        """Take the next `n` experiences (FIFO) under a new lease.

        Blocks until `n` are there. When the writers are done, returns what is left (fewer than
        `n`), and raises `BufferClosed` once nothing is. `linger` > 0 (a trainer with a step
        budget in a split run): when every registered writer has released, wait up to `linger`
        s more for a writer to register (an explorer started later) before taking the writers
        as done; `finish()` ends the wait at once. `min_version` drops (for good) experiences
        produced by older weights. Raises TimeoutError after `timeout` s. `reader`: the token of
        `reader_started`; a superseded one raises `Superseded`.
        """

        def lingered() -> float:
            """Seconds since every writer released (0 while some writer writes)."""
            return time.monotonic() - self._released_at if self._released_at is not None else 0

        def ready() -> bool:
            if reader is not None and reader != self._reader:
                return True
            self._page_in(max(n, self.capacity))
            self._drop_stale(min_version)
            if len(self._items) >= n:
                return True
            if not self._closed or self._on_disk:
                return False
            if self._closed_for_good or linger <= 0:
                return True
            return lingered() >= linger

        async def wait() -> None:
            while not ready():
                slice_ = None
                if self._closed and not self._closed_for_good:
                    slice_ = max(0.01, linger - lingered())
                with contextlib.suppress(TimeoutError):  # the linger ran out: `ready` says so
                    await asyncio.wait_for(self._cond.wait(), slice_)

        async with self._cond:
            try:
                await asyncio.wait_for(wait(), timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"buffer read of {n} experiences timed out after {timeout}s ({self.describe()})"
                ) from e
            if reader is not None and reader != self._reader:
                raise Superseded(f"trainer token {reader} was superseded by {self._reader}")
            if not self._items:
                raise BufferClosed("buffer closed and drained")
            taken = [self._items.popleft() for _ in range(min(n, len(self._items)))]
            lease = self._next_lease
            self._next_lease += 1
            if self.log is not None:
                self.log.lease([i for i, _ in taken], lease)
            else:
                self._leased_items[lease] = taken
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
            self._leased_items.pop(i, None)

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
            self.dropped += len(stale)

    async def register_writer(self, writer: str) -> int:
        """`writer` writes from now on. A writer may come back (an explore process run again
        after a crash or to explore more): that undoes its release and reopens the buffer if
        the releases had closed it (not a `close` or `finish`). Returns the token its writes
        carry: a write still waiting for the writer's earlier process raises instead."""
        async with self._cond:
            self._writers.add(writer)
            self._released.discard(writer)
            if self._closed and not self._closed_for_good:
                self._closed = False
            self._released_at = None
            self._tokens[writer] = self._tokens.get(writer, 0) + 1
            self._cond.notify_all()
            return self._tokens[writer]

    async def release_writer(self, writer: str) -> None:
        """`writer` is done; the last registered writer to release closes the buffer."""
        async with self._cond:
            if writer not in self._writers:
                raise ValueError(f"writer {writer!r} was never registered with this buffer")
            self._released.add(writer)
            if self._released == self._writers:
                self._closed = True
                self._released_at = time.monotonic()
                self._cond.notify_all()

    def lingering(self) -> bool:
        """Every writer has released but the buffer is not finished: a reader with a `linger`
        waits for a writer that may still come (bounded by the linger itself)."""
        return self._closed and not self._closed_for_good

    async def close(self) -> None:
        """End writing now: pending and future reads drain what is left, then see BufferClosed."""
        async with self._cond:
            self._closed = self._closed_for_good = True
            self._cond.notify_all()

    async def finish(self) -> int:
        """The trainer reached its step budget: writing ends for good (a blocked or later write
        raises BufferClosed, so its explorer stops), and what is pending will never be read: it
        is dropped (counted in `stats`). Kept in the log, so a buffer started again over it
        knows; a trainer started again (`reader_started`) reopens it. Returns how many were
        dropped."""
        async with self._cond:
            self._closed = self._closed_for_good = True
            dropped = self.size()
            if self.log is not None:
                self.log.drop_pending()
                self.log.set_finished(True)
            self._items.clear()
            self._on_disk = 0
            self.dropped += dropped
            self._cond.notify_all()
            return dropped

    def describe(self) -> str:
        """What a reader or writer waiting on this buffer waits for, in words."""
        state = "finished" if self._closed_for_good else "open"
        if self._closed and not self._closed_for_good:
            state = "every writer released"
        writing = sorted(self._writers - self._released)
        return (
            f"{self.size()} experiences waiting, {state}; explorers writing: "
            f"{', '.join(writing) or 'none'}"
            + (f"; done: {', '.join(sorted(self._released))}" if self._released else "")
        )

    def size(self) -> int:
        """Experiences waiting to be read (in memory and still on disk)."""
        return len(self._items) + self._on_disk

    async def stats(self) -> dict[str, int]:
        """Counts: written, trained, pending, leased, dropped, trained_twice."""
        if self.log is not None:
            return self.log.counts()
        return {
            "written": self.written,
            "trained": self.read_count - sum(self._leases.values()),
            "pending": len(self._items),
            "leased": sum(self._leases.values()),
            "dropped": self.dropped,
            "trained_twice": 0,
        }
