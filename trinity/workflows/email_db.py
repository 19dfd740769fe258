"""The local email database `email_search_workflow` searches: SQLite with a full-text index.

    create_email_db("emails.db", [Email(message_id="<1@x>", date="2001-05-03 10:00:00", ...)])
    search_emails("emails.db", inbox="jeff@enron.com", keywords=["merger"], sent_before="2001-05-04")
    read_email("emails.db", "<1@x>")

The layout is Trinity-RFT's (its `envs/email_searcher/prepare_data.py` builds it from the Enron
corpus, after ART-E): `emails(id, message_id, subject, from_address, date 'YYYY-MM-DD HH:MM:SS',
body, file_name)`, `recipients(email_id, recipient_address, recipient_type to|cc|bcc)` and an FTS5
index `emails_fts(subject, body)` kept in step by triggers, so a database built by Trinity-RFT's
script is read here unchanged. The database is opened read-only for searching.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MAX_RESULTS = 10

_SCHEMA = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT UNIQUE, subject TEXT,
    from_address TEXT, date TEXT, body TEXT, file_name TEXT
);
CREATE TABLE recipients (
    email_id INTEGER REFERENCES emails(id) ON DELETE CASCADE, recipient_address TEXT,
    recipient_type TEXT
);
CREATE INDEX idx_emails_from ON emails(from_address);
CREATE INDEX idx_emails_date ON emails(date);
CREATE INDEX idx_recipients_address_email ON recipients(recipient_address, email_id);
CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
CREATE TRIGGER emails_ai AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts (rowid, subject, body) VALUES (new.id, new.subject, new.body);
END;
"""


@dataclass
class Email:
    message_id: str
    date: str  # 'YYYY-MM-DD HH:MM:SS'
    subject: str | None = None
    from_address: str | None = None
    to_addresses: list[str] = field(default_factory=list)
    cc_addresses: list[str] = field(default_factory=list)
    bcc_addresses: list[str] = field(default_factory=list)
    body: str | None = None
    file_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def create_email_db(path: str | Path, emails: list[Email]) -> Path:
    """Write a new database at `path` holding `emails` (an existing file is refused)."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"create_email_db: {path} exists")
    with sqlite3.connect(path) as conn:
        conn.executescript(_SCHEMA)
        for e in emails:
            cur = conn.execute(
                "INSERT INTO emails (message_id, subject, from_address, date, body, file_name) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (e.message_id, e.subject, e.from_address, e.date, e.body, e.file_name),
            )
            kinds = (("to", e.to_addresses), ("cc", e.cc_addresses), ("bcc", e.bcc_addresses))
            conn.executemany(
                "INSERT INTO recipients (email_id, recipient_address, recipient_type) "
                "VALUES (?, ?, ?)",
                [(cur.lastrowid, a, kind) for kind, addrs in kinds for a in addrs],
            )
    conn.close()
    return path


def _connect(path: str | Path) -> sqlite3.Connection:
    if not Path(path).is_file():
        raise FileNotFoundError(f"email database not found: {path}")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def search_emails(
    path: str | Path,
    inbox: str,
    keywords: list[str],
    sent_before: str | None = None,
    max_results: int = MAX_RESULTS,
) -> list[dict[str, str]]:
    """Emails of `inbox` (sent by it, or to it as to/cc/bcc) holding every keyword in their
    subject or body, sent before the day `sent_before` ('YYYY-MM-DD'), newest first, at most
    `max_results` (<= 10): `[{message_id, snippet}]`, the snippet's matches in <b></b>.
    ValueError for no keywords or too many results asked."""
    if not keywords or not all(isinstance(k, str) and k for k in keywords):
        raise ValueError(f"keywords: a non-empty list of words, got {keywords!r}")
    if not 1 <= max_results <= MAX_RESULTS:
        raise ValueError(f"max_results must be in [1, {MAX_RESULTS}], got {max_results}")
    match = " ".join('"' + k.replace('"', '""') + '"' for k in keywords)  # FTS5: all of them
    where = [
        "emails_fts MATCH ?",
        "(e.from_address = ? OR EXISTS (SELECT 1 FROM recipients r WHERE "
        "r.recipient_address = ? AND r.email_id = e.id))",
    ]
    params: list[Any] = [match, inbox, inbox]
    if sent_before:
        where.append("e.date < ?")
        params.append(f"{sent_before} 00:00:00")
    sql = (
        "SELECT e.message_id, snippet(emails_fts, -1, '<b>', '</b>', ' ... ', 15) "
        "FROM emails e JOIN emails_fts ON e.id = emails_fts.rowid "
        f"WHERE {' AND '.join(where)} ORDER BY e.date DESC LIMIT ?"
    )
    conn = _connect(path)
    try:
        rows = conn.execute(sql, [*params, max_results]).fetchall()
    finally:
        conn.close()
    return [{"message_id": m, "snippet": s} for m, s in rows]


def read_email(path: str | Path, message_id: str) -> Email | None:
    """The email `message_id` with its recipients; None when there is none."""
    conn = _connect(path)
    try:
        row = conn.execute(
            "SELECT id, message_id, date, subject, from_address, body, file_name FROM emails "
            "WHERE message_id = ?",
            (message_id,),
        ).fetchone()
        if row is None:
            return None
        pk, mid, date, subject, sender, body, file_name = row
        recipients = conn.execute(
            "SELECT recipient_address, recipient_type FROM recipients WHERE email_id = ?", (pk,)
        ).fetchall()
    finally:
        conn.close()
    by_kind: dict[str, list[str]] = {"to": [], "cc": [], "bcc": []}
    for addr, kind in recipients:
        by_kind.setdefault(kind.lower(), []).append(addr)
    return Email(
        message_id=mid, date=date, subject=subject, from_address=sender,
        to_addresses=by_kind["to"], cc_addresses=by_kind["cc"], bcc_addresses=by_kind["bcc"],
        body=body, file_name=file_name,
    )  # fmt: skip
