"""An explore step's report is durable with its experiences: a step in the buffer has exactly one
metrics record, also when its process was SIGKILLed right after writing it (no Ray here: the
storage, hub and monitor classes in one process, "killed" by dropping them unclosed)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import torch
from rich.console import Console

from trinity.buffer.queue import QueueStorage
from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import Cursor
from trinity.common.experience import EID, Experience
from trinity.monitor.hub import MetricsHub
from trinity.monitor.monitor import Monitor

PART = "explorer-alpha"


def exp(step: int) -> Experience:
    return Experience(
        tokens=torch.tensor([1, 2, 3, step]),
        prompt_length=3,
        logprobs=torch.tensor([-0.5]),
        reward=1.0,
        eid=EID(batch=step, task=0, run=0),
    )


def report(step: int) -> dict[str, float]:
    return {"rollout/reward_mean": step / 10, "rollout/tasks": 4.0, "timing/explore_step": 0.5}


class Process:
    """One `trinity run --set mode=explore` process of explorer alpha: its monitor and hub (the
    buffer is the run's: `storage`). `explore(s)` is `Explorer.explore_step` + `run`'s report:
    the write with the cursor and the step's report, then `hub.put`."""

    def __init__(self, run_dir: Path, storage: QueueStorage) -> None:
        self.monitor = Monitor(run_dir, ["jsonl"], Console(file=io.StringIO()), part=PART)
        self.hub = MetricsHub(str(self.monitor.journal_path))
        self.hub.begin_stage("main")
        self.monitor.begin_stage("main", {"explorer"}, last_step=10)
        self.storage = storage
        self.tasks = 0

    def start(self) -> None:
        """`Explorer.run(resume=True)`: the cursor's step reported again (a replay)."""
        cursor = asyncio.run(self.storage.cursor("alpha"))
        if cursor is not None and cursor.metrics is not None:
            self.hub.replay("explorer", cursor.step, cursor.metrics)
        self.tasks = cursor.tasks if cursor else 0

    def write(self, step: int) -> None:
        self.tasks += 4
        cursor = Cursor("alpha", step, self.tasks, report(step))
        asyncio.run(self.storage.write([exp(step)], cursor))

    def explore(self, step: int) -> None:
        self.write(step)
        self.hub.put("explorer", step, {**report(step), "timing/buffer_write": 0.01})

    def pump(self) -> None:
        for event in self.hub.drain():
            self.monitor.add(*event)


def records(run_dir: Path) -> list[dict]:
    path = run_dir / f"metrics.{PART}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_cursor_keeps_its_step_s_report_in_the_write_s_transaction(tmp_path):
    log = SQLiteLog(tmp_path / "b.db")
    log.append([exp(1)], Cursor("alpha", 1, 4, report(1)))
    log.append([exp(2)], Cursor("alpha", 2, 8, report(2)))
    log.close()
    again = SQLiteLog(tmp_path / "b.db")  # as a restarted buffer reads it
    assert again.cursor("alpha") == Cursor("alpha", 2, 8, report(2))
    # a cursor moved without a report (a writer that sends none) carries no older step's
    again.append([exp(3)], Cursor("alpha", 3, 12))
    assert again.cursor("alpha") == Cursor("alpha", 3, 12, None)
    assert again.cursor("beta") is None


def test_a_step_written_but_never_reported_gets_its_one_record_from_the_buffer(tmp_path):
    db = tmp_path / "buffer" / "exp.db"
    first = Process(tmp_path, QueueStorage(db))
    first.start()
    for s in (1, 2):
        first.explore(s)
    first.pump()  # steps 1 and 2 are in metrics.explorer-alpha.jsonl
    first.write(3)  # step 3 is in the buffer, then SIGKILL: never reported, never journaled
    del first  # nothing closed
    # started again (here with the buffer read back from its file, as after a whole-run crash)
    second = Process(tmp_path, QueueStorage(db))
    second.start()  # continues after step 3 and reports it again from the buffer
    second.explore(4)
    second.pump()
    second.monitor.close()
    got = records(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3, 4]  # each once
    assert got[2]["rollout/reward_mean"] == 0.3 and "timing/buffer_write" not in got[2]
    assert got[3]["timing/buffer_write"] == 0.01


def test_a_step_already_reported_is_not_recorded_twice(tmp_path):
    # step 2 was reported and written; step 3 was reported (journaled) but its driver was killed
    # before it merged the report: the next process merges the journal, and each replay of a
    # step that a record holds is dropped, however often the process is killed and started again
    storage = QueueStorage(tmp_path / "b.db")
    first = Process(tmp_path, storage)
    first.start()
    for s in (1, 2):
        first.explore(s)
    first.pump()
    first.explore(3)  # journaled, then SIGKILL before the driver pumped it
    del first
    for _ in range(3):
        p = Process(tmp_path, storage)  # the buffer actor lived on (a split run)
        p.start()  # replays step 3; killed again before the pump: the replay is journaled
        del p
    last = Process(tmp_path, storage)
    last.start()
    last.pump()
    last.monitor.close()
    got = records(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 3]
    assert got[2]["timing/buffer_write"] == 0.01  # the original report, merged from the journal
    assert not last.monitor.journal_path.exists()
