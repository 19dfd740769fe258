"""What `path` means for `storage_type: sql`: a SQLite file or a database URL, checked without I/O.

    database_url("runs/exp.sqlite")                          # sqlite:///<abs>/runs/exp.sqlite
    database_url("postgresql://me@/db?host=/run/pg&port=5433")  # postgresql+psycopg://...

A path without `://` is a SQLite file (made absolute: a storage actor's working folder is not
the driver's). `sqlite:///...` names a SQLite file too; `postgresql://` (or `postgres://`) names a
PostgreSQL database and is driven by psycopg 3 unless the URL names another driver. Anything else
(another database, an in-memory SQLite database that no other process sees and no restart finds,
a URL SQLAlchemy cannot parse) is refused by `url_problem`, which the config check calls, so a bad
URL fails at `trinity validate` with the key path rather than at the storage's first write. `read_only_engine` opens what a
path names for reading only (`trinity buffer stats`, a taskset read from a table).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL

BACKENDS = ("sqlite", "postgresql")


def database_url(path: str) -> URL:
    """The SQLAlchemy URL `path` names (see the module doc); raises ValueError naming the
    problem when it names none we run on."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in path:
        if not path.strip():
            raise ValueError("an empty path: name a SQLite file or a database URL")
        return make_url("sqlite://").set(database=str(Path(path).expanduser().absolute()))
    try:
        url = make_url(path)
    except (ArgumentError, ValueError) as e:
        raise ValueError(f"not a database URL SQLAlchemy can parse ({e})") from None
    backend = "postgresql" if url.get_backend_name() == "postgres" else url.get_backend_name()
    if backend not in BACKENDS:
        raise ValueError(
            f"database {backend!r} is not supported: sql storage runs on "
            "sqlite (a file or sqlite:///path) or postgresql (postgresql://user@host/db)"
        )
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError(
                "an in-memory SQLite database is neither shared nor kept across a restart: "
                "name a file (sqlite:///path/to/buffer.sqlite)"
            )
        return url.set(database=str(Path(url.database).expanduser().absolute()))
    if "+" not in url.drivername:  # our driver: psycopg 3 (SQLAlchemy's default is psycopg2)
        url = url.set(drivername="postgresql+psycopg")
    if not url.database:
        raise ValueError("a PostgreSQL URL needs a database name: postgresql://user@host/db")
    return url


def url_problem(path: str | None) -> str | None:
    """Why `path` names no database the sql storage runs on, or None (pure: no I/O)."""
    if path is None:
        return None  # the launcher's default: a SQLite file in the run folder
    try:
        database_url(path)
    except ValueError as e:
        return str(e)
    return None


def read_only_engine(path: str) -> Engine:
    """An engine on the database `path` names that never creates it: a SQLite file is opened
    read-only (FileNotFoundError when it does not exist); a PostgreSQL database as it is."""
    import sqlalchemy as sa

    url = database_url(path)
    if url.get_backend_name() != "sqlite":
        return sa.create_engine(url)
    file = Path(url.database or "")
    if not file.exists():
        raise FileNotFoundError(f"no SQLite database at {file}")
    return sa.create_engine(
        "sqlite://", creator=lambda: sqlite3.connect(f"file:{file}?mode=ro", uri=True)
    )


def shown(url: URL) -> str:
    """The URL as messages show it: the password hidden."""
    return url.render_as_string(hide_password=True)
