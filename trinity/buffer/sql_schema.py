"""The tables of the `sql` experience storage, their version, and how a database is opened.

    engine = open_database(database_url(path))   # tables created when absent, version checked

One layout on SQLite and PostgreSQL (SQLAlchemy Core). Every table but `trinity_meta` is keyed by
`buffer`, the storage's name in its database (`<project>/<run>[/<stage>]/<buffer name>`, given by
the launcher), so one PostgreSQL database keeps the buffers of many runs apart, and a rerun under
a fresh name (`continue_from_checkpoint: false`) starts empty. The `trinity_` prefix keeps our
tables apart from a Trinity-RFT table (named after its buffer) in the same database.

- `trinity_meta(key, value)`: `schema_version`. A database of an older version is migrated at
  open (`MIGRATIONS`), one of a newer or unknown version refused, naming both versions; a
  database without our tables gets them.
- `trinity_buffer`: one row per buffer: the current reader's token (`reader_started`), `closed`
  (writing ended for good: `close` or `finish`), `finished` (the trainer's step budget was
  reached; a continued run's trainer reopens it).
- `trinity_experience`: one row per experience written, in write order (`id`), with its state
  (pending -> leased -> trained, or dropped: `sqlite_log.py` draws it, and why it was dropped),
  its lease, how often it was acked (above 1 = trained twice: never, by design), and the scalars
  counts and staleness use. With replay (`replay.py`) also its group, priority, use count, when
  it is ready, and for a replay copy the lease whose read made it (`origin`).
- `trinity_payload`: the experience itself (`Experience.to_bytes`: its tensors' raw bytes behind
  a JSON header; a database migrated from version 2 also holds `to_dict` JSON as UTF-8 bytes,
  read by `Experience.from_stored`), deleted when its row is trained or dropped (retention:
  counts stay exact, bytes go; deleted in write order, so whole SQLite pages empty out and are
  reused).
- `trinity_lease`: each lease handed out: its reader token and whether it is open, acked or
  returned (its reader was superseded), so an ack from any process is checked.
- `trinity_writer`: each registered writer, its token and whether it released the buffer: the
  closing rule (every registered writer released) holds across processes.
- `trinity_cursor`: each explorer's cursor, its step's metrics report and its adaptive task
  selector's state (`Cursor.selector`), written in the
  transaction of that step's experiences.

SQLite runs in WAL mode with `synchronous=FULL` (a committed transaction survives a power loss:
the reasoning of `sqlite_log.py`) and `BEGIN IMMEDIATE` (a transaction takes the write lock at
its start, so a read-then-write transaction never fails on an upgrade; other processes wait up
to `busy_timeout`). PostgreSQL keeps its defaults (READ COMMITTED, synchronous commit); the
storage locks what it changes (`sql_store.py`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from trinity.buffer.sql_url import shown

# 2: the replay columns of trinity_experience; 3: binary payloads (`MIGRATIONS`)
SCHEMA_VERSION = 3
BUSY_TIMEOUT_MS = 60_000  # how long a SQLite transaction waits for another process's

# lease states
OPEN, ACKED, RETURNED = 0, 1, 2
# why a row was dropped (`trinity_experience.reason`)
STALE, FINISHED, EVICTED, REPLAY_STALE = 1, 2, 3, 4

metadata = sa.MetaData()

meta = sa.Table(
    "trinity_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
buffers = sa.Table(
    "trinity_buffer",
    metadata,
    sa.Column("buffer", sa.String(512), primary_key=True),
    sa.Column("reader", sa.Integer, nullable=False, default=0),
    sa.Column("closed", sa.Boolean, nullable=False, default=False),
    sa.Column("finished", sa.Boolean, nullable=False, default=False),
)
experiences = sa.Table(
    "trinity_experience",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("buffer", sa.String(512), nullable=False),
    sa.Column("state", sa.SmallInteger, nullable=False, default=0),
    sa.Column("lease", sa.BigInteger, nullable=True),
    sa.Column("acks", sa.Integer, nullable=False, default=0),
    sa.Column("model_version", sa.Integer, nullable=False),
    sa.Column("reward", sa.Float, nullable=True),
    # version 2: replay
    sa.Column("reason", sa.SmallInteger, nullable=False, default=0),
    sa.Column("group_key", sa.String(256), nullable=True),
    sa.Column("uses", sa.Integer, nullable=False, default=0),
    sa.Column("priority", sa.Float, nullable=True),
    sa.Column("ready_at", sa.Float, nullable=True),
    sa.Column("origin", sa.BigInteger, nullable=True),
    sa.Index("trinity_experience_state", "buffer", "state", "id"),
    sa.Index("trinity_experience_origin", "origin"),
    sa.Index("trinity_experience_lease", "lease"),
    sqlite_autoincrement=True,  # ids never reused: write order survives deletes
)
payloads = sa.Table(
    "trinity_payload",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),  # version 3; before, JSON text
)
leases = sa.Table(
    "trinity_lease",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("buffer", sa.String(512), nullable=False),
    sa.Column("reader", sa.Integer, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("state", sa.SmallInteger, nullable=False, default=OPEN),
    sa.Index("trinity_lease_state", "buffer", "state"),
    sqlite_autoincrement=True,
)
writers = sa.Table(
    "trinity_writer",
    metadata,
    sa.Column("buffer", sa.String(512), primary_key=True),
    sa.Column("writer", sa.String(256), primary_key=True),
    sa.Column("token", sa.Integer, nullable=False),
    sa.Column("released", sa.Boolean, nullable=False, default=False),
)
cursors = sa.Table(
    "trinity_cursor",
    metadata,
    sa.Column("buffer", sa.String(512), primary_key=True),
    sa.Column("explorer", sa.String(256), primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("tasks", sa.Integer, nullable=False),
    sa.Column("metrics", sa.Text, nullable=True),  # JSON; None: that step had no report
    sa.Column("selector", sa.Text, nullable=True),  # JSON: an adaptive task selector's state
)


class SchemaVersionError(RuntimeError):
    """The database holds trinity tables of another schema version."""


def create_engine(url: URL) -> Engine:
    """An engine for `url`: on SQLite, WAL, FULL sync, BEGIN IMMEDIATE (module doc)."""
    if url.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True)
    from pathlib import Path

    Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def open_database(url: URL) -> Engine:
    """An engine on `url` whose tables exist at our schema version: created when the database
    has none, a SchemaVersionError naming both versions when it has another."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":  # two processes opening a new database
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7147740010)"))
            found = schema_version(conn)
            if found is None:
                metadata.create_all(conn)
                conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif found in MIGRATIONS:
                migrate(conn, found)
                found = SCHEMA_VERSION
    except sa.exc.OperationalError as e:
        engine.dispose()
        raise ConnectionError(f"sql storage: cannot open {shown(url)}: {e.orig}") from None
    if found not in (None, SCHEMA_VERSION):  # newer than us, or unknown
        engine.dispose()
        raise SchemaVersionError(
            f"{shown(url)} holds trinity SQL storage tables of schema version {found}; "
            f"this trinity reads and writes version {SCHEMA_VERSION}: use another database "
            "(or file), or the trinity version that wrote it"
        )
    return engine


# The statements that bring version k to k + 1; a statement is SQL for every dialect, or a
# dict of it per dialect (a dialect not named runs nothing).
# 1 -> 2: the replay columns (NOT NULL ones with their default, so old rows read as fresh
# experiences of a storage without replay).
# 2 -> 3: payloads binary; the JSON text already there kept as its UTF-8 bytes (SQLite types
# values, not columns: the CAST makes the stored values blobs, the declared type stays TEXT).
MIGRATIONS: dict[int, list[str | dict[str, str]]] = {
    1: [
        "ALTER TABLE trinity_experience ADD COLUMN reason SMALLINT NOT NULL DEFAULT 0",
        "ALTER TABLE trinity_experience ADD COLUMN group_key VARCHAR(256)",
        "ALTER TABLE trinity_experience ADD COLUMN uses INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE trinity_experience ADD COLUMN priority FLOAT",
        "ALTER TABLE trinity_experience ADD COLUMN ready_at FLOAT",
        "ALTER TABLE trinity_experience ADD COLUMN origin BIGINT",
        "CREATE INDEX trinity_experience_origin ON trinity_experience (origin)",
    ],
    2: [
        {
            "postgresql": "ALTER TABLE trinity_payload ALTER COLUMN data TYPE BYTEA "
            "USING convert_to(data, 'UTF8')",
            "sqlite": "UPDATE trinity_payload SET data = CAST(data AS BLOB)",
        }
    ],
}


def migrate(conn: sa.Connection, found: int) -> None:
    """Bring a database of schema version `found` to SCHEMA_VERSION, in the open's transaction
    (on SQLite and PostgreSQL alike, DDL is transactional: a failed migration changes nothing)."""
    for version in range(found, SCHEMA_VERSION):
        for statement in MIGRATIONS[version]:
            if isinstance(statement, dict):
                statement = statement.get(conn.dialect.name, "")
            if statement:
                conn.exec_driver_sql(statement)
    conn.execute(
        meta.update().where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
    )


def schema_version(conn: sa.Connection) -> int | None:
    """The schema version of the database `conn` is on; None when it has no trinity tables."""
    if not sa.inspect(conn).has_table(meta.name):
        return None
    row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
    return int(row[0]) if row is not None else 0
