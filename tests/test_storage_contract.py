"""The experience-storage contract (`trinity/buffer/storage.py`), one suite for every storage:
the in-memory queue, the queue with its SQLite log, `sql` on SQLite and `sql` on a real PostgreSQL
server (`postgres_url`; skipped without one locally, failed in CI), and the `file` storage as a
JSONL file and as a folder of Parquet parts (their records kept once trained: the one departure,
in the retention test). FIFO, blocking reads, leases and
acks, staleness, exactly once across a restart, settled leases, retention, cursors, writers and
their tokens, finish / close / linger, and several writers with a reader at once."""

from __future__ import annotations

import asyncio

import pytest
from storages import DURABLE, FILES, KINDS, Backend, backend_for, exp

from trinity.buffer.storage import BufferClosed, Cursor, Superseded
from trinity.common.experience import EID


@pytest.fixture(params=KINDS)
def backend(request, tmp_path) -> Backend:
    return backend_for(request.param, tmp_path, request)


@pytest.fixture(params=DURABLE)
def durable(request, tmp_path) -> Backend:
    return backend_for(request.param, tmp_path, request)


def test_fifo_and_blocking_read(backend):
    async def main():
        q = backend.open()
        reader = asyncio.create_task(q.read(3, timeout=5))
        await asyncio.sleep(0.05)
        assert not reader.done()  # blocks until 3 are there
        await q.write([exp(0), exp(1)])
        await asyncio.sleep(0.05)
        assert not reader.done()
        await q.write([exp(2), exp(3)])
        got = (await reader).experiences
        assert [e.reward for e in got] == [0.0, 1.0, 2.0]
        assert (await q.stats())["pending"] == 1

    asyncio.run(main())


def test_timeout_names_counts(backend):
    async def main():
        q = backend.open()
        await q.write([exp(0)])
        with pytest.raises(TimeoutError, match="1 experiences waiting"):
            await q.read(2, timeout=0.05)

    asyncio.run(main())


def test_close_drains_then_raises(backend):
    async def main():
        q = backend.open()
        await q.write([exp(0), exp(1), exp(2)])
        await q.close()
        assert len((await q.read(2)).experiences) == 2
        assert len((await q.read(2)).experiences) == 1  # what is left
        with pytest.raises(BufferClosed):
            await q.read(2)

    asyncio.run(main())


def test_min_version_drops_stale(backend):
    async def main():
        q = backend.open()
        await q.write([exp(0, version=0), exp(1, version=1), exp(2, version=2)])
        got = (await q.read(2, timeout=1, min_version=1)).experiences
        assert [e.model_version for e in got] == [1, 2]
        assert (await q.stats())["dropped"] == 1

    asyncio.run(main())


def test_capacity_blocks_writer(backend):
    async def main():
        q = backend.open(capacity=2)
        await q.write([exp(0), exp(1)])
        writer = asyncio.create_task(q.write([exp(2)]))
        await asyncio.sleep(0.05)
        assert not writer.done()
        await q.read(1)
        await asyncio.wait_for(writer, 1)
        assert (await q.stats())["pending"] == 2

    asyncio.run(main())


def test_survives_restart_with_nothing_lost_and_nothing_trained_twice(durable):
    async def first():
        q = durable.open()
        await q.write([exp(i) for i in range(6)])
        a = await q.read(2)  # trained and checkpointed: acked
        await q.ack([a.id])
        b = await q.read(2)  # read, maybe trained, but no checkpoint after it: not acked
        assert [e.reward for e in b.experiences] == [2.0, 3.0]
        assert await q.stats() == {
            "written": 6, "trained": 2, "pending": 2, "leased": 2, "dropped": 0,
            "trained_twice": 0,
        }  # fmt: skip
        durable.die(q)  # the process dies here

    async def second():
        q = durable.open()
        started = await q.reader_started([])  # the restarted trainer
        assert started["returned"] in (0, 2)  # the queue took them back when it opened
        assert (await q.stats())["pending"] == 4  # the unacked lease is back
        got = await q.read(4)
        # exactly the untrained ones, in write order, with their tensors intact
        assert [e.reward for e in got.experiences] == [2.0, 3.0, 4.0, 5.0]
        assert got.experiences[0].tokens.tolist() == [1, 2, 3, 2]
        assert got.experiences[0].logprobs.tolist() == [-0.5]
        assert got.experiences[0].eid == EID(batch=2, task=0, run=0)
        await q.ack([got.id])
        stats = await q.stats()
        assert stats["trained"] == 6 and stats["trained_twice"] == 0
        with pytest.raises(KeyError, match="already acked"):
            await q.ack([got.id])

    asyncio.run(first())
    asyncio.run(second())


def test_a_checkpoint_whose_ack_was_lost_still_settles_its_leases(durable):
    # the trainer wrote a checkpoint recording lease b, then died before acking it: the restart
    # acks b (settled) before taking leases back, so b's experiences are not trained a second
    # time; settling a lease that was acked already (a) changes nothing
    async def first() -> list[int]:
        q = durable.open()
        await q.write([exp(i) for i in range(6)])
        a = await q.read(2)
        await q.ack([a.id])
        b = await q.read(2)  # in checkpoint N, whose ack never happened
        durable.die(q)
        return [a.id, b.id]

    async def second(settled: list[int]) -> None:
        q = durable.open(settled=settled)
        assert await q.stats() == {
            "written": 6, "trained": 4, "pending": 2, "leased": 0, "dropped": 0,
            "trained_twice": 0,
        }  # fmt: skip
        await q.reader_started(settled)  # as the trainer does: settling twice is harmless
        got = await q.read(2)
        assert [e.reward for e in got.experiences] == [4.0, 5.0]
        assert (await q.stats())["trained_twice"] == 0

    asyncio.run(second(asyncio.run(first())))


def test_trained_and_dropped_rows_keep_their_counts_not_their_payload(durable):
    async def main():
        q = durable.open()
        await q.write([exp(i, version=i % 2) for i in range(4)])
        lease = await q.read(1, min_version=1)  # exp(0) is stale (version 0): dropped
        await q.ack([lease.id])
        rows = durable.rows(q)
        gone = [r[4] for r in rows[:3]] if durable.kind in FILES else [0, 0, 0]  # a file keeps
        assert rows[0] == (3, 0, 0, 0.0, gone[0])  # dropped: bookkeeping kept, payload gone
        assert rows[1] == (2, 1, 1, 1.0, gone[1])  # trained
        assert rows[2][0] == 3 and rows[2][4] == gone[2]  # exp(2), version 0: dropped on the read
        assert rows[3][0] == 0 and rows[3][4] > 100  # pending: the experience is all there
        assert await q.stats() == {
            "written": 4, "trained": 1, "pending": 1, "leased": 0, "dropped": 2,
            "trained_twice": 0,
        }  # fmt: skip

    asyncio.run(main())


def test_cursors_are_written_with_their_step_and_survive_a_restart(durable):
    async def main():
        q = durable.open()
        assert await q.cursor("alpha") is None  # never wrote
        await q.write([exp(0)], Cursor("alpha", 1, 4, {"reward": 0.5}))
        await q.write([exp(1)], Cursor("beta", 7, 9))
        await q.write([exp(2)], Cursor("alpha", 2, 8))  # a step without a report
        durable.die(q)
        again = durable.open()
        assert await again.cursor("alpha") == Cursor("alpha", 2, 8, None)
        assert await again.cursor("beta") == Cursor("beta", 7, 9, None)
        await again.write([exp(3)], Cursor("alpha", 3, 12, {"reward": 1.0}))
        assert await again.cursor("alpha") == Cursor("alpha", 3, 12, {"reward": 1.0})
        # an adaptive task selector's state travels with the cursor (`TaskStream.state_dict`)
        learned = {"taken": 16, "batch_no": 4, "pending": [2], "selector": {"alphas": [1.5]}}
        await again.write([exp(4)], Cursor("alpha", 4, 16, None, learned))
        durable.die(again)
        assert await durable.open().cursor("alpha") == Cursor("alpha", 4, 16, None, learned)

    asyncio.run(main())


def test_buffer_closes_when_its_last_writer_releases(backend):
    # two explorers feed one trainer: the first to finish must not end the run for the other
    async def main():
        q = backend.open()
        await q.register_writer("explorer_a")
        await q.register_writer("explorer_b")
        await q.write([exp(0)])
        await q.release_writer("explorer_a")
        await q.write([exp(1)])  # b still writes
        assert len((await q.read(2, timeout=1)).experiences) == 2
        reader = asyncio.create_task(q.read(1, timeout=5))
        await asyncio.sleep(0.05)
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


def test_the_trainer_s_budget_finishes_the_buffer_for_every_writer(backend):
    # the trainer reached its step budget: a writer blocked at capacity and any later write are
    # told (BufferClosed), what is pending is dropped and counted: written = trained + dropped
    async def main():
        q = backend.open(capacity=3)
        await q.register_writer("alpha")
        await q.write([exp(0), exp(1)])
        lease = await q.read(2, timeout=1)
        await q.write([exp(2), exp(3), exp(4)])
        blocked = asyncio.create_task(q.write([exp(5)]))  # 3 pending: at capacity
        await asyncio.sleep(0.05)
        assert not blocked.done()
        assert await q.finish() == 3
        with pytest.raises(BufferClosed, match="trainer has finished"):
            await blocked
        await q.ack([lease.id])
        c = await q.stats()
        assert (c["written"], c["trained"], c["dropped"], c["pending"]) == (5, 2, 3, 0)
        with pytest.raises(BufferClosed):
            await q.read(1, timeout=1)
        backend.die(q)

    asyncio.run(main())
    if backend.path is None:
        return

    async def later():  # an explore process started after the run ended is refused
        q = backend.open()
        await q.register_writer("late")
        with pytest.raises(BufferClosed, match="trainer has finished"):
            await q.write([exp(6)])
        await q.reader_started([])  # a continued run's trainer reopens it
        await q.write([exp(6)])
        assert [e.reward for e in (await q.read(1, timeout=1)).experiences] == [6.0]

    asyncio.run(later())


def test_a_restarted_trainer_gets_back_what_its_dead_process_read(backend):
    # trainer 1 read leases 1, 2 and 3, checkpointed after lease 1 (its checkpoint records it,
    # the ack was lost with the process) and died. Trainer 2 resumes from that checkpoint:
    # lease 1 is settled, 2 and 3 come back first, in write order, then what was never read
    async def main():
        q = backend.open()
        await q.write([exp(i) for i in range(8)])
        first = await q.reader_started([])
        leases = [await q.read(2, timeout=1, reader=first["reader"]) for _ in range(3)]
        ghost = asyncio.create_task(q.read(4, timeout=5, reader=first["reader"]))
        await asyncio.sleep(0.05)  # a read of the dead trainer, still waiting in the actor
        second = await q.reader_started([leases[0].id])
        assert second["returned"] == 4
        with pytest.raises(Superseded):
            await ghost  # takes nothing
        with pytest.raises(KeyError):  # a returned lease cannot be acked any more
            await q.ack([leases[1].id])
        got = await q.read(6, timeout=1, reader=second["reader"])
        assert [e.reward for e in got.experiences] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        await q.ack([got.id])
        c = await q.stats()
        assert (c["trained"], c["pending"], c["leased"], c["trained_twice"]) == (8, 0, 0, 0)

    asyncio.run(main())


def test_a_write_of_a_replaced_explorer_process_writes_nothing(backend):
    async def main():
        q = backend.open(capacity=1)
        old = await q.register_writer("alpha")
        await q.write([exp(0)], Cursor("alpha", 1, 4), old)
        ghost = asyncio.create_task(q.write([exp(1)], Cursor("alpha", 2, 8), old))
        await asyncio.sleep(0.05)  # blocked at capacity when its process was SIGKILLed
        new = await q.register_writer("alpha")  # the explore process started again
        with pytest.raises(Superseded):
            await ghost
        assert await q.cursor("alpha") == Cursor("alpha", 1, 4)  # it continues after step 1
        await q.read(1, timeout=1)
        await q.write([exp(1)], Cursor("alpha", 2, 8), new)
        assert (await q.stats())["written"] == 2

    asyncio.run(main())


def test_a_reader_with_a_linger_waits_for_an_explorer_started_later(backend):
    async def main():
        q = backend.open()
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


def test_two_writers_and_a_reader_at_once_see_every_experience_once_in_order(backend):
    """Two explorers write 120 experiences each in steps of 8 (with cursors) while a trainer
    reads batches of 16 and acks them; for `sql` each is a storage of its own over the one
    database (as processes of their own would be). Every experience is read once, each
    writer's in its write order, and the cursors end at the last step."""
    per_writer, step_size = 120, 8

    async def main():
        home = backend.open(capacity=40)
        peer = backend.open if backend.peers else lambda **_: home
        stores = {"a": peer(capacity=40), "b": peer(capacity=40)}

        async def writer(name: str, base: int) -> None:
            q = stores[name]
            token = await q.register_writer(name)
            for s in range(per_writer // step_size):
                batch = [exp(base + s * step_size + k) for k in range(step_size)]
                await q.write(batch, Cursor(name, s + 1, (s + 1) * step_size), token)
            await q.release_writer(name)

        async def reader() -> list[float]:
            q = peer(capacity=40)
            token = (await q.reader_started([]))["reader"]
            got: list[float] = []
            while True:
                try:
                    lease = await q.read(16, timeout=20, reader=token)
                except BufferClosed:
                    return got
                got += [e.reward for e in lease.experiences]
                await q.ack([lease.id])

        await home.register_writer("a")  # both registered before either can release
        await home.register_writer("b")
        _, _, got = await asyncio.gather(writer("a", 0), writer("b", 1000), reader())
        a = [r for r in got if r < 1000]
        b = [r for r in got if r >= 1000]
        assert a == [float(i) for i in range(per_writer)]
        assert b == [float(1000 + i) for i in range(per_writer)]
        c = await home.stats()
        assert (c["written"], c["trained"], c["trained_twice"]) == (2 * per_writer,) * 2 + (0,)
        last = per_writer // step_size
        assert await home.cursor("a") == Cursor("a", last, per_writer)
        assert await home.cursor("b") == Cursor("b", last, per_writer)

    asyncio.run(main())
