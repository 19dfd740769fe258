"""Read taskset rows from a SQL table (`storage_type: sql`): a SQLite file or a PostgreSQL URL.

    buffer.explorer_input.taskset:
      {name: math_tasks, storage_type: sql, path: postgresql://me@/trinity,
       format: {prompt_key: question, response_key: answer}}

The table is the storage's `name`, as in Trinity-RFT (its `SQLTaskStorage` keeps one table per
taskset, named after it). Two layouts are read:

- Trinity-RFT's task table: an `id` column (autoincrement) and `raw_task` (JSON), one task row
  as a JSON object per row. A row is that object; rows are read in `id` order, as Trinity-RFT's
  reader does.
- a plain table: each row's columns are the row's keys, read by the `format` keys as a file's
  (prompt_key, response_key, ...). Rows are read in primary-key order (without a primary key:
  ordered by every column, so the order is the same on every read).

A table with a `raw_task` column is taken as Trinity-RFT's. The database is opened read-only
(a SQLite file that does not exist is not created). A missing table, or a plain table without a
column the `format` keys name, raises `TasksetError` naming the table, the database and the
columns there; a bad row (a `raw_task` that is not a JSON object) is "table 'x' row id=N".
"""

from __future__ import annotations

from typing import Any

from trinity.tasks.files import TasksetError, _bad, json_object

TRINITY_RFT_COLUMN = "raw_task"


class NoTable(TasksetError):
    """The database has no table of the taskset's name (reported at its `name`)."""

    key = "name"


def read_sql_rows(
    path: str,
    table: str,
    required: dict[str, str] | None = None,
    bad_rows: list[str] | None = None,
) -> list[tuple[dict, str]]:
    """Every row of `table` in the database `path` as (row, where), in a stable order.

    Args:
        required: columns a plain table must have, each with the option that names it
            ({"question": "format.prompt_key"}); not checked for Trinity-RFT's layout, whose
            keys are inside each row's JSON (and checked per row by `load_taskset`).
        bad_rows: None = a bad row raises; a list = its message is appended, the row skipped.
    """
    import sqlalchemy as sa

    from trinity.buffer.sql_url import database_url, read_only_engine, shown

    try:
        where = shown(database_url(path))
        engine = read_only_engine(path)
    except (ValueError, FileNotFoundError) as e:
        raise TasksetError(f"taskset table {table!r}: {e}") from e
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
            if table not in names:
                raise NoTable(
                    f"database {where} has no table {table!r} (the taskset's `name` names its "
                    f"table); tables there: {sorted(names)}"
                )
            t = sa.Table(table, sa.MetaData(), autoload_with=conn)
            columns = [c.name for c in t.columns]
            if TRINITY_RFT_COLUMN in columns:
                return _trinity_rft_rows(conn, t, table, bad_rows)
            missing = {c: o for c, o in (required or {}).items() if c not in columns}
            if missing:
                named = ", ".join(f"{c!r} ({o})" for c, o in missing.items())
                raise TasksetError(
                    f"table {table!r} in {where} has no column {named}; its columns: {columns}"
                )
            order = list(t.primary_key.columns) or list(t.columns)
            rows = conn.execute(sa.select(t).order_by(*order)).mappings().all()
    except sa.exc.SQLAlchemyError as e:
        raise TasksetError(f"taskset table {table!r} in {where}: {e}") from e
    finally:
        engine.dispose()
    return [(dict(row), f"table {table!r} row {i}") for i, row in enumerate(rows)]


def _trinity_rft_rows(
    conn: Any, t: Any, table: str, bad_rows: list[str] | None
) -> list[tuple[dict, str]]:
    """Rows of Trinity-RFT's task table: each `raw_task` JSON object, in `id` order."""
    import sqlalchemy as sa

    order = [t.c.id] if "id" in t.c else (list(t.primary_key.columns) or list(t.columns))
    out = []
    for i, row in enumerate(conn.execute(sa.select(t).order_by(*order)).mappings()):
        loc = f"table {table!r} row " + (f"id={row['id']}" if "id" in row else str(i))
        raw = row[TRINITY_RFT_COLUMN]
        if isinstance(raw, str | bytes):  # a JSON column the database hands back as text
            raw = json_object(raw, loc, bad_rows, what="raw_task")
        elif not isinstance(raw, dict):
            _bad(f"{loc}: raw_task is a {type(raw).__name__}, expected a JSON object", bad_rows)
            raw = None
        if raw is not None:
            out.append((raw, loc))
    return out
