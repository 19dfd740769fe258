"""Queue storage: FIFO, blocking reads, leases and acks, writers, staleness, surviving a restart,
retention."""

import asyncio
import pickle
import subprocess
import sys

import pytest
import torch

from trinity.buffer.queue import BufferClosed, QueueStorage, Superseded
from trinity.buffer.storage import Cursor
from trinity.common.experience import EID, Experience


def exp(i: int, version: int = 0) -> Experience:
    return Experience(
        tokens=torch.tensor([1, 2, 3, i]),
        prompt_length=3,
        logprobs=torch.tensor([-0.5]),
        reward=float(i),
        eid=EID(batch=i, task=0, run=0),
        model_version=version,
    )


def test_fifo_and_blocking_read(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        reader = asyncio.create_task(q.read(3, timeout=5))
        await asyncio.sleep(0.01)
        assert not reader.done()  # blocks until 3 are there
        await q.write([exp(0), exp(1)])
        await asyncio.sleep(0.01)
        assert not reader.done()
        await q.write([exp(2), exp(3)])
        got = (await reader).experiences
        assert [e.reward for e in got] == [0.0, 1.0, 2.0]
        assert q.size() == 1

    asyncio.run(main())


def test_timeout_names_counts(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        await q.write([exp(0)])
        with pytest.raises(TimeoutError, match="1 experiences waiting"):
            await q.read(2, timeout=0.05)

    asyncio.run(main())


def test_close_drains_then_raises(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        await q.write([exp(0), exp(1), exp(2)])
        await q.close()
        assert len((await q.read(2)).experiences) == 2
        assert len((await q.read(2)).experiences) == 1  # what is left
        with pytest.raises(BufferClosed):
            await q.read(2)

    asyncio.run(main())


def test_min_version_drops_stale(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        await q.write([exp(0, version=0), exp(1, version=1), exp(2, version=2)])
        got = (await q.read(2, timeout=1, min_version=1)).experiences
        assert [e.model_version for e in got] == [1, 2]
        assert q.stats()["dropped"] == 1

    asyncio.run(main())


def test_survives_restart_with_nothing_lost_and_nothing_trained_twice(tmp_path):
    path = tmp_path / "b.db"

    async def first():
        q = QueueStorage(path)
        await q.write([exp(i) for i in range(6)])
        a = await q.read(2)  # trained and checkpointed: acked
        await q.ack([a.id])
        b = await q.read(2)  # read, maybe trained, but no checkpoint after it: not acked
        assert [e.reward for e in b.experiences] == [2.0, 3.0]
        assert q.stats() == {
            "written": 6, "trained": 2, "pending": 2, "leased": 2, "dropped": 0,
            "trained_twice": 0,
        }  # fmt: skip
        q.log.close()  # the process dies here

    async def second():
        q = QueueStorage(path)
        assert q.size() == 4  # the unacked lease is back, ahead of the unread rows
        got = await q.read(4)
        # exactly the untrained ones, in write order, with their tensors intact
        assert [e.reward for e in got.experiences] == [2.0, 3.0, 4.0, 5.0]
        assert got.experiences[0].tokens.tolist() == [1, 2, 3, 2]
        assert got.experiences[0].logprobs.tolist() == [-0.5]
        assert got.experiences[0].eid == EID(batch=2, task=0, run=0)
        await q.ack([got.id])
        assert q.stats()["trained"] == 6 and q.stats()["trained_twice"] == 0
        with pytest.raises(KeyError, match="already acked"):
            await q.ack([got.id])

    asyncio.run(first())
    asyncio.run(second())


def test_a_checkpoint_whose_ack_was_lost_still_settles_its_leases(tmp_path):
    # the trainer wrote a checkpoint recording lease b, then died before acking it: the restart
    # acks b (settled) before recovering, so b's experiences are not trained a second time;
    # settling a lease that was acked already (a) changes nothing
    path = tmp_path / "b.db"

    async def first() -> list[int]:
        q = QueueStorage(path)
        await q.write([exp(i) for i in range(6)])
        a = await q.read(2)
        await q.ack([a.id])
        b = await q.read(2)  # in checkpoint N, whose ack never happened
        q.log.close()
        return [a.id, b.id]

    async def second(settled: list[int]) -> None:
        q = QueueStorage(path, settled=settled)
        assert q.stats() == {
            "written": 6, "trained": 4, "pending": 2, "leased": 0, "dropped": 0,
            "trained_twice": 0,
        }  # fmt: skip
        got = await q.read(2)
        assert [e.reward for e in got.experiences] == [4.0, 5.0]

    asyncio.run(second(asyncio.run(first())))


def test_trained_and_dropped_rows_keep_their_counts_not_their_payload(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        await q.write([exp(i, version=i % 2) for i in range(4)])
        lease = await q.read(1, min_version=1)  # exp(0) is stale (version 0): dropped
        await q.ack([lease.id])
        rows = q.log.conn.execute(
            "SELECT state, acks, model_version, reward, COALESCE(length(data), 0) "
            "FROM experience_log LEFT JOIN experience_payload USING (id) ORDER BY id"
        ).fetchall()
        assert rows[0] == (3, 0, 0, 0.0, 0)  # dropped: bookkeeping kept, payload gone
        assert rows[1] == (2, 1, 1, 1.0, 0)  # trained
        assert rows[2][0] == 3 and rows[2][4] == 0  # exp(2), version 0: dropped on the read
        assert rows[3][0] == 0 and rows[3][4] > 100  # pending: the experience is all there
        assert q.stats() == {
            "written": 4, "trained": 1, "pending": 1, "leased": 0, "dropped": 2,
            "trained_twice": 0,
        }  # fmt: skip

    asyncio.run(main())


def test_the_file_does_not_grow_with_trained_experiences(tmp_path):
    def big(i: int) -> Experience:  # ~5 KB of JSON: several SQLite pages
        return Experience(
            tokens=torch.arange(300), prompt_length=100, logprobs=torch.zeros(200),
            eid=EID(batch=i, task=0, run=0),
        )  # fmt: skip

    async def main():
        path = tmp_path / "b.db"
        q = QueueStorage(path)
        sizes = []
        for _ in range(5):
            await q.write([big(i) for i in range(200)])
            lease = await q.read(200)
            await q.ack([lease.id])
            q.log.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            sizes.append(path.stat().st_size)
        # 4 more rounds of 200 experiences (~1 MB each) added only their bookkeeping rows
        assert sizes[-1] < 1.1 * sizes[0], sizes

    asyncio.run(main())


def test_buffer_closes_when_its_last_writer_releases(tmp_path):
    # two explorers feed one trainer: the first to finish must not end the run for the other
    async def main():
        q = QueueStorage(None)
        await q.register_writer("explorer_a")
        await q.register_writer("explorer_b")
        await q.write([exp(0)])
        await q.release_writer("explorer_a")
        await q.write([exp(1)])  # b still writes
        assert len((await q.read(2, timeout=1)).experiences) == 2
        reader = asyncio.create_task(q.read(1, timeout=5))
        await asyncio.sleep(0.01)
        assert not reader.done()  # still open: b has not released
        await q.release_writer("explorer_b")
        with pytest.raises(BufferClosed):
            await reader
        with pytest.raises(ValueError, match="never registered"):
            await q.release_writer("explorer_c")
        # an explore process run again (after a crash, or to explore more) reopens it
        await q.register_writer("explorer_b")
        await q.register_writer("explorer_b")  # its crashed run had registered the name too
        await q.write([exp(2)])
        assert len((await q.read(1, timeout=1)).experiences) == 1
        await q.release_writer("explorer_b")
        with pytest.raises(BufferClosed):
            await q.read(1, timeout=1)
        await q.close()  # for good: a writer that comes later cannot write
        await q.register_writer("explorer_d")
        with pytest.raises(BufferClosed):
            await q.write([exp(3)])

    asyncio.run(main())


def test_capacity_blocks_writer(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db", capacity=2)
        await q.write([exp(0), exp(1)])
        writer = asyncio.create_task(q.write([exp(2)]))
        await asyncio.sleep(0.01)
        assert not writer.done()
        await q.read(1)
        await asyncio.wait_for(writer, 1)
        assert q.size() == 2

    asyncio.run(main())


def test_experience_roundtrip_and_length_checks():
    e = exp(7)
    again = Experience.from_dict(e.to_dict())
    assert again.tokens.tolist() == e.tokens.tolist()
    assert again.action_mask.tolist() == [True]
    with pytest.raises(ValueError, match="logprobs has length 2"):
        Experience(
            tokens=torch.tensor([1, 2, 3]), prompt_length=2, logprobs=torch.tensor([0.0, 0.0])
        )


def test_a_pickled_experience_keeps_its_tensors_packed_until_one_is_read():
    e = Experience(
        tokens=torch.tensor([5, 6, 7, 8, 9]),
        prompt_length=2,
        logprobs=torch.tensor([-0.25, -1.5, -3.0]),
        advantages=torch.tensor([1.0, 1.0, 1.0]),
        reward=0.5,
        info={"turns": [1]},
    )
    again = pickle.loads(pickle.dumps(e))
    # scalars, the length and the list form, all without building a tensor
    assert again.reward == 0.5 and again.info == {"turns": [1]}
    assert again.response_length == 3
    assert again.to_dict() == e.to_dict()
    assert "tokens" not in vars(again)
    # the first tensor read unpacks every field, with its dtype; unset ones stay None
    assert again.logprobs.tolist() == [-0.25, -1.5, -3.0]
    assert again.tokens.dtype == torch.long and again.tokens.tolist() == [5, 6, 7, 8, 9]
    assert again.action_mask.dtype == torch.bool and again.action_mask.tolist() == [True] * 3
    assert again.returns is None and again.token_level_reward is None
    # a field set before the unpacking is not overwritten by it
    third = pickle.loads(pickle.dumps(e))
    third.advantages = torch.tensor([2.0, 2.0, 2.0])
    assert third.tokens.tolist() == [5, 6, 7, 8, 9]
    assert third.advantages.tolist() == [2.0, 2.0, 2.0]
    # a read from a dict is packed too and checks lengths as the constructor does
    packed = Experience.from_dict(e.to_dict())
    assert "tokens" not in vars(packed) and packed.response_length == 3
    with pytest.raises(ValueError, match="advantages has length 1, expected response length 3"):
        Experience.from_dict({**e.to_dict(), "advantages": [0.0]})


def test_the_buffer_side_passes_experiences_on_without_torch(tmp_path):
    """The queue storage takes pickled experiences, logs them to SQLite and pages them back in a
    process that never imports torch (~130 MB less per such process)."""
    payload = pickle.dumps([exp(i) for i in range(3)])
    code = (
        "import asyncio, pickle, sys\n"
        "from trinity.buffer.queue import QueueStorage\n"
        "async def main():\n"
        f"    q = QueueStorage({str(tmp_path / 'b.db')!r})\n"
        "    await q.write(pickle.loads(sys.stdin.buffer.read()))\n"
        f"    again = QueueStorage({str(tmp_path / 'b.db')!r})  # a restart pages them from disk\n"
        "    got = (await again.read(3, timeout=5)).experiences\n"
        "    sys.stdout.buffer.write(pickle.dumps([e.reward for e in got]))\n"
        "    assert 'torch' not in sys.modules, 'the buffer imported torch'\n"
        "asyncio.run(main())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert pickle.loads(r.stdout) == [0.0, 1.0, 2.0]


def test_restart_holds_at_most_capacity_in_memory_and_pages_the_rest_in_order(tmp_path):
    async def main():
        first = QueueStorage(tmp_path / "b.db", capacity=100)
        await first.write([exp(i) for i in range(30)])
        await first.read(4)  # leased, never acked: pending again after the restart
        first.log.close()
        # restarted with a smaller capacity: 30 pending, 10 in memory, 20 left on disk
        q = QueueStorage(tmp_path / "b.db", capacity=10)
        assert len(q._items) == 10 and q.size() == 30
        writer = asyncio.create_task(q.write([exp(100), exp(101)]))
        await asyncio.sleep(0.01)
        assert not writer.done()  # 30 waiting >= capacity 10: the writer waits for room
        got = []
        for _ in range(3):
            got += [e.reward for e in (await q.read(8)).experiences]
            assert len(q._items) <= 10
        await asyncio.wait_for(writer, 1)  # 6 left: room for the new rows, behind them
        await q.close()
        while True:
            try:
                got += [e.reward for e in (await q.read(8)).experiences]
            except BufferClosed:
                break
        # every pending row once, in write order, then what was written after the restart
        assert got == [float(i) for i in range(30)] + [100.0, 101.0]
        assert q.stats()["pending"] == 0 and q.stats()["leased"] == 32

    asyncio.run(main())


@pytest.mark.parametrize("durable", [True, False], ids=["sqlite", "memory"])
def test_the_trainer_s_budget_finishes_the_buffer_for_every_writer(tmp_path, durable):
    # the trainer reached its step budget: a writer blocked at capacity and any later write are
    # told (BufferClosed), what is pending is dropped and counted: written = trained + dropped
    async def main():
        q = QueueStorage(tmp_path / "b.db" if durable else None, capacity=3)
        await q.register_writer("alpha")
        await q.write([exp(0), exp(1)])
        lease = await q.read(2, timeout=1)
        await q.write([exp(2), exp(3), exp(4)])
        blocked = asyncio.create_task(q.write([exp(5)]))  # 3 pending: at capacity
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert await q.finish() == 3
        with pytest.raises(BufferClosed, match="trainer has finished"):
            await blocked
        await q.ack([lease.id])
        c = q.stats()
        assert (c["written"], c["trained"], c["dropped"], c["pending"]) == (5, 2, 3, 0)
        with pytest.raises(BufferClosed):
            await q.read(1, timeout=1)

    asyncio.run(main())
    if durable:  # an explore process started after the run ended is refused, not left filling
        q = QueueStorage(tmp_path / "b.db")

        async def later():
            await q.register_writer("late")
            with pytest.raises(BufferClosed, match="trainer has finished"):
                await q.write([exp(6)])
            await q.reader_started([])  # a continued run's trainer reopens it
            await q.write([exp(6)])
            assert [e.reward for e in (await q.read(1, timeout=1)).experiences] == [6.0]

        asyncio.run(later())


@pytest.mark.parametrize("durable", [True, False], ids=["sqlite", "memory"])
def test_a_restarted_trainer_gets_back_what_its_dead_process_read(tmp_path, durable):
    # trainer 1 read leases 1, 2 and 3, checkpointed after lease 1 (its checkpoint records it,
    # the ack was lost with the process) and died. Trainer 2 resumes from that checkpoint:
    # lease 1 is settled, 2 and 3 come back first, in write order, then what was never read
    async def main():
        q = QueueStorage(tmp_path / "b.db" if durable else None)
        await q.write([exp(i) for i in range(8)])
        first = await q.reader_started([])
        leases = [await q.read(2, timeout=1, reader=first["reader"]) for _ in range(3)]
        ghost = asyncio.create_task(q.read(4, timeout=5, reader=first["reader"]))
        await asyncio.sleep(0.01)  # a read of the dead trainer, still waiting in the actor
        second = await q.reader_started([leases[0].id])
        assert second["returned"] == 4
        with pytest.raises(Superseded):
            await ghost  # takes nothing
        got = await q.read(6, timeout=1, reader=second["reader"])
        assert [e.reward for e in got.experiences] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        await q.ack([got.id])
        c = q.stats()
        assert (c["trained"], c["pending"], c["leased"], c["trained_twice"]) == (8, 0, 0, 0)

    asyncio.run(main())


def test_a_write_of_a_replaced_explorer_process_writes_nothing(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db", capacity=1)
        old = await q.register_writer("alpha")
        await q.write([exp(0)], Cursor("alpha", 1, 4), old)
        ghost = asyncio.create_task(q.write([exp(1)], Cursor("alpha", 2, 8), old))
        await asyncio.sleep(0.01)  # blocked at capacity when its process was SIGKILLed
        new = await q.register_writer("alpha")  # the explore process started again
        with pytest.raises(Superseded):
            await ghost
        assert await q.cursor("alpha") == Cursor("alpha", 1, 4)  # it continues after step 1
        await q.read(1, timeout=1)
        await q.write([exp(1)], Cursor("alpha", 2, 8), new)
        assert q.stats()["written"] == 2

    asyncio.run(main())


def test_a_reader_with_a_linger_waits_for_an_explorer_started_later(tmp_path):
    async def main():
        q = QueueStorage(tmp_path / "b.db")
        await q.register_writer("alpha")
        await q.write([exp(0), exp(1)])
        await q.release_writer("alpha")  # every writer it knows is done
        assert [e.reward for e in (await q.read(2, timeout=1, linger=5)).experiences] == [0, 1]
        reader = asyncio.create_task(q.read(2, timeout=5, linger=5))
        await asyncio.sleep(0.05)
        assert not reader.done() and q.lingering()
        await q.register_writer("beta")  # a second explorer joins within the linger
        await q.write([exp(2), exp(3)])
        assert [e.reward for e in (await reader).experiences] == [2.0, 3.0]
        await q.release_writer("beta")
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(BufferClosed):  # nobody else comes: the linger ends the run
            await q.read(2, timeout=5, linger=0.2)
        assert 0.15 <= asyncio.get_running_loop().time() - t0 < 2
        with pytest.raises(BufferClosed):  # without a linger, at once
            await q.read(2, timeout=5)

    asyncio.run(main())
