"""The storages' crash trial: a writer process (an explorer) and a reader process (a trainer
that acks after its simulated checkpoints, `crash_roles.py`) on one SQLite file or PostgreSQL
database, or one process holding a `file` storage (a JSONL file or a folder of Parquet parts)
with its writer and reader (the file storage is one process's: `buffer/file_log.py`), SIGKILLed
at random moments and started again, until all finish (a kill mid-write leaves a part of a line,
which the restart truncates, or a temporary or uncommitted Parquet part, which it removes). Then every
experience was written once (the writer's cursor moves in its write's transaction) and trained
once (the reader's checkpoint settles its leases, `reader_started` takes the rest back): nothing
lost, nothing trained twice, and the storage's own counts agree. With replay (sql), each
experience is trained fresh exactly once and reused at most once, every reuse counted."""

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
from trinity.buffer.stats import store_counts

ROLES = Path(__file__).with_name("crash_roles.py")
KILLS = 12  # then both run to the end


def stored(store: Path) -> int:
    """The experiences the `file` storage's store holds: JSONL lines, or Parquet rows."""
    if store.is_dir():
        import pyarrow.dataset as ds

        return ds.dataset(store, format="parquet").count_rows()
    return len(store.read_text().splitlines())


def start(role: str, db: str, folder: Path, replay: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROLES), role, db, str(folder), *(["replay"] if replay else [])],
        stdout=subprocess.DEVNULL, stderr=open(folder / f"{role}.err", "a"),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, replay",
    [
        ("sqlite", False),
        ("postgres", False),
        ("file", False),
        ("parquet", False),
        ("sqlite", True),
        ("postgres", True),
    ],
)
def test_sigkilled_writer_and_reader_lose_nothing_and_train_nothing_twice(
    tmp_path, request, where, replay
):
    files = {"file": str(tmp_path / "b.jsonl"), "parquet": str(tmp_path / "b.parquet")}
    db = {"sqlite": str(tmp_path / "b.sqlite"), **files}.get(where)
    db = db or request.getfixturevalue("postgres_url")
    rng = random.Random(0)
    roles = ("both",) if where in files else ("writer", "reader")
    procs = {role: start(role, db, tmp_path, replay) for role in roles}
    kills, t0 = dict.fromkeys(roles, 0), time.monotonic()
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
    assert all(k >= 2 for k in kills.values()), kills
    trained = [tuple(t) for t in json.loads((tmp_path / "checkpoint.json").read_text())["trained"]]
    assert len(trained) == len(set(trained)), "an experience was trained twice at one use"
    fresh = sorted(i for i, uses in trained if uses == 0)
    assert fresh == list(range(STEPS * PER_STEP)), "experiences were lost"
    reused = [i for i, uses in trained if uses > 0]
    assert all(uses <= 1 for _, uses in trained)  # use_count_limit 2: one reuse at most
    assert bool(reused) == replay, len(reused)
    if where in files:
        (counts,) = store_counts(db).values()
        assert stored(Path(db)) == STEPS * PER_STEP  # every write once; a killed write undone
    else:
        (counts,) = buffer_counts(db, "crash/").values()
    if replay:
        assert counts.pop("replayed") == len(reused) and counts.pop("replay_pending") == 0
        counts = {k: v for k, v in counts.items() if not k.startswith("replay_")}
    total = STEPS * PER_STEP
    assert counts == {"written": total, "trained": total, "pending": 0, "leased": 0,
                      "dropped": 0, "trained_twice": 0}  # fmt: skip
