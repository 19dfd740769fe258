"""The `sql` storage: experiences in a SQL database (SQLite by default, PostgreSQL by URL), shared
by any number of writers and readers in any processes, exactly once.

    buffer.trainer_input.experience_buffer: {name: exp_buffer, storage_type: sql}    # SQLite
    ... {storage_type: sql, path: "postgresql://me@/trinity?host=/run/pg&port=5433"}  # PostgreSQL

Implements `trinity.buffer.storage.ExperienceStorage` with the `queue` storage's contract (leases
acked after a checkpoint, cursors in the write's transaction, retention, writer tokens, finish,
close and linger), with every fact of it in the database (`sql_store.py`), not in the process:
a second storage over the same database, in another process or on another machine, is a peer,
not a copy. Without `path`, the database is a SQLite file in the run folder
(`<run_dir>/buffer/<name>.sqlite`); the tables are described in `sql_schema.py`.

How it departs from `queue`:
- Nothing is held in memory: a read takes its rows from the database (so `capacity` bounds the
  pending rows, not memory).
- Opening a storage does not take back the leases it finds: another process's reader may hold
  them. A restarted reader does (`reader_started`, which the trainer calls before it reads),
  after acking the leases its checkpoint recorded (`settled`); so does the run's trainer on every
  start, which is when the queue takes them back too.
- A waiting read or write polls the database (another process may write or read), from 5 ms
  doubling up to 0.25 s; in this process an asyncio.Condition wakes it at once on a local write,
  read, ack or change of writers.

Every database call runs on the storage's one thread, in call order, never on the event loop
that the actor (or the run's ServiceHost) serves its calls on. Opening the database (the
constructor) is the one exception: it runs before any call is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from trinity.buffer.replay import ReplaySpec
from trinity.buffer.sql_store import BufferState, SQLStore, Taken
from trinity.buffer.sql_url import database_url
from trinity.buffer.storage import STORAGE, BufferClosed, Cursor, Lease, Superseded
from trinity.common.experience import Experience
from trinity.common.shared import RefCounted

__all__ = ["SQLStorage"]

T = TypeVar("T")
POLL_S = (0.005, 0.25)  # a waiting call polls the database from every 5 ms up to every 0.25 s


@STORAGE.register("sql")
class SQLStorage(RefCounted):
    def __init__(
        self,
        path: str | Path | None,
        capacity: int = 10000,
        settled: list[int] = (),
        reopen: bool = False,
        name: str = "experience_buffer",
        replay: ReplaySpec | None = None,
    ) -> None:
        """`path`: a SQLite file or a database URL (`sql_url.py`); `name`: this buffer's name
        in the database (rows of other names are other buffers). `settled`: leases the
        checkpoint a resumed trainer starts from has trained, acked now; `reopen`: a continued
        run, so a finished buffer takes writes again; `replay`: reuse by priority (`replay.py`)."""
        if path is None:
            raise ValueError("storage_type sql needs a database: a SQLite file or a URL")
        self.capacity = capacity
        self.store = SQLStore(database_url(str(path)), name, replay, capacity)
        self.store.settle(list(settled), reopen)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sql-storage")
        self._cond = asyncio.Condition()
        self._changes = 0  # bumped on every local change: a waiter that saw none sleeps
        self._state = self.store.state()  # as the last transaction saw it (`describe`)
        self._released_at: float | None = None  # when this process saw every writer released

    @classmethod
    def location(cls, configured: str | None, stage_dir: Path, name: str) -> str:
        """The database a run's buffer `name` lives in: `configured` (the config's `path`), or
        a SQLite file in the run's folder; as a full URL (a relative file made absolute here,
        in the driver: the storage's actor runs in another working folder)."""
        url = database_url(configured or str(stage_dir / "buffer" / f"{name}.sqlite"))
        return url.render_as_string(hide_password=False)

    # -- the storage's thread and waiting ----------------------------------------------------

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the storage's thread (one database call at a time, in call order)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    async def _changed(self) -> None:
        """Something changed here (a write, a lease, an ack, writers): wake local waiters."""
        async with self._cond:
            self._changes += 1
            self._cond.notify_all()

    async def _pause(self, seen: int, delay: float) -> None:
        """Wait up to `delay` s for a local change after the one numbered `seen` (a change
        made while the last attempt ran ends the wait at once)."""
        async with self._cond:
            if self._changes == seen:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait(), delay)

    def _observe(self, state: BufferState) -> None:
        self._state = state
        if not state.all_released or state.closed:
            self._released_at = None
        elif self._released_at is None:
            self._released_at = time.monotonic()

    # -- writing -----------------------------------------------------------------------------

    async def write(
        self, experiences: list[Experience], cursor: Cursor | None = None, token: int | None = None
    ) -> int:
        """Append in one transaction with the writer's cursor (blocking while `capacity` rows
        are pending). Returns the pending count. `token`: the writer's, from `register_writer`;
        a write of a process that was since replaced raises `Superseded`."""
        delay = POLL_S[0]
        while True:
            seen = self._changes
            done = await self._db(self.store.append, experiences, cursor, token, self.capacity)
            self._observe(done.state)
            if done.superseded:
                assert cursor is not None
                raise Superseded(f"explorer {cursor.explorer!r} was started again")
            if done.refused:
                raise BufferClosed(done.refused)
            if not done.full:
                await self._changed()
                return done.state.pending
            await self._pause(seen, delay)
            delay = min(2 * delay, POLL_S[1])

    async def cursor(self, explorer: str) -> Cursor | None:
        return await self._db(self.store.cursor, explorer)

    # -- reading -----------------------------------------------------------------------------

    async def read(
        self,
        n: int,
        timeout: float | None = None,
        min_version: int | None = None,
        linger: float = 0.0,
        reader: int | None = None,
    ) -> Lease:
        """The next `n` experiences in write order (by priority with replay) under a new lease;
        the queue's contract (`QueueStorage.read`): fewer only once writing has ended,
        BufferClosed once nothing is left, `linger` s of waiting for a late writer after every
        writer released, stale rows dropped, TimeoutError after `timeout` s, `Superseded` for a
        replaced reader's token."""

        def may_end(state: BufferState) -> bool:
            """Called in the transaction: has writing ended (a short read may take the rest)?"""
            self._observe(state)
            if state.closed or (state.all_released and linger <= 0):
                return True
            return state.all_released and time.monotonic() - self._released_at >= linger

        deadline = None if timeout is None else time.monotonic() + timeout
        delay = POLL_S[0]
        while True:
            seen = self._changes
            taken = await self._take(n, min_version, reader, may_end)
            self._observe(taken.state)
            if taken.superseded:
                raise Superseded(f"trainer token {reader} was superseded by {taken.state.reader}")
            if taken.drained:
                raise BufferClosed("buffer closed and drained")
            if taken.lease is not None:
                await self._changed()
                return Lease(taken.lease, [e for _, e in taken.rows])
            wait = delay
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"buffer read of {n} experiences timed out after {timeout}s "
                        f"({self.describe()})"
                    )
                wait = min(wait, left)
            await self._pause(seen, wait)
            delay = min(2 * delay, POLL_S[1])

    async def _take(self, n: int, *args: Any) -> Taken:
        """`store.take` on the storage's thread; a lease it makes after this call was cancelled
        (a caller that gave up) is given back, so nobody holds rows that nobody trains."""
        job = asyncio.ensure_future(self._db(self.store.take, n, *args))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:

            def give_back(done: asyncio.Future) -> None:
                ok = not done.cancelled() and done.exception() is None
                if ok and (lease := done.result().lease) is not None:
                    self._pool.submit(self.store.give_back, lease)

            job.add_done_callback(give_back)
            raise

    async def ack(self, lease_ids: list[int]) -> None:
        """The train steps that used these leases are checkpointed: their rows are trained (and
        their payloads deleted). KeyError for a lease unknown, acked already, or returned."""
        await self._db(self.store.ack, list(lease_ids))
        await self._changed()

    async def reader_started(self, settled: list[int] = ()) -> dict[str, int]:
        """A trainer (re)starts reading: `settled` leases acked, every other open lease handed
        out again (ahead of what was never read: write order), writing reopened if it had
        ended. Returns `reader` (the token its reads carry) and `returned` (rows)."""
        token, returned = await self._db(self.store.reader_started, list(settled))
        await self._changed()
        return {"reader": token, "returned": returned}

    # -- writers and ending ------------------------------------------------------------------

    async def register_writer(self, writer: str) -> int:
        """`writer` writes from now on (again: its release undone, a buffer its release had
        closed reopened). Returns its token; a write of its earlier process raises."""
        token = await self._db(self.store.register_writer, writer)
        await self._changed()
        return token

    async def release_writer(self, writer: str) -> None:
        """`writer` is done; when every registered writer is, the buffer closes."""
        self._observe(await self._db(self.store.release_writer, writer))
        await self._changed()

    async def close(self) -> None:
        """End writing now: reads drain what is left, then see BufferClosed."""
        await self._db(self.store.close)
        await self._changed()

    async def finish(self) -> int:
        """The trainer reached its step budget: writing ends for good, pending rows are dropped
        (counted). Returns how many."""
        dropped = await self._db(self.store.finish)
        await self._changed()
        return dropped

    def lingering(self) -> bool:
        """Every writer has released and the buffer is not finished (as last seen)."""
        return self._state.all_released and not self._state.closed

    def describe(self) -> str:
        """The buffer's state in words, as its last transaction saw it (no database call)."""
        s = self._state
        state = "finished" if s.closed else "every writer released" if s.all_released else "open"
        writing = sorted(set(s.tokens) - s.released)
        return (
            f"{s.pending} experiences waiting, {state}; explorers writing: "
            f"{', '.join(writing) or 'none'}"
            + (f"; done: {', '.join(sorted(s.released))}" if s.released else "")
            + f"; {self.store.where()}"
        )

    async def stats(self) -> dict[str, int]:
        """Counts: written, trained, pending, leased, dropped, trained_twice."""
        return await self._db(self.store.counts)

    def shutdown(self) -> None:
        """Let the database go (the run's ServiceHost calls this when it removes the buffer)."""
        self._pool.shutdown(wait=True)
        self.store.dispose()
