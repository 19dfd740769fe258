"""The experience storages under test, one `Backend` each, for the shared contract suite
(`test_storage_contract.py`) and the crash trial.

    backend.open(capacity=3)   # a storage over the backend's database (the same one each call)
    backend.die(storage)       # its process dies: files and connections let go, nothing flushed
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import torch

from trinity.buffer.file_storage import FileStorage
from trinity.buffer.queue import QueueStorage
from trinity.buffer.sql import SQLStorage
from trinity.common.experience import EID, Experience

KINDS = ("memory", "queue", "sqlite", "postgres", "file", "parquet")
DURABLE = ("queue", "sqlite", "postgres", "file", "parquet")
FILES = ("file", "parquet")  # the `file` storage: a JSONL file, a folder of Parquet parts


def exp(i: int, version: int = 0) -> Experience:
    return Experience(
        tokens=torch.tensor([1, 2, 3, i]),
        prompt_length=3,
        logprobs=torch.tensor([-0.5]),
        reward=float(i),
        eid=EID(batch=i, task=0, run=0),
        model_version=version,
    )


@dataclass
class Backend:
    kind: str  # one of KINDS
    path: str | None  # the queue's log file, the sql storage's database, the JSONL file or the
    # Parquet folder

    @property
    def peers(self) -> bool:
        """Several storages over one database are peers (sql), not rivals (queue)."""
        return self.kind in ("sqlite", "postgres")

    def open(self, capacity: int = 10000, settled: list[int] = (), reopen: bool = False) -> Any:
        cls = SQLStorage if self.peers else FileStorage if self.kind in FILES else QueueStorage
        storage = cls(self.path, capacity, settled, reopen, "proj/run/exp")
        assert self.kind != "parquet" or Path(self.path).is_dir()  # parts, not a JSONL file
        return storage

    def die(self, storage: Any) -> None:
        if isinstance(storage, SQLStorage):
            storage.shutdown()
        elif storage.log is not None:
            storage.log.close()

    def rows(self, storage: Any) -> list[tuple[int, int, int, float, int]]:
        """(state, acks, model_version, reward, payload bytes) per row, in write order (a
        file's payload: its record, which the file keeps, as its JSON line's bytes)."""
        if isinstance(storage, FileStorage):
            rows = storage.log.conn.execute(
                "SELECT state, acks, model_version, reward, part, offset, length "
                "FROM experience_log JOIN file_line USING (id) ORDER BY id"
            ).fetchall()
            kept = storage.log.format.read([r[4:] for r in rows])
            return [(*r[:4], len(json.dumps(e.to_dict()))) for r, e in zip(rows, kept, strict=True)]
        if isinstance(storage, QueueStorage):
            return storage.log.conn.execute(
                "SELECT state, acks, model_version, reward, COALESCE(length(data), 0) "
                "FROM experience_log LEFT JOIN experience_payload USING (id) ORDER BY id"
            ).fetchall()
        from trinity.buffer.sql_schema import experiences, payloads

        e = experiences.c
        q = (
            sa.select(
                e.state, e.acks, e.model_version, e.reward,
                sa.func.coalesce(sa.func.length(payloads.c.data), 0),
            )
            .select_from(experiences.outerjoin(payloads, payloads.c.id == e.id))
            .order_by(e.id)
        )  # fmt: skip
        with storage.store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(q)]


def payloads_as_json_text(url: Any) -> None:
    """The database at `url` back to how schema version 2 kept payloads: `to_dict` JSON text in
    a text column (the version number is the caller's to set)."""
    from trinity.buffer.sql_schema import payloads

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        rows = conn.execute(sa.select(payloads.c.id, payloads.c.data)).all()
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ALTER TABLE trinity_payload ALTER COLUMN data TYPE TEXT USING ''")
        for i, data in rows:
            text = json.dumps(Experience.from_stored(data).to_dict())
            conn.execute(sa.text("UPDATE trinity_payload SET data = :d WHERE id = :i"),
                         {"d": text, "i": i})  # fmt: skip
    engine.dispose()


def fill(store: str | Path, experiences: list[Experience]) -> None:
    """A `file` storage's store written with `experiences` in one write, then closed."""

    async def main() -> None:
        q = FileStorage(str(store), 10000, [], False, "proj/run/exp")
        await q.write(experiences)
        q.log.close()

    asyncio.run(main())


def backend_for(kind: str, tmp_path: Path, request: Any) -> Backend:
    if kind == "memory":
        return Backend(kind, None)
    if kind == "queue":
        return Backend(kind, str(tmp_path / "b.db"))
    if kind in FILES:
        return Backend(kind, str(tmp_path / ("b.jsonl" if kind == "file" else "b.parquet")))
    if kind == "sqlite":
        return Backend(kind, str(tmp_path / "b.sqlite"))
    return Backend(kind, request.getfixturevalue("postgres_url"))
