"""A file of experiences with its bookkeeping beside it: the `file` storage's log, one
implementation for every format (`record_format.py`: a .jsonl file, a .parquet folder of parts,
a `datasets` save folder read only).

    log = FileLog("run/buffer/experience_buffer.jsonl")  # state: ...jsonl.state.db beside it

The store holds the experiences, in write order, and is only ever added to, so any tool reads it
and an explore-only run's output is a plain data file (or folder). The state of every record
(pending, leased, trained, dropped, as `SQLiteLog`), the open leases, the writers' cursors (with
their step's report and task selector state) and `finished` live in a SQLite sidecar beside it,
`<store>.state.db`, with `SQLiteLog`'s tables plus `file_line` (each row's place in the store:
its `Locator`, part, offset and length) and keys of `buffer_state`: the format's own (how much
of the store is indexed), `writing_from`, set while a write is in flight, and `writers`, the
registered writers with their releases.

A write is durable before it returns, and atomic with its cursor:
  1. `writing_from` = the format's marker (committed);
  2. the format writes the records durably (JSONL: appended and fsynced; Parquet: a new part
     written under a temporary name, fsynced, renamed, the folder fsynced);
  3. one transaction adds their rows, the format's keys, moves the writer's cursor and clears
     `writing_from`.
A writer killed between 1 and 3 leaves `writing_from` set: the next open undoes that write and
says so (the write never returned, so its explorer writes that step again, after its unmoved
cursor). Records the sidecar does not know and no write was making (added by another tool, or a
store with no sidecar yet) are indexed as pending rows on open; a store that lost records the
sidecar knows is refused on open (the format says how each case looks in it).

Retention departs from the queue's: the store keeps every record (trained and dropped ones
too), so it grows with everything written; the sidecar's rows say what is trained.

One process at a time: the storage holds an exclusive lock on the store while open (a split
run's processes share that one storage as a Ray actor); a second opener is refused with a
message.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from trinity.buffer.record_format import Found, RecordFormat, format_for, sidecar
from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import Cursor
from trinity.common.experience import Experience

__all__ = ["FileLog", "sidecar"]

log = logging.getLogger(__name__)

_FILE_SCHEMA = """
CREATE TABLE IF NOT EXISTS file_line (
    id INTEGER PRIMARY KEY,
    part TEXT NOT NULL DEFAULT '',
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
"""


class FileLog(SQLiteLog):
    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        """Open the experience store at `path` (created when missing, when writable) and its
        sidecar: undo a write killed midway, index records added by others. `read_only`: the
        sidecar's counts only (`trinity buffer stats`)."""
        self.file = Path(path)
        self.notices: list[str] = []  # what opening found and did, in words (also logged)
        super().__init__(sidecar(self.file), read_only)
        if read_only:
            return
        try:
            self.format: RecordFormat = format_for(self.file)(self.file, self._say)
            self.conn.executescript(_FILE_SCHEMA)
            columns = [r[1] for r in self.conn.execute("PRAGMA table_info(file_line)")]
            if "part" not in columns:  # the sidecar of a JSONL file from before parts existed
                self.conn.execute("ALTER TABLE file_line ADD COLUMN part TEXT NOT NULL DEFAULT ''")
            try:
                fcntl.flock(self.format.open(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(
                    f"experience store {self.file} is open in another process (another run's "
                    "buffer over the same store?): a file storage is used by one process at a "
                    "time"
                ) from None
            known = {r[0] for r in self.conn.execute("SELECT DISTINCT part FROM file_line")}
            self.format.recover(self._keys().get("writing_from"), known)
            found = self.format.scan(self._keys(), known)
            if found.records or found.keys:
                self._commit(found, None)
            else:
                with self.conn:
                    self.conn.execute("DELETE FROM buffer_state WHERE key = 'writing_from'")
        except BaseException:
            self.close()  # the lock goes with it
            raise

    @property
    def torn(self) -> int:
        """Bytes of a torn last line the store ends with (JSONL only; 0 otherwise)."""
        return getattr(self.format, "torn", 0)

    def _keys(self) -> Mapping[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM buffer_state").fetchall())

    def _say(self, message: str) -> None:
        self.notices.append(message)
        log.warning(message)

    def _commit(self, found: Found, cursor: Cursor | None) -> list[int]:
        """One transaction: the rows, the format's keys, the cursor; no write in flight."""
        ids = []
        with self.conn:
            self.conn.execute("BEGIN")
            for (part, offset, length), e in found.records:
                cur = self.conn.execute(
                    "INSERT INTO experience_log (model_version, reward, payload) VALUES (?, ?, '')",
                    (e.model_version, e.reward),
                )
                ids.append(int(cur.lastrowid))
                self.conn.execute(
                    "INSERT INTO file_line (id, part, offset, length) VALUES (?, ?, ?, ?)",
                    (ids[-1], part, offset, length),
                )
            for key, value in found.keys.items():
                self.conn.execute(
                    "INSERT OR REPLACE INTO buffer_state (key, value) VALUES (?, ?)", (key, value)
                )
            self.conn.execute("DELETE FROM buffer_state WHERE key = 'writing_from'")
            if cursor is not None:
                self._move_cursor(cursor)
        return ids

    # -- the log's interface (`SQLiteLog`) ---------------------------------------------------

    def append(self, experiences: list[Experience], cursor: Cursor | None = None) -> list[int]:
        """Write the records durably, then their rows with the writer's cursor (module doc)."""
        keys = self._keys()
        marker = self.format.begin(keys)
        with self.conn:  # 1.
            self.conn.execute(
                "INSERT OR REPLACE INTO buffer_state (key, value) VALUES ('writing_from', ?)",
                (marker,),
            )
        found = self.format.write(experiences, keys, marker)  # 2.
        return self._commit(found, cursor)  # 3.

    def pending(self, after: int, limit: int) -> list[tuple[int, Experience]]:
        """Up to `limit` pending rows with ids above `after`, in write order, from the store."""
        rows = self.conn.execute(
            "SELECT e.id, f.part, f.offset, f.length FROM experience_log e JOIN file_line f "
            "ON f.id = e.id WHERE e.state = 0 AND e.id > ? ORDER BY e.id LIMIT ?",
            (after, limit),
        ).fetchall()
        experiences = self.format.read([(part, off, n) for _, part, off, n in rows])
        return [(int(row[0]), e) for row, e in zip(rows, experiences, strict=True)]

    def writers(self) -> dict[str, bool]:
        """The registered writers, each with whether it has released (`FileStorage`)."""
        row = self.conn.execute("SELECT value FROM buffer_state WHERE key = 'writers'").fetchone()
        return json.loads(row[0]) if row else {}

    def set_writers(self, writers: dict[str, bool]) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO buffer_state (key, value) VALUES ('writers', ?)",
                (json.dumps(writers),),
            )

    def close(self) -> None:
        if hasattr(self, "format"):
            self.format.close()
        super().close()
