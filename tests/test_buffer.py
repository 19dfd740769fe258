"""What is the queue storage's own (its memory bound, its log file's size) and the Experience's
serialisation, which every storage relies on. The storage contract itself, shared by every
storage, is `test_storage_contract.py`."""

import asyncio
import json
import pickle
import sqlite3
import subprocess
import sys

import pytest
import torch
from storages import exp

from trinity.buffer.queue import BufferClosed, QueueStorage
from trinity.common.experience import _TENSORS, EID, Experience, ExperienceKind


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


def test_an_experience_as_bytes_is_exact_packed_and_refuses_a_damaged_blob():
    e = Experience(
        tokens=torch.tensor([5, 6, 7, 8]),
        prompt_length=1,
        logprobs=torch.tensor([-0.1, -1 / 3, -2.5]),  # not exact as short decimals
        topk_ids=torch.tensor([[6, 1], [7, 2], [8, 3]]),
        topk_logprobs=torch.full((3, 2), -0.7),
        reward=1.0,
        eid=EID(batch=3, task=2, run=1, suffix="math"),
        kind=ExperienceKind.MULTI_TURN,
        info={"turns": [1, 2]},
        metrics={"m": 0.5},
        response_text="ok",
    )
    blob = e.to_bytes()
    # 4 (magic) + 4 (header length) + header + 8 * 4 tokens + 4 * 3 logprobs + 1 * 3 mask +
    # 8 * 6 top-k ids + 4 * 6 top-k logprobs
    head = int.from_bytes(blob[4:8], "little")
    assert blob[:4] == b"TEX2" and len(blob) == 8 + head + 32 + 12 + 3 + 48 + 24
    again = Experience.from_bytes(blob)
    assert "tokens" not in vars(again)  # packed, as from a pickle
    assert again.to_dict() == e.to_dict()
    assert torch.equal(again.logprobs, e.logprobs)  # the float32 bits, not a decimal
    assert again.eid == e.eid and again.kind is ExperienceKind.MULTI_TURN
    assert again.to_bytes() == blob  # packed in, the same bytes out
    # the first layout (TEX1, a dict header with each tensor's byte count), built by hand
    tensors = [e.tokens, e.logprobs, e.action_mask, None, None, None, e.topk_ids, e.topk_logprobs]
    scalars = {k: v for k, v in e.to_dict().items() if k not in _TENSORS}
    head = {"s": scalars, "t": [None if t is None else
                                [str(t.dtype)[6:], list(t.shape), t.numel() * t.element_size()]
                                for t in tensors]}  # fmt: skip
    text = json.dumps(head).encode()
    v1 = b"TEX1" + len(text).to_bytes(4, "little") + text
    v1 += b"".join(t.numpy().tobytes() for t in tensors if t is not None)
    assert Experience.from_stored(v1).to_dict() == e.to_dict()
    for bad, why in [
        (blob[:-1], "not 24 bytes of float32"),  # the last tensor cut short
        (blob + b"\0", "1 bytes after its last tensor"),
        (blob[:20], "cut short in its"),
        (b'{"tokens": [1]}', "not an experience blob"),
        (b"TEX2\x02\x00\x00\x00[]", "its header is not one"),
    ]:
        with pytest.raises(ValueError, match=why):
            Experience.from_bytes(bad)


def test_a_log_written_with_json_payloads_is_read_on_restart(tmp_path):
    """Logs written before the blobs keep each payload as JSON text of `to_dict`: a restart
    over one hands its pending rows out as they were written."""
    path = tmp_path / "old.db"
    QueueStorage(path).log.close()  # the tables
    old = [exp(i) for i in range(3)]
    with sqlite3.connect(path) as db:
        for i, e in enumerate(old, start=1):
            db.execute("INSERT INTO experience_log (id, model_version, reward, payload) "
                       "VALUES (?, 0, ?, '')", (i, e.reward))  # fmt: skip
            db.execute("INSERT INTO experience_payload VALUES (?, ?)", (i, json.dumps(e.to_dict())))

    async def main():
        q = QueueStorage(path)
        await q.write([exp(3)])  # a blob after the JSON rows, with the next id
        lease = await q.read(4)
        return [e.to_dict() for e in lease.experiences]

    assert asyncio.run(main()) == [e.to_dict() for e in [*old, exp(3)]]


@pytest.mark.parametrize("kind", ["queue", "sql", "parquet"])
def test_the_buffer_side_passes_experiences_on_without_torch(tmp_path, kind):
    """The queue, sql and file (here a folder of Parquet parts) storages take pickled
    experiences, store them and read them back in a process that never imports torch (~130 MB
    less per such process)."""
    payload = pickle.dumps([exp(i) for i in range(3)])
    cls = {
        "queue": "trinity.buffer.queue.QueueStorage",
        "sql": "trinity.buffer.sql.SQLStorage",
        "parquet": "trinity.buffer.file_storage.FileStorage",
    }
    module, name = cls[kind].rsplit(".", 1)
    path = str(tmp_path / ("b.parquet" if kind == "parquet" else "b.db"))
    release = "    q.log.close()  # one process at a time\n" if kind == "parquet" else ""
    code = (
        "import asyncio, pickle, sys\n"
        f"from {module} import {name} as Storage\n"
        "async def main():\n"
        f"    q = Storage({path!r})\n"
        "    await q.write(pickle.loads(sys.stdin.buffer.read()))\n"
        f"{release}"
        f"    again = Storage({path!r})  # a restart reads them from disk\n"
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
        stats = await q.stats()
        assert stats["pending"] == 0 and stats["leased"] == 32

    asyncio.run(main())
