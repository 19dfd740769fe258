"""The processes of the storages' crash trial (`test_sql_crash.py`), each run as
`python tests/crash_roles.py writer|reader|both <database or file> <folder>` and SIGKILLed at
random: `writer` and `reader` over one sql database (peers in two processes); `both` for the
`file` storage, which one process holds (as a run's Ray actor does), its writer and reader
killed together with it.

- writer: an explorer. Registers, continues after its cursor (step, written in the transaction
  of the step's experiences), writes STEPS steps of PER_STEP experiences, releases the buffer.
- reader: a trainer. Resumes from its checkpoint (`<folder>/checkpoint.json`: the experiences it
  has trained and the leases its last steps used), so its restart settles those leases and takes
  the others back (`reader_started`); reads batches, "trains" them, and every CKPT_EVERY batches
  writes a checkpoint durably (temp file, fsync, rename) and only then acks its leases, as
  `TrainerRunner._checkpoint` does. At the end (BufferClosed) a last checkpoint and `done`.

With a fourth argument `replay`, the sql storage reuses each experience once more
(`decay_limit_randomization`, use_count_limit 2) and the reader records (experience, use count).

No torch: experiences are built with `Experience.from_dict` (packed), so a restart is quick.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from trinity.buffer.file_storage import FileStorage
from trinity.buffer.replay import ReplaySpec
from trinity.buffer.sql import SQLStorage
from trinity.buffer.storage import BufferClosed, Cursor
from trinity.common.experience import Experience

STEPS, PER_STEP, BATCH, CKPT_EVERY = 60, 8, 12, 3
NAME = "crash/run/exp"
REPLAY = ReplaySpec("decay_limit_randomization", {"use_count_limit": 2}, reuse_cooldown_time=0)


def experience(i: int) -> Experience:
    return Experience.from_dict(
        {
            "tokens": [1, 2, 3, i],
            "prompt_length": 3,
            "logprobs": [-0.5],
            "reward": float(i),
            "eid": {"batch": i // PER_STEP, "task": i % PER_STEP},
        }
    )


async def writer(q: Any) -> None:
    token = await q.register_writer("w")
    cursor = await q.cursor("w")
    for step in range(cursor.step if cursor else 0, STEPS):
        batch = [experience(step * PER_STEP + k) for k in range(PER_STEP)]
        await q.write(batch, Cursor("w", step + 1, (step + 1) * PER_STEP), token)
        await asyncio.sleep(random.uniform(0.03, 0.1))  # exploring
    await q.release_writer("w")


def save(folder: Path, state: dict) -> None:
    tmp = folder / "checkpoint.json.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / "checkpoint.json")


def checkpoint(folder: Path) -> dict:
    ckpt = folder / "checkpoint.json"
    return json.loads(ckpt.read_text()) if ckpt.exists() else {"trained": [], "leases": []}


async def reader(q: Any, folder: Path, state: dict) -> None:
    token = (await q.reader_started(state["leases"]))["reader"]
    trained, unacked, reads = list(state["trained"]), [], 0
    while True:
        try:
            lease = await q.read(BATCH, timeout=60, reader=token)
        except BufferClosed:
            break
        # the train step
        trained += [[int(e.reward), e.info.get("use_count", 0)] for e in lease.experiences]
        await asyncio.sleep(random.uniform(0.0, 0.03))
        unacked.append(lease.id)
        reads += 1
        if reads % CKPT_EVERY == 0:
            save(folder, {"trained": trained, "leases": unacked})
            await asyncio.sleep(0.05)  # widens the window where a kill loses the ack, not the fact
            await q.ack(unacked)
            unacked = []
    save(folder, {"trained": trained, "leases": unacked})
    await q.ack(unacked)
    (folder / "done").write_text("")


async def main(role: str, db: str, folder: Path, replay: bool) -> None:
    settled = checkpoint(folder)["leases"]
    spec = REPLAY if replay else None
    if role == "both":
        q = FileStorage(db, capacity=50, settled=settled, name=NAME)
        await asyncio.gather(writer(q), reader(q, folder, checkpoint(folder)))
    elif role == "writer":
        await writer(SQLStorage(db, capacity=50, name=NAME, replay=spec))
    else:
        q = SQLStorage(db, 50, settled, name=NAME, replay=spec)
        await reader(q, folder, checkpoint(folder))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4:] == ["replay"]))
