"""Which sessions a serve endpoint has seen and how each ended, kept on disk across restarts.

    log = SessionLog(run_dir / "serve" / "explorer.db")
    lost = log.start()            # sessions a killed process of this endpoint left open
    log.opened("ep-7"); log.closed(["ep-7"], "trained")

A session's calls live in the serve process's memory (their exact tokens, in its ledger) until
the session is committed, rewarded and written to the buffer. A serve process killed and started
again has lost them; without this log it would take the session's later `/feedback` and
`/commit` as a new session's, answer 200, and never train anything of it. With it, the process
knows the id belonged to the one before it and answers 410 (`FeedbackBook`), so the agent knows
to run that episode again; late feedback for a session written or expired before the restart is
a 410 as well, instead of starting an empty session.

Rows are written when a session is first seen and when it ends (`synchronous=FULL`, as the
buffer's log: a row the agent was answered for survives a power loss), and forgotten after the
book's retention (`forget`).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

ENDED = ("trained", "expired", "lost")


class SessionLog:
    """A serve endpoint's sessions on disk (module doc). One process at a time uses a file:
    the endpoint's (the buffer's writer token makes any older process of its name stop)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS serve_session ("
            "id TEXT PRIMARY KEY, state TEXT NOT NULL, at REAL NOT NULL)"
        )

    def start(self) -> int:
        """Mark the sessions an earlier process left open as lost; how many there were."""
        with self.db:
            cur = self.db.execute(
                "UPDATE serve_session SET state = 'lost', at = ? WHERE state = 'open'",
                (time.time(),),
            )
        return cur.rowcount

    def ended(self) -> dict[str, str]:
        """Every session that ended (trained, expired or lost), by id."""
        rows = self.db.execute("SELECT id, state FROM serve_session WHERE state != 'open'")
        return dict(rows.fetchall())

    def opened(self, session_id: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO serve_session (id, state, at) VALUES (?, 'open', ?)",
                (session_id, time.time()),
            )

    def closed(self, session_ids: list[str], state: str) -> None:
        """`session_ids` ended as `state` (one transaction)."""
        assert state in ENDED, state
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT INTO serve_session (id, state, at) VALUES (?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET state = excluded.state, at = excluded.at",
                [(sid, state, now) for sid in session_ids],
            )

    def forget(self, before: float) -> None:
        """Drop the ended sessions recorded before `before` (epoch seconds)."""
        with self.db:
            self.db.execute("DELETE FROM serve_session WHERE state != 'open' AND at < ?", (before,))

    def close(self) -> None:
        self.db.close()
