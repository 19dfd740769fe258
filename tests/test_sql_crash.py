"""The sql storage's crash trial: a writer process (an explorer) and a reader process (a trainer
that acks after its simulated checkpoints, `crash_roles.py`) on one SQLite file or PostgreSQL
database, SIGKILLed at random moments and started again, until both finish. Then every
experience was written once (the writer's cursor moves in its write's transaction) and trained
once (the reader's checkpoint settles its leases, `reader_started` takes the rest back): nothing
lost, nothing trained twice, and the storage's own counts agree. With replay, each experience
is trained fresh exactly once and reused at most once, every reuse counted."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_roles import PER_STEP, STEPS

from trinity.buffer.sql_inspect import buffer_counts

ROLES = Path(__file__).with_name("crash_roles.py")
KILLS = 12  # then both run to the end


def start(role: str, db: str, folder: Path, replay: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROLES), role, db, str(folder), *(["replay"] if replay else [])],
        stdout=subprocess.DEVNULL, stderr=open(folder / f"{role}.err", "a"),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["fifo", "replay"])
@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_sigkilled_writer_and_reader_lose_nothing_and_train_nothing_twice(
    tmp_path, request, where, replay
):
    db = (
        str(tmp_path / "b.sqlite") if where == "sqlite" else request.getfixturevalue("postgres_url")
    )
    rng = random.Random(0)
    procs = {role: start(role, db, tmp_path, replay) for role in ("writer", "reader")}
    kills, t0 = {"writer": 0, "reader": 0}, time.monotonic()
    while any(p is not None for p in procs.values()):
        assert time.monotonic() - t0 < 600, "the trial did not end"
        time.sleep(rng.uniform(0.2, 1.0))
        for role, p in procs.items():
            if p is not None and p.poll() is not None:  # ended by itself
                assert p.returncode == 0, (tmp_path / f"{role}.err").read_text()[-3000:]
                procs[role] = None
        alive = [r for r, p in procs.items() if p is not None]
        if alive and sum(kills.values()) < KILLS:
            fewest = min(kills[r] for r in alive)  # each role killed about as often
            victims = alive if rng.random() < 0.25 else [r for r in alive if kills[r] == fewest][:1]
            for role in victims:
                procs[role].send_signal(signal.SIGKILL)
                procs[role].wait()
                kills[role] += 1
                procs[role] = start(role, db, tmp_path, replay)
    assert (tmp_path / "done").exists()
    assert kills["writer"] >= 2 and kills["reader"] >= 2, kills
    trained = [tuple(t) for t in json.loads((tmp_path / "checkpoint.json").read_text())["trained"]]
    assert len(trained) == len(set(trained)), "an experience was trained twice at one use"
    fresh = sorted(i for i, uses in trained if uses == 0)
    assert fresh == list(range(STEPS * PER_STEP)), "experiences were lost"
    reused = [i for i, uses in trained if uses > 0]
    assert all(uses <= 1 for _, uses in trained)  # use_count_limit 2: one reuse at most
    (counts,) = buffer_counts(db, "crash/").values()
    total = STEPS * PER_STEP
    expected = {"written": total, "trained": total, "pending": 0, "leased": 0,
                "dropped": 0, "trained_twice": 0}  # fmt: skip
    if replay:
        assert reused, "nothing was reused"
        assert counts.pop("replayed") == len(reused) and counts.pop("replay_pending") == 0
        counts = {k: v for k, v in counts.items() if not k.startswith("replay_")}
    else:
        assert not reused
    assert counts == expected
