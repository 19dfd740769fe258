"""Read-only views of an sql storage's database, for `trinity buffer stats` and run naming: what
is in it without creating, locking or changing anything (safe while a run writes).

    buffer_counts("postgresql://me@/trinity", prefix="proj/run/")   # {buffer name: counts}
    buffers_finished(path, prefix)                                   # {buffer name: finished?}
"""

from __future__ import annotations

import sqlalchemy as sa

from trinity.buffer.sql_schema import SCHEMA_VERSION, buffers, schema_version
from trinity.buffer.sql_store import counts
from trinity.buffer.sql_url import database_url, read_only_engine, shown


def _names(conn: sa.Connection, prefix: str) -> list[tuple[str, bool]]:
    b = buffers.c
    q = sa.select(b.buffer, b.finished).where(b.buffer.startswith(prefix, autoescape=True))
    return [(str(n), bool(f)) for n, f in conn.execute(q.order_by(b.buffer))]


def _readable(conn: sa.Connection, path: str) -> bool:
    """Whether the database holds our tables at our version (ValueError for another)."""
    found = schema_version(conn)
    if found is not None and found != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: trinity SQL storage schema version {found}, this trinity reads "
            f"version {SCHEMA_VERSION}"
        )
    return found is not None


def buffer_counts(path: str, prefix: str = "") -> dict[str, dict[str, int]]:
    """Counts (`SQLStorage.stats`) of every buffer in the database at `path` whose name begins
    with `prefix`; {} for a database without our tables. A database that cannot be opened
    raises (FileNotFoundError, or sqlalchemy's error naming it)."""
    engine = read_only_engine(path)
    try:
        with engine.connect() as conn:
            if not _readable(conn, shown(database_url(path))):
                return {}
            return {name: counts(conn, name) for name, _ in _names(conn, prefix)}
    finally:
        engine.dispose()


def buffers_finished(path: str, prefix: str) -> dict[str, bool]:
    """Whether each buffer whose name begins with `prefix` in the database at `path` was finished
    by its trainer; {} where there is none, or the database cannot be read (the storage, when
    the run opens it, says why)."""
    try:
        engine = read_only_engine(path)
    except (ValueError, FileNotFoundError):
        return {}
    try:
        with engine.connect() as conn:
            return dict(_names(conn, prefix)) if _readable(conn, path) else {}
    except (sa.exc.SQLAlchemyError, ValueError):
        return {}
    finally:
        engine.dispose()
