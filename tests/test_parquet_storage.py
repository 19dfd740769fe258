"""The `file` storage over a folder of Parquet parts, beyond the shared contract
(`test_storage_contract.py`): one part per write that any Parquet reader takes, experiences read
back exactly, a write killed before or after its rename undone, parts of another tool read, a lost
part refused, and a `datasets` save folder read (never written) as experiences."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from storages import exp, fill

from trinity.buffer.file_log import sidecar
from trinity.buffer.file_storage import FileStorage
from trinity.buffer.storage import Cursor
from trinity.common.experience import EID, Experience, ExperienceKind


def open_store(path, settled=()) -> FileStorage:
    return FileStorage(str(path), 10000, list(settled), False, "proj/run/exp")


def rewards(experiences) -> list[float]:
    return [e.reward for e in experiences]


def test_each_write_is_one_part_that_any_parquet_reader_takes(tmp_path):
    folder = tmp_path / "e.parquet"

    async def main():
        q = open_store(folder)
        await q.write([exp(0), exp(1)], Cursor("alpha", 1, 2))
        await q.write([], Cursor("alpha", 2, 2))  # a step without experiences: no part
        await q.write([exp(2)], Cursor("alpha", 3, 3))
        q.log.close()

    asyncio.run(main())
    assert sorted(p.name for p in folder.iterdir()) == [
        "part-000001.parquet",
        "part-000002.parquet",
    ]
    assert pq.read_table(folder / "part-000001.parquet")["reward"].to_pylist() == [0.0, 1.0]
    table = pads.dataset(folder, format="parquet").to_table()  # the folder is one table
    assert table["reward"].to_pylist() == [0.0, 1.0, 2.0]
    assert table.schema.field("tokens").type == pa.list_(pa.int64())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    assert table.schema.field("info").type == pa.string()
    assert sidecar(folder) == tmp_path / "e.parquet.state.db"  # beside the folder, not in it


def full() -> Experience:
    """Every field set: a multi-turn mask, top-k logprobs, nested info, a float32 logprob that a
    float64 would not hold exactly."""
    return Experience(
        tokens=torch.tensor([5, 6, 7, 8, 9]),
        prompt_length=2,
        logprobs=torch.tensor([-0.1, -2.5, -1e-7]),
        action_mask=torch.tensor([True, False, True]),  # a tool's output between two turns
        reward=0.1,
        token_level_reward=torch.tensor([0.0, 0.0, 0.1]),
        advantages=torch.tensor([0.5, -0.25, 1.0 / 3]),
        returns=torch.tensor([1.0, 2.0, 3.0]),
        eid=EID(batch=4, task=2, run=1, step=3, suffix="math"),
        model_version=7,
        truncated=True,
        kind=ExperienceKind.MULTI_TURN,
        prompt_text="2+2=",
        response_text="4",
        info={"tool": {"calls": [1, 2]}, "note": None},
        metrics={"turns": 2.0, "tool_ms": 1.5},
        topk_ids=torch.tensor([[7, 1], [8, 2], [9, 3]]),
        topk_logprobs=torch.tensor([[-0.1, -3.0], [-2.5, -0.2], [-1e-7, -9.0]]),
    )


def test_experiences_read_back_exactly(tmp_path):
    bare = Experience(tokens=torch.tensor([1, 2]), prompt_length=2)  # every optional field unset
    mask_as_ints = Experience(
        tokens=torch.tensor([1, 2, 3]), prompt_length=1, action_mask=torch.tensor([1, 0])
    )
    written = [full(), bare, mask_as_ints]

    async def main():
        q = open_store(tmp_path / "e.parquet")
        await q.write(written)
        q.log.close()
        again = open_store(tmp_path / "e.parquet")  # from the part, not from memory
        return (await again.read(3)).experiences

    got = asyncio.run(main())
    assert pq.read_table(tmp_path / "e.parquet" / "part-000001.parquet").num_rows == 3
    assert [e.to_dict() for e in got[:2]] == [e.to_dict() for e in written[:2]]
    assert got[2].action_mask.tolist() == [True, False]  # as a JSONL line reads back too
    a, b = got[0], got[1]
    assert a.tokens.dtype == torch.int64 and a.logprobs.dtype == torch.float32
    assert torch.equal(a.logprobs, full().logprobs)  # bit for bit: float32 both ways
    assert torch.equal(a.topk_ids, full().topk_ids) and a.topk_ids.shape == (3, 2)
    assert a.info == {"tool": {"calls": [1, 2]}, "note": None}  # the None inside kept
    assert a.eid == EID(4, 2, 1, 3, "math") and a.kind == ExperienceKind.MULTI_TURN
    assert (b.reward, b.logprobs, b.advantages, b.topk_ids, b.prompt_text) == (None,) * 5
    assert b.response_length == 0 and b.info == {} and b.metrics == {}


def killed_mid_write(folder, leave) -> None:
    """A store with one returned write (exp(0), cursor step 1) and a second write killed after
    its step 1 (the marker: part-000002.parquet), having left `leave(folder)` behind."""

    async def main():
        q = open_store(folder)
        await q.write([exp(0)], Cursor("alpha", 1, 1))
        q.log.conn.execute(
            "INSERT INTO buffer_state (key, value) VALUES ('writing_from', 'part-000002.parquet')"
        )
        leave(folder)
        q.log.close()

    asyncio.run(main())


def test_a_writer_killed_before_its_rename_leaves_a_temporary_part_that_open_removes(tmp_path):
    folder = tmp_path / "e.parquet"
    # the part half written under its temporary name
    killed_mid_write(folder, lambda f: (f / ".part-000002.parquet.tmp").write_bytes(b"PAR1\x00"))

    async def main():
        again = open_store(folder)
        assert [p.name for p in folder.iterdir()] == ["part-000001.parquet"]
        assert any("removed" in n and ".tmp" in n for n in again.log.notices)
        assert await again.cursor("alpha") == Cursor("alpha", 1, 1)  # not moved
        await again.write([exp(1)], Cursor("alpha", 2, 2))  # the step again
        assert rewards((await again.read(2)).experiences) == [0.0, 1.0]
        again.log.close()

    asyncio.run(main())


def test_a_writer_killed_after_its_rename_before_its_rows_is_undone(tmp_path):
    folder = tmp_path / "e.parquet"

    def renamed(f):  # the part in place (step 2 done), its rows never committed
        pq.write_table(pq.read_table(f / "part-000001.parquet"), f / "part-000002.parquet")

    killed_mid_write(folder, renamed)

    async def main():
        again = open_store(folder)
        assert not (folder / "part-000002.parquet").exists()  # else read twice: as a foreign
        assert any("part-000002.parquet: written by a write killed" in n for n in again.log.notices)
        assert (await again.stats())["written"] == 1
        await again.write([exp(1)], Cursor("alpha", 2, 2))
        assert (folder / "part-000002.parquet").exists()  # the step again, under the same name
        again.log.close()

    asyncio.run(main())


def test_parts_of_another_tool_are_read_as_pending_in_name_order(tmp_path):
    folder = tmp_path / "e.parquet"
    folder.mkdir()
    # another tool's parts: its own names and types (int32 ids, no info, logprobs as float64)
    rows = [{"tokens": [1, 2, 3, i], "prompt_length": 3, "logprobs": [-0.5], "reward": float(i)}
            for i in range(3)]  # fmt: skip
    theirs = pa.schema([("tokens", pa.list_(pa.int32())), ("prompt_length", pa.int32()),
                        ("logprobs", pa.list_(pa.float64())), ("reward", pa.float64())])  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows[1:], schema=theirs), folder / "b.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1], schema=theirs), folder / "a.parquet")

    async def main():
        q = open_store(folder)  # no sidecar yet: every row pending
        assert (await q.stats())["pending"] == 3
        await q.write([exp(3)])
        q.log.close()
        pq.write_table(pa.Table.from_pylist([{**rows[0], "reward": 4.0}]), folder / "c.parquet")
        again = open_store(folder)  # a part added while closed: pending, after the known ones
        got = (await again.read(5)).experiences
        assert rewards(got) == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert got[0].tokens.dtype == torch.int64 and got[0].info == {}
        again.log.close()

    asyncio.run(main())


def test_a_part_that_is_not_an_experience_names_the_part_and_the_column(tmp_path):
    folder = tmp_path / "e.parquet"
    folder.mkdir()
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "1+1=", "response": "2"}]), folder / "x.parquet"
    )
    with pytest.raises(ValueError, match=r"x\.parquet: no column 'tokens', 'prompt_length'"):
        open_store(folder)


def test_a_part_the_state_knows_and_the_folder_lost_is_refused(tmp_path):
    folder = tmp_path / "e.parquet"
    fill(folder, [exp(0)])
    fill(folder, [exp(1)])
    (folder / "part-000001.parquet").unlink()
    with pytest.raises(ValueError, match=r"lacks part-000001\.parquet.*move the state file away"):
        open_store(folder)
    sidecar(folder).rename(tmp_path / "old.state.db")  # as the message says: read afresh
    assert asyncio.run(open_store(folder).stats())["pending"] == 1


def test_a_parquet_file_is_not_a_folder_of_parts(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"a": 1}]), tmp_path / "e.parquet")
    with pytest.raises(ValueError, match="is a file: experiences in Parquet are a folder"):
        open_store(tmp_path / "e.parquet")


def test_a_datasets_folder_is_read_once_exactly_and_never_written(tmp_path):
    import datasets

    source = tmp_path / "e.parquet"
    fill(source, [full(), exp(1), exp(2)])
    saved = tmp_path / "exp_ds"
    datasets.Dataset.from_parquet(str(source / "*.parquet")).save_to_disk(str(saved))
    files = sorted(p.name for p in saved.iterdir())

    async def train_until_crash():
        q = open_store(saved)
        assert q.lingering()  # nobody writes it: drained, the reader ends
        with pytest.raises(PermissionError, match="read only"):
            await q.register_writer("alpha")
        with pytest.raises(PermissionError, match="read only"):
            await q.write([exp(3)])
        first = await q.read(1)
        assert first.experiences[0].to_dict() == full().to_dict()  # exactly, through datasets
        await q.ack([first.id])
        await q.read(1)  # read, never checkpointed: the process dies
        q.log.close()

    async def train_again():
        q = open_store(saved)
        await q.reader_started()
        assert rewards((await q.read(5)).experiences) == [1.0, 2.0]  # after the ack, once
        q.log.close()

    asyncio.run(train_until_crash())
    asyncio.run(train_again())
    assert sorted(p.name for p in saved.iterdir()) == files  # the folder untouched
    assert sqlite3.connect(sidecar(saved)).execute("SELECT COUNT(*) FROM file_line").fetchone() == (
        3,
    )


def test_a_datasets_folder_of_splits_names_them(tmp_path):
    import datasets

    rows = [{**json.loads(json.dumps(exp(0).to_dict())), "info": "{}", "metrics": "{}"}]
    split = datasets.Dataset.from_list(rows)
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(ValueError, match=r"holds the splits test, train: point path at one"):
        open_store(tmp_path / "d")
    assert asyncio.run(open_store(tmp_path / "d" / "train").stats())["pending"] == 1
