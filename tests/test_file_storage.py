"""The `file` storage's own behaviour beyond the shared contract (`test_storage_contract.py`):
the file is plain JSONL a later run reads, a write killed midway is rolled back with its cursor,
a torn last line is never data, lines appended by others are read; and for both formats (a JSONL
file, a folder of Parquet parts: `test_parquet_storage.py` has the folder's own): a train run
resumes exactly on an explore run's store, one process at a time, `trinity buffer stats`."""

from __future__ import annotations

import asyncio
import json

import pytest
from storages import exp, fill

from trinity.buffer.file_log import FileLog, sidecar
from trinity.buffer.file_storage import FileStorage
from trinity.buffer.stats import store_counts
from trinity.buffer.storage import BufferClosed, Cursor
from trinity.common.experience import Experience

NAMES = ["e.jsonl", "e.parquet"]  # the tests for both formats: the log's own behaviour


def open_file(path, settled=()) -> FileStorage:
    return FileStorage(str(path), 10000, list(settled), False, "proj/run/exp")


def test_the_file_is_one_experience_per_line_in_write_order(tmp_path):
    async def main():
        q = open_file(tmp_path / "e.jsonl")
        await q.write([exp(0), exp(1)], Cursor("alpha", 1, 2))
        await q.write([exp(2)], Cursor("alpha", 2, 3))
        q.log.close()

    asyncio.run(main())
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert [Experience.from_dict(json.loads(x)).reward for x in lines] == [0.0, 1.0, 2.0]
    assert lines[1] == json.dumps(exp(1).to_dict())


@pytest.mark.parametrize("name", NAMES)
def test_an_explore_run_s_file_feeds_a_train_run_that_resumes_exactly(tmp_path, name):
    f = tmp_path / name

    async def explore():
        q = open_file(f)
        await q.write([exp(i) for i in range(5)], Cursor("alpha", 1, 5))
        q.log.close()

    async def train_until_crash() -> int:
        q = open_file(f)
        first = await q.read(2)
        await q.ack([first.id])  # checkpointed
        await q.read(2)  # read, never checkpointed: the process dies
        q.log.close()
        return first.id

    async def train_again():
        q = open_file(f)
        counts = await q.stats()  # opening takes back the dead reader's lease (as the queue)
        assert (counts["pending"], counts["leased"], counts["trained"]) == (3, 0, 2)
        await q.reader_started()
        rest = await q.read(3)
        assert [e.reward for e in rest.experiences] == [2.0, 3.0, 4.0]  # exactly after the ack
        await q.ack([rest.id])
        assert await q.stats() == {
            "written": 5, "trained": 5, "pending": 0, "leased": 0, "dropped": 0,
            "trained_twice": 0,
        }  # fmt: skip
        assert await q.cursor("alpha") == Cursor("alpha", 1, 5)
        q.log.close()

    asyncio.run(explore())
    asyncio.run(train_until_crash())
    asyncio.run(train_again())
    assert store_counts(str(f))[str(f)]["trained"] == 5  # `trinity buffer stats` on the file


def test_a_write_killed_before_it_returned_is_rolled_back_with_its_cursor(tmp_path):
    f = tmp_path / "e.jsonl"

    async def main():
        q = open_file(f)
        await q.write([exp(0)], Cursor("alpha", 1, 1))
        log = q.log
        # the kill: step 1 of a write (writing_from) done, half its line appended, no commit
        end = f.stat().st_size
        log.conn.execute(
            "INSERT INTO buffer_state (key, value) VALUES ('writing_from', ?)", (str(end),)
        )
        with open(f, "ab") as fh:
            fh.write(json.dumps(exp(1).to_dict()).encode() + b"\n" + b'{"tokens": [1,')
        log.close()
        again = open_file(f)
        assert f.stat().st_size == end  # truncated back to the last returned write
        assert any("truncated" in n for n in again.log.notices)
        assert await again.cursor("alpha") == Cursor("alpha", 1, 1)  # not moved
        assert (await again.stats())["written"] == 1
        assert [e.reward for e in (await again.read(1)).experiences] == [0.0]
        again.log.close()

    asyncio.run(main())


def test_a_torn_last_line_is_not_read_and_the_next_write_truncates_it(tmp_path):
    f = tmp_path / "e.jsonl"
    whole = [json.dumps(exp(i).to_dict()) for i in range(2)]
    torn = json.dumps(exp(2).to_dict())[:40]  # another tool's writer killed mid-line
    f.write_text("\n".join(whole) + "\n" + torn)

    async def main():
        q = open_file(f)
        assert q.log.torn == len(torn)
        assert any("torn last line" in n for n in q.log.notices)
        assert (await q.stats())["pending"] == 2  # the two whole lines, never the torn one
        await q.write([exp(3)])
        assert any("truncated a torn last line" in n for n in q.log.notices)
        got = await q.read(3)
        assert [e.reward for e in got.experiences] == [0.0, 1.0, 3.0]
        q.log.close()

    asyncio.run(main())
    assert f.read_text().splitlines() == [*whole, json.dumps(exp(3).to_dict())]


def test_lines_appended_by_others_are_read_and_a_last_line_without_newline_is_whole(tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(exp(0).to_dict()) + "\n")

    async def main():
        q = open_file(f)
        assert (await q.stats())["written"] == 1
        q.log.close()
        with open(f, "a") as fh:  # a hand-made addition, no final newline
            fh.write("\n" + json.dumps(exp(1).to_dict()))  # a blank line, then a whole one
        again = open_file(f)
        assert again.log.torn == 0
        await again.write([exp(2)])  # starts on a line of its own
        got = await again.read(3)
        assert [e.reward for e in got.experiences] == [0.0, 1.0, 2.0]
        again.log.close()

    asyncio.run(main())
    assert len(f.read_text().splitlines()) == 4  # with the blank line


def test_a_complete_line_that_is_not_an_experience_names_its_line(tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(exp(0).to_dict()) + '\n{"prompt": "hi"}\n')
    with pytest.raises(ValueError, match=r"e\.jsonl:2: not an experience"):
        open_file(f)


@pytest.mark.parametrize("name", NAMES)
def test_a_second_process_over_the_file_is_refused(tmp_path, name):
    f = tmp_path / name
    first = FileLog(f)
    with pytest.raises(RuntimeError, match="open in another process"):
        FileLog(f)
    first.close()
    FileLog(f).close()  # the lock went with its holder
    assert sidecar(f).exists()


@pytest.mark.parametrize("name", NAMES)
def test_a_train_run_after_the_explore_run_ended_drains_the_file_and_ends(tmp_path, name):
    f = tmp_path / name

    async def explore():
        q = open_file(f)
        token = await q.register_writer("alpha")
        await q.write([exp(i) for i in range(3)], Cursor("alpha", 1, 3), token)
        await q.release_writer("alpha")
        q.log.close()

    async def train():
        q = open_file(f)
        assert q.lingering()  # every writer released: the file is whole
        got = await q.read(2)
        rest = await q.read(2)  # the last, short read: writing has ended
        assert [e.reward for e in got.experiences + rest.experiences] == [0.0, 1.0, 2.0]
        with pytest.raises(BufferClosed):
            await q.read(2)
        await q.register_writer("alpha")  # an explore run started again reopens it
        assert not q.lingering()
        q.log.close()

    asyncio.run(explore())
    asyncio.run(train())


@pytest.mark.parametrize("name", NAMES)
def test_buffer_stats_and_run_naming_find_a_configured_file_outside_the_run(tmp_path, name):
    from types import SimpleNamespace

    from trinity.buffer.stats import run_counts
    from trinity.launcher.naming import buffers_finished

    f, run_dir = tmp_path / "data" / name, tmp_path / "ckpt" / "p" / "r"
    run_dir.mkdir(parents=True)
    eb = SimpleNamespace(storage_type="file", path=str(f))
    cfg = SimpleNamespace(
        buffer=SimpleNamespace(trainer_input=SimpleNamespace(experience_buffer=eb))
    )

    async def main():
        q = open_file(f)
        await q.write([exp(0), exp(1)])
        await q.ack([(await q.read(1)).id])
        assert buffers_finished(cfg, run_dir) == [False]
        assert await q.finish() == 1  # the trainer's budget: exp(1) dropped
        q.log.close()

    asyncio.run(main())
    assert buffers_finished(cfg, run_dir) == [True]
    assert run_counts(cfg, run_dir) == {
        str(f): {"written": 2, "trained": 1, "pending": 0, "leased": 0, "dropped": 1,
                 "trained_twice": 0},
    }  # fmt: skip


def test_a_file_shorter_than_its_state_records_is_refused(tmp_path):
    f = tmp_path / "e.jsonl"
    fill(f, [exp(0), exp(1)])
    f.write_text(json.dumps(exp(0).to_dict()) + "\n")  # cut by hand
    with pytest.raises(ValueError, match="replaced or cut by hand"):
        open_file(f)
    sidecar(f).rename(tmp_path / "old.state.db")  # as the message says: read afresh
    assert asyncio.run(open_file(f).stats())["pending"] == 1


def test_a_sidecar_from_before_parquet_parts_is_read(tmp_path):
    import sqlite3

    f = tmp_path / "e.jsonl"
    fill(f, [exp(0), exp(1)])
    with sqlite3.connect(sidecar(f)) as conn:  # the sidecar as the JSONL-only storage left it
        conn.execute("ALTER TABLE file_line DROP COLUMN part")
    q = open_file(f)
    assert [e.reward for e in asyncio.run(q.read(2)).experiences] == [0.0, 1.0]
    q.log.close()
