"""SQLite log of experiences: what makes a storage durable and its hand-outs exactly-once.

Each written experience is one row with a state:

    pending --read--> leased --ack--> trained
       ^                 |
       +-- restart ------+            (a lease never acked is handed out again)
    pending/leased --stale--> dropped (produced by weights older than the reader accepts)

`acks` counts how often a row was acked: above 1 means it was trained twice (never, by design;
`trinity buffer stats` reports it so a user can check). On start-up the pending and leased rows,
in write order, are the storage's content.

Retention: the experience itself (nearly all of a row's bytes: `Experience.to_bytes`, or JSON
text in a log written before the blobs) lives in `experience_payload` and is deleted when its row
is trained or dropped; the `experience_log` row keeps its state, ack count, version and reward, so
counts and the exactly-once check stay exact. Payloads are deleted in write order, so whole pages
empty out and SQLite reuses them: the file stays near the size of the experiences not yet
trained instead of growing with every one ever written.

`buffer_state` says whether the run's trainer has finished (`finished`): its step budget was
reached, so nothing written afterwards can be trained. A buffer started again over the file (an
explore process run after the others ended) refuses writes instead of filling up with nobody to
read; a trainer started again (a continued run) reopens it.

`explorer_cursor` holds, per explorer, the last explore step written and how many tasks its
task stream had handed out by then, in the same transaction as that step's experiences: a
resumed explorer continues after exactly what the buffer holds. `explorer_report` holds, in that
transaction too, the step's metrics report: only the last step's is needed, since an explorer
reports step s before it writes step s + 1, so a step with a later one written was reported.

Durability: `synchronous=FULL` (WAL), so a transaction that returned is on disk, and survives a
power loss, not only a process crash. NORMAL would lose the last transactions on power loss:
a lease row the trainer then checkpointed (its id is in `buffer_leases.json`) would come back
pending with its lease id unknown, so the resumed buffer could not settle it and would train it
twice; a cursor would move back behind experiences the trainer already holds. The cost is one
fsync per transaction (one per explorer write, one per read, one per ack), measured by
`benchmarks/buffer_durability.py` (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from trinity.buffer.storage import Cursor
from trinity.common.experience import Experience

PENDING, LEASED, TRAINED, DROPPED = 0, 1, 2, 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experience_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model_version INTEGER NOT NULL,
    reward REAL,
    payload TEXT NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    lease INTEGER,
    acks INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_state ON experience_log(state, id);
CREATE INDEX IF NOT EXISTS idx_lease ON experience_log(lease);
CREATE TABLE IF NOT EXISTS experience_payload (
    id INTEGER PRIMARY KEY,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS explorer_cursor (
    explorer TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    tasks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS explorer_report (
    explorer TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    metrics TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS explorer_selector (
    explorer TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS buffer_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class SQLiteLog:
    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only:
            if not self.path.exists():
                raise FileNotFoundError(f"no experience log at {self.path}")
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")  # module docstring: durable before visible
        self.conn.executescript(_SCHEMA)

    def append(self, experiences: list[Experience], cursor: Cursor | None = None) -> list[int]:
        """Insert the rows and, in the same transaction, move the writer's cursor (and keep
        its step's metrics report)."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")  # the ids below stay ours until the commit
            first = self._next_id()
            ids = list(range(first, first + len(experiences)))
            self.conn.executemany(
                "INSERT INTO experience_log (id, model_version, reward, payload) "
                "VALUES (?, ?, ?, '')",
                [(i, e.model_version, e.reward) for i, e in zip(ids, experiences, strict=True)],
            )
            self.conn.executemany(
                "INSERT INTO experience_payload (id, data) VALUES (?, ?)",
                [(i, e.to_bytes()) for i, e in zip(ids, experiences, strict=True)],
            )
            if cursor is not None:
                self._move_cursor(cursor)
        return ids

    def _next_id(self) -> int:
        """The id the next row gets (AUTOINCREMENT: above every id ever given, deleted or not)."""
        row = self.conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'experience_log'"
        ).fetchone()
        return 1 + int(row[0] if row else 0)

    def _move_cursor(self, cursor: Cursor) -> None:
        """In the caller's transaction: the writer's cursor, its step's report and selector."""
        self.conn.execute(
            "INSERT OR REPLACE INTO explorer_cursor (explorer, step, tasks) VALUES (?, ?, ?)",
            (cursor.explorer, cursor.step, cursor.tasks),
        )
        if cursor.metrics is not None:
            self.conn.execute(
                "INSERT OR REPLACE INTO explorer_report (explorer, step, metrics) VALUES (?, ?, ?)",
                (cursor.explorer, cursor.step, json.dumps(cursor.metrics)),
            )
        if cursor.selector is not None:
            self.conn.execute(
                "INSERT OR REPLACE INTO explorer_selector (explorer, step, state) VALUES (?, ?, ?)",
                (cursor.explorer, cursor.step, json.dumps(cursor.selector)),
            )

    def cursor(self, explorer: str) -> Cursor | None:
        """The explorer's cursor with its step's report (None when that step had none)."""
        row = self.conn.execute(
            "SELECT c.step, c.tasks, r.metrics, s.state FROM explorer_cursor c "
            "LEFT JOIN explorer_report r ON r.explorer = c.explorer AND r.step = c.step "
            "LEFT JOIN explorer_selector s ON s.explorer = c.explorer AND s.step = c.step "
            "WHERE c.explorer = ?",
            (explorer,),
        ).fetchone()
        if row is None:
            return None
        metrics = json.loads(row[2]) if row[2] is not None else None
        selector = json.loads(row[3]) if row[3] is not None else None
        return Cursor(explorer, int(row[0]), int(row[1]), metrics, selector)

    def lease(self, ids: list[int], lease: int) -> None:
        self._set(ids, "state = 1, lease = ?", (lease,))

    def drop(self, ids: list[int]) -> None:
        self._set(ids, "state = 3", ())
        with self.conn:
            self.conn.executemany(
                "DELETE FROM experience_payload WHERE id = ?", [(i,) for i in ids]
            )

    def ack(self, leases: list[int]) -> int:
        """Mark every row of these leases trained. Returns how many rows.

        Only leased rows: acking a lease again (a checkpoint's record after its ack went
        through, `QueueStorage(settled=...)`) changes nothing.
        """
        if not leases:
            return 0
        with self.conn:
            self.conn.execute("BEGIN")
            cur = self.conn.executemany(
                "UPDATE experience_log SET state = 2, acks = acks + 1 WHERE lease = ? AND state = 1",
                [(i,) for i in leases],
            )
            count = int(cur.rowcount)
            self.conn.executemany(
                "DELETE FROM experience_payload WHERE id IN "
                "(SELECT id FROM experience_log WHERE lease = ?)",
                [(i,) for i in leases],
            )
        return count

    def drop_pending(self) -> int:
        """Mark every pending row dropped (the trainer finished: nobody will read them)."""
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute(
                "DELETE FROM experience_payload WHERE id IN "
                "(SELECT id FROM experience_log WHERE state = 0)"
            )
            cur = self.conn.execute("UPDATE experience_log SET state = 3 WHERE state = 0")
        return int(cur.rowcount)

    @staticmethod
    def run_finished(path: Path) -> bool:
        """Did the trainer of the log at `path` finish (False for a log without the flag)?"""
        try:
            log = SQLiteLog(path, read_only=True)
        except (FileNotFoundError, sqlite3.Error):
            return False
        try:
            return log.finished()
        except sqlite3.Error:  # a log written before the flag existed
            return False
        finally:
            log.close()

    def finished(self) -> bool:
        """Has the run's trainer finished (see the module doc)?"""
        row = self.conn.execute("SELECT value FROM buffer_state WHERE key = 'finished'").fetchone()
        return bool(row) and row[0] == "1"

    def set_finished(self, finished: bool) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO buffer_state (key, value) VALUES ('finished', ?)",
                ("1" if finished else "0",),
            )

    def recover(self) -> int:
        """Return unacked leases to pending. Returns how many rows are pending (`pending`)."""
        with self.conn:
            self.conn.execute("UPDATE experience_log SET state = 0, lease = NULL WHERE state = 1")
        return int(
            self.conn.execute("SELECT COUNT(*) FROM experience_log WHERE state = 0").fetchone()[0]
        )

    def pending(self, after: int, limit: int) -> list[tuple[int, Experience]]:
        """Up to `limit` pending rows with ids above `after`, in write order."""
        rows = self.conn.execute(
            "SELECT e.id, COALESCE(p.data, e.payload) FROM experience_log e "
            "LEFT JOIN experience_payload p ON p.id = e.id WHERE e.state = 0 AND e.id > ? "
            "ORDER BY e.id LIMIT ?",
            (after, limit),
        ).fetchall()
        return [(int(i), Experience.from_stored(p)) for i, p in rows]

    def max_lease(self) -> int:
        return int(
            self.conn.execute("SELECT COALESCE(MAX(lease), 0) FROM experience_log").fetchone()[0]
        )

    def counts(self) -> dict[str, int]:
        """written, trained, pending, leased, dropped, trained_twice."""
        by_state = dict(
            self.conn.execute(
                "SELECT state, COUNT(*) FROM experience_log GROUP BY state"
            ).fetchall()
        )
        twice = self.conn.execute("SELECT COUNT(*) FROM experience_log WHERE acks > 1").fetchone()
        return {
            "written": sum(by_state.values()),
            "trained": by_state.get(TRAINED, 0),
            "pending": by_state.get(PENDING, 0),
            "leased": by_state.get(LEASED, 0),
            "dropped": by_state.get(DROPPED, 0),
            "trained_twice": int(twice[0]),
        }

    def _set(self, ids: list[int], assignment: str, params: tuple) -> None:
        if not ids:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(
                f"UPDATE experience_log SET {assignment} WHERE id = ?",
                [(*params, i) for i in ids],
            )

    def close(self) -> None:
        self.conn.close()
