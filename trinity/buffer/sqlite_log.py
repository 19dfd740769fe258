"""Append-only SQLite log of experiences: what makes the queue survive a restart.

Each written experience is one row; a read marks rows consumed in the same transaction that hands
them out. On start-up the unconsumed rows, in write order, are the queue's content.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from trinity.common.experience import Experience

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model_version INTEGER NOT NULL,
    reward REAL,
    payload TEXT NOT NULL,
    consumed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_unconsumed ON experiences(consumed, id);
"""


class SQLiteLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)

    def append(self, experiences: list[Experience]) -> list[int]:
        rows = [(e.model_version, e.reward, json.dumps(e.to_dict())) for e in experiences]
        ids = []
        with self.conn:
            self.conn.execute("BEGIN")
            for row in rows:
                cur = self.conn.execute(
                    "INSERT INTO experiences (model_version, reward, payload) VALUES (?, ?, ?)", row
                )
                ids.append(int(cur.lastrowid))
        return ids

    def mark_consumed(self, ids: list[int]) -> None:
        if not ids:
            return
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.executemany(
                "UPDATE experiences SET consumed = 1 WHERE id = ?", [(i,) for i in ids]
            )

    def unconsumed(self) -> list[tuple[int, Experience]]:
        rows = self.conn.execute(
            "SELECT id, payload FROM experiences WHERE consumed = 0 ORDER BY id"
        ).fetchall()
        return [(int(i), Experience.from_dict(json.loads(p))) for i, p in rows]

    def count(self, consumed: bool | None = None) -> int:
        if consumed is None:
            return int(self.conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0])
        q = "SELECT COUNT(*) FROM experiences WHERE consumed = ?"
        return int(self.conn.execute(q, (int(consumed),)).fetchone()[0])

    def close(self) -> None:
        self.conn.close()
