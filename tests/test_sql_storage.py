"""What is the `sql` storage's own, beyond the shared contract (`test_storage_contract.py`): what
`path` may name, the schema version, several readers taking rows at once, buffers apart in one
database, peers that do not take each other's leases, and reading Trinity-RFT's tables."""

from __future__ import annotations

import asyncio
import json
import pickle
import struct
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
import torch
from safetensors.torch import save as safetensors_save
from storages import exp, payloads_as_json_text

from trinity.buffer.sql import SQLStorage
from trinity.buffer.sql_schema import SCHEMA_VERSION, SchemaVersionError, meta, payloads
from trinity.buffer.sql_url import database_url, shown, url_problem
from trinity.buffer.storage import BufferClosed
from trinity.buffer.trinity_rft_sql import read_trinity_rft_table
from trinity.common.experience import ExperienceKind


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "b.sqlite")
    return request.getfixturevalue("postgres_url")


def test_sql_is_a_registered_experience_storage(tmp_path):
    from trinity.buffer.storage import ExperienceStorage, storage_class

    assert storage_class("sql") is SQLStorage
    assert isinstance(SQLStorage(str(tmp_path / "b.sqlite")), ExperienceStorage)


def test_path_names_a_sqlite_file_or_a_database_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert database_url("runs/b.sqlite").database == str(tmp_path / "runs/b.sqlite")  # absolute
    assert database_url("sqlite:///b.sqlite").database == str(tmp_path / "b.sqlite")
    pg = database_url("postgresql://me@/trinity?host=/run/pg&port=5433")
    assert pg.drivername == "postgresql+psycopg"  # psycopg 3, not SQLAlchemy's psycopg2
    assert dict(pg.query) == {"host": "/run/pg", "port": "5433"}
    assert database_url("postgres://me@db.local/t").drivername == "postgresql+psycopg"
    assert url_problem(None) is None  # the default: a file in the run folder
    assert "'mysql' is not supported" in url_problem("mysql://me@host/db")
    assert "in-memory SQLite" in url_problem("sqlite://")
    assert "can parse" in url_problem("postgresql://me@host:port/db")
    assert "database name" in url_problem("postgresql://me@host")


def test_a_database_that_cannot_be_reached_is_named_its_password_hidden(tmp_path):
    url = f"postgresql://me:secret@/trinity?host={tmp_path}&port=1"  # no server there
    with pytest.raises(ConnectionError, match=r"cannot open postgresql\+psycopg://me:\*\*\*@/"):
        SQLStorage(url)
    # the launcher's location: a relative file made absolute where the driver runs
    assert SQLStorage.location("b.sqlite", tmp_path, "exp").startswith("sqlite:////")
    assert SQLStorage.location(None, tmp_path, "exp") == f"sqlite:///{tmp_path}/buffer/exp.sqlite"


def test_a_database_of_another_schema_version_is_refused_naming_both(db):
    SQLStorage(db).shutdown()  # creates the tables at our version
    engine = sa.create_engine(database_url(db))
    with engine.begin() as conn:
        conn.execute(meta.update().values(value="99"))
    engine.dispose()
    with pytest.raises(
        SchemaVersionError, match=rf"version 99.*reads and writes version {SCHEMA_VERSION}"
    ):
        SQLStorage(db)


def test_a_version_2_database_keeps_its_json_payloads_and_new_ones_are_blobs(db):
    """Schema 3 stores `Experience.to_bytes`; a version-2 database (payloads as JSON text) is
    migrated at open: its rows read back exactly, and rows written after are blobs."""

    async def main():
        s = SQLStorage(db, name="p/r/exp")
        await s.write([exp(0), exp(1)])
        s.shutdown()
        url = database_url(db)
        payloads_as_json_text(url)
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(meta.update().values(value="2"))
        engine.dispose()
        s = SQLStorage(db, name="p/r/exp")
        await s.write([exp(2)])
        with s.store.engine.connect() as conn:
            q = sa.select(payloads.c.id, payloads.c.data).order_by(payloads.c.id)
            stored = dict(conn.execute(q).all())
            version = conn.execute(sa.select(meta.c.value)).scalar_one()
        assert version == str(SCHEMA_VERSION) == "3"
        assert [bytes(d)[:1] for d in stored.values()] == [b"{", b"{", b"T"]  # JSON, JSON, TEX2
        got = (await s.read(3)).experiences
        for e, want in zip(got, [exp(0), exp(1), exp(2)], strict=True):
            assert e.tokens.tolist() == want.tokens.tolist() and e.reward == want.reward
            assert e.logprobs.tolist() == want.logprobs.tolist()
        s.shutdown()

    asyncio.run(main())


def test_two_readers_take_different_rows_each_in_write_order(db):
    """Two readers, each a storage of its own over one database (SKIP LOCKED on PostgreSQL,
    BEGIN IMMEDIATE on SQLite), read batches while a writer writes: every row once."""

    async def main():
        writer, readers = SQLStorage(db), [SQLStorage(db), SQLStorage(db)]
        await writer.register_writer("w")

        async def write():
            for s in range(30):
                await writer.write([exp(s * 10 + k) for k in range(10)])
            await writer.release_writer("w")

        async def read(q: SQLStorage) -> list[float]:
            got: list[float] = []
            while True:
                try:
                    lease = await q.read(7, timeout=20)
                except BufferClosed:
                    return got
                got += [e.reward for e in lease.experiences]
                await q.ack([lease.id])

        _, a, b = await asyncio.gather(write(), read(readers[0]), read(readers[1]))
        assert a == sorted(a) and b == sorted(b)  # each in write order
        assert sorted(a + b) == [float(i) for i in range(300)]  # every row once
        assert (await writer.stats())["trained"] == 300

    asyncio.run(main())


def test_buffers_of_one_database_are_apart_and_peers_keep_their_leases(db):
    async def main():
        a = SQLStorage(db, name="proj/run1/exp")
        other = SQLStorage(db, name="proj/run2/exp")  # a rerun under a fresh name
        await a.write([exp(0), exp(1), exp(2)])
        assert (await other.stats())["written"] == 0
        with pytest.raises(TimeoutError):
            await other.read(1, timeout=0.05)
        lease = await a.read(2)
        peer = SQLStorage(db, name="proj/run1/exp")  # another process opens the same buffer
        assert (await peer.stats())["leased"] == 2  # a's reader still holds its lease
        assert [e.reward for e in (await peer.read(1, timeout=1)).experiences] == [2.0]
        await a.ack([lease.id])
        assert (await peer.stats())["trained"] == 2

    asyncio.run(main())


def test_a_read_cancelled_by_its_caller_gives_its_lease_back(db):
    async def main():
        q = SQLStorage(db)
        await q.write([exp(0), exp(1)])
        take = q.store.take

        def slow_take(*args):  # the caller gives up while the transaction runs
            time.sleep(0.2)
            return take(*args)

        q.store.take = slow_take
        reader = asyncio.create_task(q.read(2, timeout=5))
        await asyncio.sleep(0.05)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        q.store.take = take
        got = await q.read(2, timeout=1)  # polls until the given-back rows are pending again
        assert [e.reward for e in got.experiences] == [0.0, 1.0]
        assert (await q.stats())["leased"] == 2  # this lease only: the first was given back

    asyncio.run(main())


# -- Trinity-RFT's tables ------------------------------------------------------------------------


def trxp(items: list[dict], tensors: dict[str, torch.Tensor]) -> bytes:
    """`experience_bytes` as Trinity-RFT writes it (trinity_rft_sql's module doc)."""
    metadata = pickle.dumps({"version": 1, "num_items": len(items), "items": items})
    blob = safetensors_save(tensors)
    return b"TRXP" + struct.pack("<BQQ", 1, len(metadata), len(blob)) + metadata + blob


def rft_table(name: str, schema_type: str) -> tuple[sa.MetaData, sa.Table]:
    """A table in Trinity-RFT's layout for `schema_type`."""
    md = sa.MetaData()
    cols = {
        "experience": [
            sa.Column("timestamp", sa.DateTime, server_default=sa.func.now()),
            sa.Column("task_id", sa.String(64)), sa.Column("run_id", sa.Integer),
            sa.Column("msg_id", sa.String(64)), sa.Column("model_version", sa.Integer),
            sa.Column("experience_bytes", sa.LargeBinary), sa.Column("reward", sa.Float),
            sa.Column("consumed", sa.Integer, default=0),
        ],
        "sft": [sa.Column("message_list", sa.JSON), sa.Column("experience_bytes", sa.LargeBinary)],
        "dpo": [
            sa.Column("chosen_message_list", sa.JSON), sa.Column("rejected_message_list", sa.JSON),
            sa.Column("experience_bytes", sa.LargeBinary),
        ],
    }[schema_type]  # fmt: skip
    return md, sa.Table(name, md, sa.Column("id", sa.Integer, primary_key=True), *cols)


def test_experiences_are_read_from_a_table_in_trinity_rft_s_layout(db):
    engine = sa.create_engine(database_url(db))
    md, table = rft_table("exp_buffer", "experience")
    md.create_all(engine)
    item = {
        "eid": {"batch": 3, "task": "7", "run": 1, "step": 0, "suffix": "a1b2c3"},
        "reward": 0.0, "truncate_status": None, "info": {"k": "v"}, "metrics": {"m": 1.0},
        "prompt_length": 2, "response_text": "42", "prompt_text": "6*7=",
        "messages": None, "tools": None, "chosen_messages": None, "rejected_messages": None,
        "custom_fields": [], "multi_modal_input_keys": [],
    }  # fmt: skip
    single = {
        "0:tokens": torch.tensor([5, 6, 7, 8], dtype=torch.int32),
        "0:logprobs": torch.tensor([-0.5, -0.25]),
        "0:action_mask": torch.ones(2, dtype=torch.bool),
    }
    multi = {
        "0:tokens": torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32),
        "0:logprobs": torch.tensor([-0.5, 0.0, -0.25]),
        "0:action_mask": torch.tensor([True, False, True]),
    }
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [
                {"task_id": "7", "run_id": 1, "msg_id": "a1b2c3", "model_version": 4,
                 "reward": 1.0, "experience_bytes": trxp([item], single)},
                {"task_id": "x9", "run_id": 0, "msg_id": "d4", "model_version": 5,
                 "reward": 0.5, "experience_bytes": trxp(
                     [{**item, "eid": {**item["eid"], "task": "x9"}}], multi)},
                {"task_id": "7", "run_id": 2, "msg_id": "e5", "model_version": 6,
                 "reward": 0.0, "experience_bytes": pickle.dumps({"an": "old row"})},
            ],
        )  # fmt: skip
    engine.dispose()
    got = read_trinity_rft_table(db, "exp_buffer", "experience", limit=2)
    a, b = got
    assert a.tokens.tolist() == [5, 6, 7, 8] and a.prompt_length == 2
    assert a.logprobs.tolist() == [-0.5, -0.25] and a.action_mask.tolist() == [True, True]
    assert (a.reward, a.model_version) == (1.0, 4)  # the row's columns
    assert (a.eid.batch, a.eid.task, a.eid.run, a.eid.suffix) == (3, 7, 1, "")
    assert a.info == {"k": "v", "msg_id": "a1b2c3"} and a.metrics == {"m": 1.0}
    assert a.kind == ExperienceKind.SINGLE_TURN and a.response_text == "42"
    assert b.kind == ExperienceKind.MULTI_TURN and b.action_mask.tolist() == [True, False, True]
    assert b.info["trinity_rft_task"] == "x9" and b.eid.task != 0  # a text id: a stable number
    assert read_trinity_rft_table(db, "exp_buffer", after=1, limit=1)[0].reward == 0.5
    with pytest.raises(ValueError, match="exp_buffer row 3: not Trinity-RFT's TRXP"):
        read_trinity_rft_table(db, "exp_buffer", after=2)


def test_sft_and_dpo_rows_from_trinity_rft_s_tables(db):
    engine = sa.create_engine(database_url(db))
    md_sft, sft = rft_table("sft_data", "sft")
    md_dpo, dpo = rft_table("dpo_data", "dpo")
    md_sft.create_all(engine)
    md_dpo.create_all(engine)
    item = {"eid": {}, "prompt_length": 3, "info": {}, "metrics": {}}
    with engine.begin() as conn:
        conn.execute(sft.insert().values(
            message_list=[{"role": "user", "content": "hi"}],
            experience_bytes=trxp([item], {"0:tokens": torch.tensor([1, 2, 3, 4, 5])}),
        ))  # fmt: skip
        pair = {
            "0:tokens": torch.tensor([1, 2, 3]),
            "0:chosen": torch.tensor([7, 8]),
            "0:rejected": torch.tensor([9]),
        }
        conn.execute(dpo.insert().values(experience_bytes=trxp([item], pair)))
    engine.dispose()
    (s,) = read_trinity_rft_table(db, "sft_data", "sft")
    assert s.kind == ExperienceKind.SFT and s.response_length == 2
    chosen, rejected = read_trinity_rft_table(db, "dpo_data", "dpo")
    assert chosen.tokens.tolist() == [1, 2, 3, 7, 8] and rejected.tokens.tolist() == [1, 2, 3, 9]
    assert chosen.prompt_length == rejected.prompt_length == 3
    assert chosen.kind == rejected.kind == ExperienceKind.DPO
    assert (chosen.eid.task, chosen.eid.run, rejected.eid.run) == (1, 0, 1)


def test_the_config_takes_sql_for_the_experience_buffer_and_checks_its_url(tmp_path):
    from trinity.config import ConfigError, load_config
    from trinity.config.run_folder import trains_from_queue
    from trinity.config.support import not_built_problems

    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {model_path: m}\n"
        "buffer: {explorer_input: {taskset: {path: data/x}},\n"
        "  trainer_input: {experience_buffer: {name: exp, storage_type: sql}}}\n"
    )
    cfg = load_config(path)  # no path: a SQLite file in the run folder
    assert cfg.buffer.trainer_input.experience_buffer.storage_type == "sql"
    url = "postgresql://me@/trinity?host=/run/pg&port=5433"
    train = load_config(path, [f"buffer.trainer_input.experience_buffer.path={url}", "mode=train"])
    assert trains_from_queue(train)  # mode train reads what explore processes write
    with pytest.raises(ConfigError) as info:
        load_config(path, ["buffer.trainer_input.experience_buffer.path=mysql://me@h/db"])
    (problem,) = info.value.problems
    assert problem.path == "buffer.trainer_input.experience_buffer.path"
    assert "storage_type sql: database 'mysql' is not supported" in problem.message
    assert not_built_problems(cfg) == []  # refused until now: "SQL experience storage"
    taskset = load_config(path, ["buffer.explorer_input.taskset.storage_type=queue"])
    (refused,) = not_built_problems(taskset)  # tasksets from SQL: tests/test_sql_tasksets.py
    assert "tasksets from a queue" in refused.message


@pytest.mark.slow  # two whole runs (about 12-20 s on 2 cores)
@pytest.mark.parametrize("where", [pytest.param("sqlite", marks=pytest.mark.long), "postgres"])
def test_a_grpo_run_trains_from_sql_storage(tmp_path, tiny_model_dir, request, where):
    """`trinity run` (mode both, GRPO, 3 steps) with `storage_type: sql`: with no path the buffer
    is a SQLite file in the run folder, with a PostgreSQL URL rows of that database; every
    experience written is trained once, and `trinity buffer stats` reads the buffer by the
    config and by its file or URL."""
    from test_e2e import buffer_counts, grpo_config, run_trinity

    config = grpo_config(tmp_path, tiny_model_dir)
    text = config.read_text().replace("storage_type: queue", "storage_type: sql")
    store = str(tmp_path / "ckpt/e2e/grpo/buffer/exp.sqlite")
    key = "buffer/exp.sqlite e2e/grpo/exp"
    if where == "postgres":
        store = request.getfixturevalue("postgres_url")
        text = text.replace("storage_type: sql", f"storage_type: sql, path: '{store}'")
        key = f"{shown(database_url(store))} e2e/grpo/exp"
    config.write_text(text)
    r = run_trinity(config)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (tmp_path / "ckpt/e2e/grpo/buffer/exp.db").exists()  # no queue log
    every = {"written": 3 * 4 * 4, "trained": 3 * 4 * 4, "pending": 0, "leased": 0,
             "dropped": 0, "trained_twice": 0}  # fmt: skip
    assert buffer_counts(config, key) == every
    stats = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "buffer", "stats", store],
        capture_output=True, text=True,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout) == {key.replace("buffer/exp.sqlite", store): every}


def test_a_run_whose_trainer_finished_its_sql_buffer_counts_as_ended(tmp_path):
    """Run naming (`launcher.naming.buffers_finished`) reads sql buffers as it reads queue logs:
    a rerun without continue_from_checkpoint of an ended run takes a fresh name."""
    from types import SimpleNamespace

    from trinity.launcher.naming import buffers_finished

    run_dir = tmp_path / "ckpt" / "proj" / "run"
    cfg = SimpleNamespace(
        buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=None))
    )
    assert buffers_finished(cfg, run_dir) == []  # no buffer yet: not ended
    q = SQLStorage(str(run_dir / "buffer" / "exp.sqlite"), name="proj/run/exp")
    SQLStorage(str(run_dir / "buffer" / "exp.sqlite"), name="proj/other/exp").shutdown()
    assert buffers_finished(cfg, run_dir) == [False]  # this run's only
    asyncio.run(q.finish())
    assert buffers_finished(cfg, run_dir) == [True]


def test_buffer_stats_of_one_store_and_its_refusals(tmp_path):
    from typer.testing import CliRunner

    from trinity.cli import app

    db = str(tmp_path / "b.sqlite")
    q = SQLStorage(db, name="p/r/exp")
    asyncio.run(q.write([exp(0), exp(1)]))
    run = CliRunner().invoke
    out = run(app, ["buffer", "stats", db])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)[f"{db} p/r/exp"]["pending"] == 2
    assert run(app, ["buffer", "stats"]).exit_code == 2  # neither a config nor a store
    (tmp_path / "x.sqlite").write_bytes(b"not a database at all, just bytes" * 100)
    refused = run(app, ["buffer", "stats", str(tmp_path / "x.sqlite")])
    assert refused.exit_code == 2 and "not a SQLite database" in refused.output
