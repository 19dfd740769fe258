"""A JSONL file of experiences with its bookkeeping beside it: the `file` storage's log.

    log = FileLog("run/buffer/experience_buffer.jsonl")  # state: ...jsonl.state.db beside it

The file holds one experience per line, `Experience.to_dict` as JSON, in write order; it is only
ever appended to, so any tool reads it and an explore-only run's output is a plain data file. The
state of every line (pending, leased, trained, dropped, as `SQLiteLog`), the open leases, the
writers' cursors (with their step's report and task selector state) and `finished` live in a
SQLite sidecar, `<file>.state.db`, with `SQLiteLog`'s tables plus `file_line` (each row's byte
offset and length in the file) and keys of `buffer_state`: `indexed`, the byte offset up to
which the file's lines are rows (`lines`: how many lines that is), `writing_from`, set while a
write is in flight, and `writers`, the registered writers with their releases.

A write is durable before it returns, and atomic with its cursor:
  1. `writing_from` = the file's indexed end (committed);
  2. the lines are appended, flushed and fsynced;
  3. one transaction adds their rows, moves `indexed` past them, moves the writer's cursor and
     clears `writing_from`.
A writer killed between 1 and 3 leaves `writing_from` set: the next open truncates the file back
to it and says so (the write never returned, so its explorer writes that step again, after its
unmoved cursor). Lines past `indexed` with no write in flight were appended by someone else (a
file made by hand or another tool, or a file with no sidecar yet): they are indexed as pending
rows on open. A last line with no newline that does not parse as a JSON object is torn (a writer
of another tool killed mid-line): never read as data, reported on open, and truncated by the
next write here, which says so. (A JSON object cut short never parses, so a last line that does
parse is whole, only missing its newline.) A complete line that does not parse is an error
naming its line.

Retention departs from the queue's: the file keeps every line (trained and dropped ones too), so
it grows with everything written; the sidecar's rows say what is trained.

One process at a time: the storage holds an exclusive lock on the file while open (a split run's
processes share that one storage as a Ray actor); a second opener is refused with a message.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import Cursor
from trinity.common.experience import Experience

log = logging.getLogger(__name__)

SIDECAR = ".state.db"

_FILE_SCHEMA = """
CREATE TABLE IF NOT EXISTS file_line (
    id INTEGER PRIMARY KEY,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
"""


def parse_line(raw: bytes) -> Experience:
    """One line of an experience file. ValueError saying why it is not one; Trinity-RFT's
    experience JSONL (its `Experience.to_dict`: text, lengths and reward, no token ids or
    logprobs) is named as such: nothing in it can be trained on."""
    try:
        row = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    if "tokens" not in row and "response_length" in row:
        raise ValueError(
            "a line of Trinity-RFT's experience JSONL (text and lengths, no token ids or "
            "logprobs): it cannot be trained on; write rollouts with this trinity"
        )
    try:
        return Experience.from_dict(row)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not an experience (Experience.to_dict as JSON): {e!r}") from None


def sidecar(file: str | Path) -> Path:
    """The state database beside an experience file."""
    return Path(f"{file}{SIDECAR}")


class FileLog(SQLiteLog):
    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        """Open the experience file at `path` (created when missing) and its sidecar: roll back
        a write killed midway, index lines appended by others, detect a torn last line.
        `read_only`: the sidecar's counts only (`trinity buffer stats`)."""
        self.file = Path(path)
        self.notices: list[str] = []  # what opening found and did, in words (also logged)
        super().__init__(sidecar(self.file), read_only)
        if read_only:
            return
        self.conn.executescript(_FILE_SCHEMA)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.file, "ab")  # noqa: SIM115 - held open: the lock is on it
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            self.conn.close()
            raise RuntimeError(
                f"experience file {self.file} is open in another process (another run's buffer "
                "over the same file?): a file storage is used by one process at a time"
            ) from None
        try:
            self._rollback_unfinished_write()
            self.torn = self._index()
        except BaseException:
            self.close()  # the lock goes with it
            raise

    # -- the sidecar's keys ------------------------------------------------------------------

    def _key(self, key: str) -> int | None:
        row = self.conn.execute("SELECT value FROM buffer_state WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else None

    def _say(self, message: str) -> None:
        self.notices.append(message)
        log.warning(message)

    # -- opening -----------------------------------------------------------------------------

    def _rollback_unfinished_write(self) -> None:
        start = self._key("writing_from")
        if start is None:
            return
        size = self.file.stat().st_size
        if size > start:
            os.truncate(self.file, start)
            os.fsync(self._fh.fileno())
            self._say(
                f"{self.file}: a write killed before it returned left {size - start} bytes "
                f"after byte {start}: truncated (its explorer writes that step again)"
            )
        with self.conn:
            self.conn.execute("DELETE FROM buffer_state WHERE key = 'writing_from'")

    def _index(self) -> int:
        """Make rows of the lines past `indexed`; returns the bytes of a torn last line (0)."""
        start = self._key("indexed") or 0
        if (size := self.file.stat().st_size) < start:
            raise ValueError(
                f"experience file {self.file} has {size} bytes, its state {self.path} records "
                f"{start}: the file was replaced or cut by hand; move the state file away to "
                "read the file afresh (as new, pending experiences)"
            )
        with open(self.file, "rb") as f:
            f.seek(start)
            data = f.read()
        line_no = self._key("lines") or 0
        offset, rows = start, []
        for raw in data.split(b"\n")[:-1]:
            line_no += 1
            if raw.strip():
                rows.append((offset, len(raw), self._parse(raw, line_no)))
            offset += len(raw) + 1
        tail, torn = data[offset - start :], 0
        if tail.strip():
            try:
                rows.append((offset, len(tail), parse_line(tail)))
                line_no += 1
                offset += len(tail)  # whole, only missing its newline (module docstring)
            except ValueError:
                torn = len(tail)
                self._say(
                    f"{self.file}: torn last line ({torn} bytes at byte {offset}, line "
                    f"{line_no + 1}: a writer killed mid-line) is not read; the next write "
                    "truncates it"
                )
        if rows or offset != start:
            self._commit(rows, offset, line_no, None)
        return torn

    def _parse(self, raw: bytes, line_no: int) -> Experience:
        try:
            return parse_line(raw)
        except ValueError as e:
            raise ValueError(f"{self.file}:{line_no}: {e}") from None

    def _commit(
        self, rows: list[tuple[int, int, Experience]], end: int, lines: int, cursor: Cursor | None
    ) -> list[int]:
        """One transaction: the rows, the new indexed end, the cursor; no write in flight."""
        ids = []
        with self.conn:
            self.conn.execute("BEGIN")
            for offset, length, e in rows:
                cur = self.conn.execute(
                    "INSERT INTO experience_log (model_version, reward, payload) VALUES (?, ?, '')",
                    (e.model_version, e.reward),
                )
                ids.append(int(cur.lastrowid))
                self.conn.execute(
                    "INSERT INTO file_line (id, offset, length) VALUES (?, ?, ?)",
                    (ids[-1], offset, length),
                )
            for key, value in (("indexed", end), ("lines", lines)):
                self.conn.execute(
                    "INSERT OR REPLACE INTO buffer_state (key, value) VALUES (?, ?)",
                    (key, str(value)),
                )
            self.conn.execute("DELETE FROM buffer_state WHERE key = 'writing_from'")
            if cursor is not None:
                self._move_cursor(cursor)
        return ids

    # -- the log's interface (`SQLiteLog`) ---------------------------------------------------

    def append(self, experiences: list[Experience], cursor: Cursor | None = None) -> list[int]:
        """Append the lines durably, then their rows with the writer's cursor (module doc)."""
        end = self._key("indexed") or 0
        size = self.file.stat().st_size
        if size > end:
            os.truncate(self.file, end)
            self._say(f"{self.file}: truncated a torn last line ({size - end} bytes at byte {end})")
            self.torn = 0
        prefix = b""
        if end > 0:
            with open(self.file, "rb") as f:
                f.seek(end - 1)
                prefix = b"" if f.read(1) == b"\n" else b"\n"  # a last line without newline
        with self.conn:  # 1.
            self.conn.execute(
                "INSERT OR REPLACE INTO buffer_state (key, value) VALUES ('writing_from', ?)",
                (str(end),),
            )
        lines = [json.dumps(e.to_dict()).encode() for e in experiences]
        self._fh.write(prefix + b"".join(line + b"\n" for line in lines))  # 2.
        self._fh.flush()
        os.fsync(self._fh.fileno())
        offset, rows = end + len(prefix), []
        for line, e in zip(lines, experiences, strict=True):
            rows.append((offset, len(line), e))
            offset += len(line) + 1
        return self._commit(rows, offset, (self._key("lines") or 0) + len(lines), cursor)  # 3.

    def pending(self, after: int, limit: int) -> list[tuple[int, Experience]]:
        """Up to `limit` pending rows with ids above `after`, in write order, from the file."""
        rows = self.conn.execute(
            "SELECT e.id, f.offset, f.length FROM experience_log e JOIN file_line f "
            "ON f.id = e.id WHERE e.state = 0 AND e.id > ? ORDER BY e.id LIMIT ?",
            (after, limit),
        ).fetchall()
        out = []
        with open(self.file, "rb") as f:
            for i, offset, length in rows:
                f.seek(offset)
                out.append((int(i), Experience.from_dict(json.loads(f.read(length)))))
        return out

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
        if hasattr(self, "_fh"):
            self._fh.close()
        super().close()
