"""The counts `trinity buffer stats` prints: of a run's experience buffers (by its config), or of
one buffer store named by path or URL. Read-only: safe while a run writes.

    run_counts(cfg, run_dir)      # {"buffer/exp.db": {...}, "buffer/exp.sqlite proj/run/exp": {...}}
    store_counts("postgresql://me@/trinity")   # every sql buffer in that database

Counts per buffer: written, trained (acked after a checkpoint), pending (waiting to be read),
leased (read, not yet checkpointed), dropped (too stale, or written after the trainer's step
budget was reached), trained_twice (0 unless broken). A queue's log (a file storage's sidecar,
`<store>.state.db`, or the configured store) is keyed by its file (relative
to the run folder); an sql buffer by its database and its name in it (`storage.store_name`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from trinity.buffer.file_log import sidecar
from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import run_prefix

Counts = dict[str, dict[str, int]]


def _queue_counts(file: Path) -> dict[str, int]:
    log = SQLiteLog(file, read_only=True)
    try:
        return log.counts()
    finally:
        log.close()


def _sql_counts(path: str, where: str, prefix: str = "") -> Counts:
    from trinity.buffer.sql_inspect import buffer_counts

    return {f"{where} {name}": c for name, c in buffer_counts(path, prefix).items()}


def run_counts(cfg: Any, run_dir: Path) -> Counts:
    """The counts of every experience buffer of the run in `run_dir` (its queue logs, its sql
    SQLite files, and its buffers in a configured sql database)."""
    out: Counts = {}
    for file in sorted(run_dir.glob("**/buffer/*.db")):
        out[str(file.relative_to(run_dir))] = _queue_counts(file)
    prefix = run_prefix(run_dir)
    for file in sorted(run_dir.glob("**/buffer/*.sqlite")):
        out |= _sql_counts(str(file), str(file.relative_to(run_dir)), prefix)
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is not None and eb.storage_type == "file" and eb.path:  # a configured experience file
        state = sidecar(Path(eb.path).expanduser().resolve())
        inside = state.is_relative_to(run_dir.resolve()) and state.parent.name == "buffer"
        if state.is_file() and not inside:  # (one in a buffer folder of the run: found above)
            out[eb.path] = _queue_counts(state)
    if eb is not None and eb.storage_type == "sql" and eb.path:
        from trinity.buffer.sql_url import database_url, shown

        out |= _sql_counts(eb.path, shown(database_url(eb.path)), prefix)
    return out


def store_counts(target: str) -> Counts:
    """The counts of the buffers in one store: a queue's log file, a file storage's store (its
    JSONL file, Parquet or `datasets` folder), or an sql storage's SQLite file or database URL
    (every buffer in it). FileNotFoundError when a file is missing, ValueError for a file that
    is neither."""
    if "://" not in target:
        file = Path(target)
        if file.exists() and sidecar(file).is_file():  # a file storage's store (a JSONL file,
            return {str(file): _queue_counts(sidecar(file))}  # a folder): counts in its sidecar
        if not file.is_file():
            raise FileNotFoundError(f"no such file: {file}")
        if "experience_log" in _tables(file):
            return {str(file): _queue_counts(file)}
        if "trinity_meta" not in _tables(file):
            raise ValueError(f"{file} holds no experience buffer (neither a queue log nor sql)")
        return _sql_counts(target, str(file))
    from trinity.buffer.sql_url import database_url, shown

    return _sql_counts(target, shown(database_url(target)))


def _tables(file: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return {r[0] for r in rows}
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{file} is not a SQLite database ({e})") from None
    finally:
        conn.close()
