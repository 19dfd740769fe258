"""A serve endpoint's sessions on disk: the ids it has seen, how each ended, and all it answered
200 for of the sessions it has not yet written, so a serve process started again continues
where the killed one stopped, as an explorer continues after its cursor.

    log = SessionLog(run_dir / "serve" / "explorer.db")
    lost = log.start(written_through=4)   # the buffer's cursor for this endpoint: serve step 4
    log.opened("ep-7"); log.feedback("k", "ep-7", 1.0); log.committed(Commit("ep-7", ...))
    log.writing(["ep-7"], step=5)          # then the buffer write of serve step 5, its cursor 5
    log.closed(["ep-7"], "trained")

On disk before the endpoint answers (`synchronous=FULL`, as the buffer's log: a row the agent
was answered for survives a power loss):
- every session seen (`opened`). A session's calls (their exact tokens) live in the process's
  memory until it is committed; a process started again marks the sessions its predecessor
  left open `lost` and answers their later calls, feedback and commit 410 (`FeedbackBook`),
  so the agent runs that episode again, instead of taking them as a new session's that would
  never train;
- every feedback taken (`feedback`: its key, session, target and reward), so a committed
  session keeps its rewards and a repeated key stays a duplicate;
- every commit (`committed`): the session's group and `group_size`, its calls and their ledger
  records, and its trajectories frozen as they will be written (`Commit.frozen`, the caller's
  JSON). A committed session waiting for its reward, or for the other members of its group,
  survives the kill: the process started again takes it up and writes it.

Exactly once. A serve step is `writing(ids, step)` (durable before the buffer write), the buffer
write carrying the endpoint's cursor `step` (one transaction there), then `closed(ids,
"trained")`. A kill can fall between any two; `start(written_through)` settles it by the cursor
the buffer holds: sessions of a step the buffer has are trained, those of a later step were not
written and are handed out again (`Commit.step`). One process at a time uses a file, the
endpoint's (the buffer's writer token makes any older process of its name stop), and it reads
the cursor after it registered, so no write of the dead process lands after it.

Ended sessions and the keys of their feedback are forgotten after the book's retention
(`forget`); a commit's rows leave with its session's end.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENDED = ("trained", "expired", "lost")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS serve_session (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS serve_feedback (
    key TEXT PRIMARY KEY, session_id TEXT NOT NULL, reward REAL NOT NULL,
    call_id TEXT, turn INTEGER, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_feedback_session ON serve_feedback(session_id);
CREATE INDEX IF NOT EXISTS idx_feedback_at ON serve_feedback(at);
CREATE INDEX IF NOT EXISTS idx_session_ended ON serve_session(state, at);
CREATE TABLE IF NOT EXISTS serve_commit (
    id TEXT PRIMARY KEY, grp TEXT, group_size INTEGER, calls TEXT NOT NULL,
    records TEXT NOT NULL, frozen TEXT NOT NULL, at REAL NOT NULL, step INTEGER
);
"""


@dataclass(frozen=True)
class Post:
    """A feedback the endpoint took: a reward for the session, its call `call_id` or `turn`."""

    key: str
    session_id: str
    reward: float
    call_id: str | None = None
    turn: int | None = None


@dataclass(frozen=True)
class Commit:
    """A committed session, as the endpoint answered its commit."""

    session_id: str
    group: str | None
    group_size: int | None
    calls: list[str]  # response ids, in answer order
    records: list[list[str]]  # each call's ledger records
    frozen: Any  # what is written of it (JSON-able; the caller's)
    at: float = 0.0  # epoch seconds of the commit
    step: int | None = None  # the serve step it is being written in (None: not handed out)


class SessionLog:
    """A serve endpoint's sessions on disk (module doc). One process at a time uses a file."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def start(self, written_through: int = 0) -> int:
        """Take up the file after an earlier process (one transaction): the sessions it left
        open are lost (their feedback goes with them), those it was writing in a serve step up
        to `written_through` (the buffer's cursor for this endpoint) are trained. Returns how
        many were lost."""
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            lost = self.db.execute(
                "UPDATE serve_session SET state = 'lost', at = ? WHERE state = 'open'", (now,)
            ).rowcount
            self.db.execute(
                "DELETE FROM serve_feedback WHERE session_id IN "
                "(SELECT id FROM serve_session WHERE state = 'lost')"
            )
            landed = "SELECT id FROM serve_commit WHERE step IS NOT NULL AND step <= ?"
            self.db.execute(
                f"UPDATE serve_session SET state = 'trained', at = ? WHERE id IN ({landed})",
                (now, written_through),
            )
            self.db.execute(f"DELETE FROM serve_commit WHERE id IN ({landed})", (written_through,))
        return lost

    def ended(self) -> dict[str, str]:
        """Every session that ended (trained, expired or lost), by id."""
        marks = ", ".join("?" * len(ENDED))
        rows = self.db.execute(
            f"SELECT id, state FROM serve_session WHERE state IN ({marks})", ENDED
        )
        return dict(rows.fetchall())

    def posts(self) -> list[Post]:
        """Every feedback kept (of sessions not lost), in the order it was taken."""
        rows = self.db.execute(
            "SELECT key, session_id, reward, call_id, turn FROM serve_feedback ORDER BY at, rowid"
        )
        return [Post(*row) for row in rows.fetchall()]

    def commits(self) -> list[Commit]:
        """The committed sessions not yet written nor expired, in commit order."""
        rows = self.db.execute(
            "SELECT id, grp, group_size, calls, records, frozen, at, step FROM serve_commit "
            "ORDER BY rowid"
        )
        return [
            Commit(sid, grp, size, json.loads(calls), json.loads(records), json.loads(frozen),
                   at, step)
            for sid, grp, size, calls, records, frozen, at, step in rows.fetchall()
        ]  # fmt: skip

    def opened(self, session_id: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO serve_session (id, state, at) VALUES (?, 'open', ?)",
                (session_id, time.time()),
            )

    def feedback(self, post: Post) -> None:
        """A feedback was taken (its session was `opened`)."""
        with self.db:
            self.db.execute(
                "INSERT INTO serve_feedback (key, session_id, reward, call_id, turn, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (post.key, post.session_id, post.reward, post.call_id, post.turn, time.time()),
            )

    def committed(self, c: Commit) -> None:
        """A session was committed (one transaction: it is no longer lost with a process)."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT INTO serve_commit (id, grp, group_size, calls, records, frozen, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (c.session_id, c.group, c.group_size, json.dumps(c.calls),
                 json.dumps(c.records), json.dumps(c.frozen), time.time()),
            )  # fmt: skip
            self.db.execute(
                "INSERT INTO serve_session (id, state, at) VALUES (?, 'committed', ?) "
                "ON CONFLICT(id) DO UPDATE SET state = excluded.state",
                (c.session_id, time.time()),
            )

    def writing(self, session_ids: list[str], step: int) -> None:
        """These committed sessions go to the buffer in serve step `step` (module doc)."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "UPDATE serve_commit SET step = ? WHERE id = ?", [(step, s) for s in session_ids]
            )

    def closed(self, session_ids: list[str], state: str) -> None:
        """`session_ids` ended as `state` (one transaction); their commits' rows go."""
        assert state in ENDED, state
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO serve_session (id, state, at) VALUES (?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET state = excluded.state, at = excluded.at",
                [(sid, state, now) for sid in session_ids],
            )
            self.db.executemany(
                "DELETE FROM serve_commit WHERE id = ?", [(s,) for s in session_ids]
            )

    def forget(self, before: float) -> None:
        """Drop the sessions that ended before `before` (epoch seconds), and the feedback taken
        before it but for a committed session still to be written."""
        marks = ", ".join("?" * len(ENDED))
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                f"DELETE FROM serve_session WHERE state IN ({marks}) AND at < ?", (*ENDED, before)
            )
            self.db.execute(
                "DELETE FROM serve_feedback WHERE at < ? AND session_id NOT IN "
                "(SELECT id FROM serve_commit)",
                (before,),
            )

    def close(self) -> None:
        self.db.close()
