"""The `sql` storage's transactions: each method is one transaction on the database, blocking,
run on the storage's own thread (`sql.SQLStorage`), never on an event loop.

    store = SQLStore(database_url(path), "proj/run/exp_buffer")
    store.append(experiences, cursor, token, capacity)   # Written: ids, or why not (full, ...)
    store.take(n, min_version, reader, may_end)           # Taken: a lease, or why not (wait, ...)

Several processes may hold a store on one database at once (explorers writing, readers reading),
so every fact the contract depends on lives in the database, not in a process: the rows and their
states, the leases, the writers and their tokens, the reader's token, the closed and finished
flags. Each transaction reads the facts it needs and changes them atomically:

- the buffer's row (`trinity_buffer`) is the lock that orders them. Reads and writes take it
  shared (they run side by side); what changes the rules (a writer registering or releasing, a
  reader starting, close, finish) takes it exclusively, so a write never slips past a finish, nor
  a superseded writer's write past its successor's registration.
- a read takes its rows with `SELECT ... ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED` on
  PostgreSQL: two readers take different rows, each in write order, without waiting on each
  other. On SQLite `BEGIN IMMEDIATE` serialises the transactions instead (`sql_schema.py`).
- a write inserts the rows, their payloads and the writer's cursor in one transaction: the cursor
  is never ahead of or behind what the storage holds.

With replay (`replay.py`), a read takes the highest-priority ready rows instead of the oldest,
writes the replay copies of what it took in its transaction, and evicts the lowest-priority
copies beyond `capacity`; a returned lease's copies are deleted with it.

Nothing here waits for rows to arrive: a method that cannot proceed says why (`Written.full`,
`Taken` without a lease) and the storage waits and tries again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from trinity.buffer.replay import ReplaySpec, group_key
from trinity.buffer.sql_schema import (
    ACKED,
    EVICTED,
    FINISHED,
    OPEN,
    REPLAY_STALE,
    RETURNED,
    STALE,
    buffers,
    cursors,
    experiences,
    leases,
    open_database,
    payloads,
    writers,
)
from trinity.buffer.sql_url import shown
from trinity.buffer.sqlite_log import DROPPED, LEASED, PENDING, TRAINED
from trinity.buffer.storage import Cursor
from trinity.common.experience import Experience


@dataclass
class BufferState:
    """The buffer as a transaction saw it: what a waiting read or write decides by."""

    reader: int = 0  # the current reader's token
    closed: bool = False  # writing ended for good (close or finish)
    finished: bool = False  # the trainer's step budget was reached
    tokens: dict[str, int] = field(default_factory=dict)  # writer -> its current token
    released: set[str] = field(default_factory=set)  # writers that released the buffer
    pending: int = 0  # pending rows seen (a read that waits: all of them)

    @property
    def all_released(self) -> bool:
        """Every registered writer has released: the buffer closes (until one registers)."""
        return bool(self.tokens) and self.released >= set(self.tokens)


@dataclass
class Written:
    """What `append` did: `ids` written, or nothing and why (`full`, `superseded`, `refused`)."""

    state: BufferState
    ids: list[int] = field(default_factory=list)
    full: bool = False  # at capacity: try again after a read
    superseded: bool = False  # the writer's process was started again
    refused: str = ""  # closed: the BufferClosed message


@dataclass
class Taken:
    """What `take` did: a lease with its rows, or none and why."""

    state: BufferState
    lease: int | None = None
    rows: list[tuple[int, Experience]] = field(default_factory=list)
    superseded: bool = False  # the reader's token is not the current one
    drained: bool = False  # the buffer ended and nothing is left


def _insert(conn: sa.Connection, table: sa.Table) -> Any:
    """The dialect's INSERT, which has `on_conflict_do_*` on SQLite and PostgreSQL alike."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


# a read's statements, built once: an `IN` of one expanding parameter, not one per id
_LEASE_ROWS = (
    experiences.update()
    .where(experiences.c.id.in_(sa.bindparam("ids", expanding=True)))
    .values(state=LEASED, lease=sa.bindparam("lease"))
)
_PAYLOADS_OF = sa.select(payloads.c.id, payloads.c.data).where(
    payloads.c.id.in_(sa.bindparam("ids", expanding=True))
)


def _insert_rows(conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
    """Insert `rows` into `trinity_experience`; their ids, in order (write order). SQLite: ids
    given here, after the highest ever given (AUTOINCREMENT's `sqlite_sequence`), one
    `executemany`: the transaction holds the write lock from its start (`BEGIN IMMEDIATE`), so
    no other writer takes them, and its RETURNING would send the rows one statement each.
    PostgreSQL: the sequence's, by RETURNING in parameter order (several writers at once)."""
    if not rows:
        return []
    if conn.dialect.name == "sqlite":
        last = conn.exec_driver_sql(
            "SELECT seq FROM sqlite_sequence WHERE name = 'trinity_experience'"
        ).scalar()  # None before the table's first row
        first = int(last or 0) + 1
        ids = list(range(first, first + len(rows)))
        conn.execute(experiences.insert(), [{**r, "id": i} for r, i in zip(rows, ids, strict=True)])
        return ids
    insert = experiences.insert().returning(experiences.c.id, sort_by_parameter_order=True)
    return [int(r[0]) for r in conn.execute(insert, rows)]


class SQLStore:
    """One buffer (`buffer`: its name in the database) on the database at `url`; `replay`: its
    replay settings (None: write order, each row read once); `capacity`: the pending rows beyond
    which replay copies are evicted."""

    def __init__(
        self, url: URL, buffer: str, replay: ReplaySpec | None = None, capacity: int = 10000
    ) -> None:
        self.url, self.buffer, self.replay, self.capacity = url, buffer, replay, capacity
        self.engine = open_database(url)
        with self.engine.begin() as conn:
            conn.execute(_insert(conn, buffers).values(buffer=buffer).on_conflict_do_nothing())

    def where(self) -> str:
        """The buffer's place, for messages: `<url> (buffer <name>)`, the password hidden."""
        return f"{shown(self.url)} (buffer {self.buffer})"

    def dispose(self) -> None:
        """Let the database go (its connections closed)."""
        self.engine.dispose()

    # -- reading the buffer's state ----------------------------------------------------------

    def _state(self, conn: sa.Connection, lock: str | None) -> BufferState:
        """The buffer's row and writers; `lock` 'share' (reads, writes) or 'update' (what changes
        the rules) on PostgreSQL (module doc)."""
        q = sa.select(buffers).where(buffers.c.buffer == self.buffer)
        if lock is not None:
            q = q.with_for_update(read=lock == "share")
        row = conn.execute(q).one()
        state = BufferState(reader=row.reader, closed=row.closed, finished=row.finished)
        for w in conn.execute(sa.select(writers).where(writers.c.buffer == self.buffer)):
            state.tokens[w.writer] = w.token
            if w.released:
                state.released.add(w.writer)
        return state

    def _pending(self, conn: sa.Connection) -> int:
        """Fresh rows waiting (replay copies do not count against `capacity`)."""
        e = experiences.c
        q = sa.select(sa.func.count()).where(
            e.buffer == self.buffer, e.state == PENDING, e.uses == 0
        )
        return int(conn.execute(q).scalar_one())

    def _set_flags(self, conn: sa.Connection, **flags: Any) -> None:
        conn.execute(buffers.update().where(buffers.c.buffer == self.buffer).values(**flags))

    def state(self) -> BufferState:
        """The buffer's state now, with its pending count (for `describe`)."""
        with self.engine.begin() as conn:
            state = self._state(conn, None)
            state.pending = self._pending(conn)
            return state

    # -- writing -----------------------------------------------------------------------------

    def append(
        self, items: list[Experience], cursor: Cursor | None, token: int | None, capacity: int
    ) -> Written:
        """Insert `items` (and move `cursor`) unless the writer was superseded, writing has
        ended, or `capacity` rows are pending already."""
        with self.engine.begin() as conn:
            state = self._state(conn, "share")
            state.pending = self._pending(conn)
            mine = state.tokens.get(cursor.explorer) if cursor is not None else token
            if token is not None and mine != token:
                return Written(state, superseded=True)
            if state.closed:
                return Written(state, refused="the trainer has finished: the buffer takes no more")
            if state.all_released:
                return Written(state, refused="write to a closed buffer")
            if state.pending >= capacity:
                return Written(state, full=True)
            ids = _insert_rows(conn, [self._fresh_row(e) for e in items])
            if ids:
                data = [{"id": i, "data": e.to_bytes()} for i, e in zip(ids, items, strict=True)]
                conn.execute(payloads.insert(), data)
            if cursor is not None:
                self._move_cursor(conn, cursor)
            if self.replay is not None:
                self._evict(conn)
            state.pending += len(ids)
            return Written(state, ids=ids)

    def _fresh_row(self, e: Experience) -> dict[str, Any]:
        row = {"buffer": self.buffer, "state": PENDING, "acks": 0, "reason": 0, "uses": 0,
               "model_version": e.model_version, "reward": e.reward}  # fmt: skip
        if self.replay is not None:
            row["group_key"] = group_key(e.eid)
            row["priority"] = self.replay.priority(e.model_version, 0, row["group_key"])[0]
        return row

    def _move_cursor(self, conn: sa.Connection, cursor: Cursor) -> None:
        metrics = json.dumps(cursor.metrics) if cursor.metrics is not None else None
        selector = json.dumps(cursor.selector) if cursor.selector is not None else None
        values = {"step": cursor.step, "tasks": cursor.tasks, "metrics": metrics,
                  "selector": selector}  # fmt: skip
        stmt = _insert(conn, cursors).values(buffer=self.buffer, explorer=cursor.explorer, **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=["buffer", "explorer"], set_=values))

    def cursor(self, explorer: str) -> Cursor | None:
        c = cursors.c
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(cursors).where(c.buffer == self.buffer, c.explorer == explorer)
            ).first()
        if row is None:
            return None
        metrics = json.loads(row.metrics) if row.metrics is not None else None
        selector = json.loads(row.selector) if row.selector is not None else None
        return Cursor(explorer, int(row.step), int(row.tasks), metrics, selector)

    # -- reading -----------------------------------------------------------------------------

    def take(
        self,
        n: int,
        min_version: int | None,
        reader: int | None,
        may_end: Callable[[BufferState], bool],
    ) -> Taken:
        """Lease the next `n` pending rows in write order (stale ones dropped first). Fewer
        only when `may_end(state)` says the buffer has ended (then none: `drained`); otherwise
        nothing is taken and the caller waits. A `reader` token that is not the current one
        takes nothing (`superseded`)."""
        e = experiences.c
        with self.engine.begin() as conn:
            state = self._state(conn, "share")
            if reader is not None and reader != state.reader:
                return Taken(state, superseded=True)
            if min_version is not None:
                self._drop_stale(conn, min_version)
            ended = self.replay is not None and may_end(state)
            q = sa.select(e.id, e.uses).where(e.buffer == self.buffer, e.state == PENDING)
            if self.replay is None:
                q = q.order_by(e.id)
            else:
                self._drop_replay_stale(conn)
                if not ended:  # a draining read does not wait for cooldowns
                    q = q.where(sa.or_(e.ready_at.is_(None), e.ready_at <= time.time()))
                q = q.order_by(e.priority.desc().nulls_last(), e.id)
            taken = {
                int(r[0]): int(r[1])
                for r in conn.execute(q.limit(n).with_for_update(skip_locked=True))
            }
            ids = list(taken)
            if len(ids) < n:
                state.pending = len(ids)
                if not (ended or may_end(state)):
                    return Taken(state)  # the stale rows stay dropped
                if not ids:
                    return Taken(state, drained=True)
            insert = leases.insert().values(
                buffer=self.buffer, reader=state.reader, size=len(ids), state=OPEN
            )
            lease = int(conn.execute(insert.returning(leases.c.id)).scalar_one())
            conn.execute(_LEASE_ROWS, {"ids": ids, "lease": lease})
            got = dict(conn.execute(_PAYLOADS_OF, {"ids": ids}).all())
            if len(got) != len(ids):
                raise RuntimeError(f"{self.where()}: pending rows without their payload")
            if self.replay is not None and self.replay.reuses and not ended:
                self._copy_for_replay(conn, lease, ids, got)
        rows = []
        for i in ids:
            experience = Experience.from_stored(got[i])
            if self.replay is not None:
                experience.info["use_count"] = taken[i]
            rows.append((i, experience))
        return Taken(state, lease=lease, rows=rows)

    def _copy_for_replay(
        self, conn: sa.Connection, lease: int, ids: list[int], data: dict[int, bytes]
    ) -> None:
        """The replay copies of the rows `lease` took (each group the priority function puts
        back: one more use, ready after the cooldown), then the lowest-priority copies beyond
        `capacity` evicted."""
        assert self.replay is not None
        e = experiences.c
        cooldown = self.replay.reuse_cooldown_time or 0.0
        ready_at = time.time() + cooldown if cooldown > 0 else None
        source = conn.execute(
            sa.select(e.id, e.model_version, e.reward, e.group_key, e.uses)
            .where(e.id.in_(ids))
            .order_by(e.id)
        ).all()
        copies, copied = [], []
        for r in source:
            priority, put_back = self.replay.priority(r.model_version, r.uses + 1, r.group_key)
            if put_back:
                copied.append(r.id)
                copies.append(
                    {"buffer": self.buffer, "state": PENDING, "acks": 0, "reason": 0,
                     "model_version": r.model_version, "reward": r.reward,
                     "group_key": r.group_key, "uses": r.uses + 1, "priority": priority,
                     "ready_at": ready_at, "origin": lease}
                )  # fmt: skip
        if copies:
            new = _insert_rows(conn, copies)
            conn.execute(
                payloads.insert(),
                [{"id": i, "data": data[o]} for i, o in zip(new, copied, strict=True)],
            )
        self._evict(conn)

    def _evict(self, conn: sa.Connection) -> None:
        """Drop the lowest-priority replay copies while more than `capacity` rows are pending."""
        e = experiences.c
        pending = sa.select(sa.func.count()).where(e.buffer == self.buffer, e.state == PENDING)
        excess = int(conn.execute(pending).scalar_one()) - self.capacity
        if excess <= 0:
            return
        victims = [
            int(r[0])
            for r in conn.execute(
                sa.select(e.id)
                .where(e.buffer == self.buffer, e.state == PENDING, e.uses > 0)
                .order_by(e.priority, e.id.desc())
                .limit(excess)
                .with_for_update(skip_locked=True)
            )
        ]
        self._drop(conn, victims, EVICTED)

    def _drop_replay_stale(self, conn: sa.Connection) -> None:
        """Drop the pending copies more than `max_staleness` versions behind the newest row."""
        assert self.replay is not None
        if self.replay.max_staleness is None:
            return
        e = experiences.c
        newest = conn.execute(
            sa.select(sa.func.max(e.model_version)).where(e.buffer == self.buffer)
        ).scalar_one()
        if newest is None:
            return
        bound = int(newest) - self.replay.max_staleness
        stale = sa.select(e.id).where(
            e.buffer == self.buffer, e.state == PENDING, e.uses > 0, e.model_version < bound
        )
        self._drop(
            conn,
            [int(r[0]) for r in conn.execute(stale.with_for_update(skip_locked=True))],
            REPLAY_STALE,
        )

    def _drop(self, conn: sa.Connection, ids: list[int], reason: int) -> None:
        """Rows `ids` dropped for `reason` (their payloads deleted)."""
        if ids:
            e = experiences.c
            conn.execute(
                experiences.update().where(e.id.in_(ids)).values(state=DROPPED, reason=reason)
            )
            conn.execute(payloads.delete().where(payloads.c.id.in_(ids)))

    def _drop_stale(self, conn: sa.Connection, min_version: int) -> int:
        """Drop (for good) pending rows produced by weights older than `min_version`."""
        e = experiences.c
        stale = [
            int(r[0])
            for r in conn.execute(
                sa.select(e.id)
                .where(e.buffer == self.buffer, e.state == PENDING, e.model_version < min_version)
                .with_for_update(skip_locked=True)
            )
        ]
        self._drop(conn, stale, STALE)
        return len(stale)

    def give_back(self, lease: int) -> None:
        """Return an open lease's rows to pending: its read was cancelled before a caller got
        it (so nobody trains it)."""
        with self.engine.begin() as conn:
            self._state(conn, "share")
            self._return(conn, leases.c.id == lease)

    def _return(self, conn: sa.Connection, which: Any) -> int:
        """Open leases matching `which` returned: their rows pending again. Returns the rows."""
        back = [
            int(r[0])
            for r in conn.execute(
                sa.select(leases.c.id)
                .where(leases.c.buffer == self.buffer, leases.c.state == OPEN, which)
                .with_for_update()
            )
        ]
        if not back:
            return 0
        e = experiences.c
        # the replay copies their reads made go with them (those another open lease holds stay)
        copies = sa.select(e.id).where(
            e.origin.in_(back), sa.or_(e.state == PENDING, e.lease.in_(back))
        )
        gone = [int(r[0]) for r in conn.execute(copies)]
        if gone:
            conn.execute(payloads.delete().where(payloads.c.id.in_(gone)))
            conn.execute(experiences.delete().where(e.id.in_(gone)))
        moved = conn.execute(
            experiences.update()
            .where(e.lease.in_(back), e.state == LEASED)
            .values(state=PENDING, lease=None)
        ).rowcount  # the copies of copies deleted above are not counted: gone, not back
        conn.execute(leases.update().where(leases.c.id.in_(back)).values(state=RETURNED))
        return int(moved)

    # -- acks and restarts -------------------------------------------------------------------

    def ack(self, lease_ids: list[int]) -> None:
        """Mark every row of these open leases trained; KeyError naming any lease that is
        unknown here, acked already, or returned (its reader was superseded)."""
        with self.engine.begin() as conn:
            self._state(conn, "share")
            found = self._open_leases(conn, lease_ids)
            unknown = [i for i in lease_ids if i not in found]
            if unknown:
                raise KeyError(f"ack of unknown or already acked leases {unknown}")
            self._ack_rows(conn, sorted(found))

    def _open_leases(self, conn: sa.Connection, lease_ids: list[int] | tuple[int, ...]) -> set[int]:
        lc = leases.c
        q = sa.select(lc.id).where(lc.buffer == self.buffer, lc.id.in_(list(lease_ids)))
        return {int(r[0]) for r in conn.execute(q.where(lc.state == OPEN).with_for_update())}

    def _ack_rows(self, conn: sa.Connection, lease_ids: list[int]) -> None:
        if not lease_ids:
            return
        e = experiences.c
        conn.execute(
            experiences.update()
            .where(e.lease.in_(lease_ids), e.state == LEASED)
            .values(state=TRAINED, acks=e.acks + 1)
        )
        conn.execute(
            payloads.delete().where(
                payloads.c.id.in_(sa.select(e.id).where(e.lease.in_(lease_ids)))
            )
        )
        conn.execute(leases.update().where(leases.c.id.in_(lease_ids)).values(state=ACKED))

    def settle(self, settled: list[int] | tuple[int, ...], reopen: bool) -> None:
        """At open: ack the leases a resumed trainer's checkpoint trained (`settled`: those
        still open; acking again changes nothing); `reopen`: a continued run, the trainer's
        finish undone."""
        with self.engine.begin() as conn:
            self._state(conn, "update")
            self._ack_rows(conn, sorted(self._open_leases(conn, settled)))
            if reopen:
                self._set_flags(conn, finished=False, closed=False)

    def reader_started(self, settled: list[int] | tuple[int, ...]) -> tuple[int, int]:
        """A reader (the run's trainer) starts: `settled` leases acked, every other open lease
        returned, writing reopened if it had ended. Returns (its token, rows returned)."""
        with self.engine.begin() as conn:
            state = self._state(conn, "update")
            self._ack_rows(conn, sorted(self._open_leases(conn, settled)))
            returned = self._return(conn, sa.true())
            self._set_flags(conn, reader=state.reader + 1, closed=False, finished=False)
            return state.reader + 1, returned

    # -- writers and ending ------------------------------------------------------------------

    def register_writer(self, writer: str) -> int:
        """`writer` writes (again): a new token, its release undone. Returns the token."""
        w = writers.c
        with self.engine.begin() as conn:
            self._state(conn, "update")
            stmt = _insert(conn, writers).values(
                buffer=self.buffer, writer=writer, token=1, released=False
            )
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["buffer", "writer"],
                    set_={"token": writers.c.token + 1, "released": False},
                )
            )
            q = sa.select(w.token).where(w.buffer == self.buffer, w.writer == writer)
            return int(conn.execute(q).scalar_one())

    def release_writer(self, writer: str) -> BufferState:
        """`writer` is done; ValueError when it never registered. Returns the new state."""
        w = writers.c
        with self.engine.begin() as conn:
            self._state(conn, "update")
            done = conn.execute(
                writers.update()
                .where(w.buffer == self.buffer, w.writer == writer)
                .values(released=True)
            )
            if done.rowcount == 0:
                raise ValueError(f"writer {writer!r} was never registered with this buffer")
            return self._state(conn, None)

    def close(self) -> None:
        """Writing ends for good (until a reader starts again)."""
        with self.engine.begin() as conn:
            self._state(conn, "update")
            self._set_flags(conn, closed=True)

    def finish(self) -> int:
        """The trainer's budget is reached: writing ends, what is pending is dropped (counted).
        Returns how many experiences written were dropped (replay copies not counted)."""
        e = experiences.c
        with self.engine.begin() as conn:
            self._state(conn, "update")
            fresh = self._pending(conn)
            pending = sa.select(e.id).where(e.buffer == self.buffer, e.state == PENDING)
            conn.execute(payloads.delete().where(payloads.c.id.in_(pending)))
            conn.execute(
                experiences.update()
                .where(e.buffer == self.buffer, e.state == PENDING)
                .values(state=DROPPED, reason=FINISHED)
            )
            self._set_flags(conn, closed=True, finished=True)
            return fresh

    def counts(self) -> dict[str, int]:
        """written, trained, pending, leased, dropped, trained_twice (`counts`)."""
        with self.engine.begin() as conn:
            return counts(conn, self.buffer)


def counts(conn: sa.Connection, buffer: str) -> dict[str, int]:
    """A buffer's counts: written, trained, pending, leased, dropped, trained_twice of the
    experiences written; with replay also replayed (copies trained), replay_pending (waiting or
    leased), replay_dropped (copies never trained), of them replay_evicted (beyond capacity)
    and replay_stale (too stale); the rest went unread when the trainer finished."""
    e = experiences.c
    by: dict[tuple[int, bool, int], int] = {}
    for state, uses, reason, k in conn.execute(
        sa.select(e.state, e.uses, e.reason, sa.func.count())
        .where(e.buffer == buffer)
        .group_by(e.state, e.uses, e.reason)
    ):
        key = (int(state), int(uses) > 0, int(reason))
        by[key] = by.get(key, 0) + int(k)

    def n(state: int | None, copy: bool, reason: int | None = None) -> int:
        return sum(
            k for (s, c, r), k in by.items()
            if (state is None or s == state) and c == copy and (reason is None or r == reason)
        )  # fmt: skip

    twice = conn.execute(
        sa.select(sa.func.count()).where(e.buffer == buffer, e.acks > 1)
    ).scalar_one()
    out = {
        "written": n(None, False),
        "trained": n(TRAINED, False),
        "pending": n(PENDING, False),
        "leased": n(LEASED, False),
        "dropped": n(DROPPED, False),
        "trained_twice": int(twice),
    }
    if any(copy for _, copy, _ in by):
        out |= {
            "replayed": n(TRAINED, True),
            "replay_pending": n(PENDING, True) + n(LEASED, True),
            "replay_dropped": n(DROPPED, True),
            "replay_evicted": n(DROPPED, True, EVICTED),
            "replay_stale": n(DROPPED, True, REPLAY_STALE),
        }
    return out
