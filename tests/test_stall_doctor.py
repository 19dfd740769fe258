"""The stall doctor on hand-built heartbeat snapshots (a fake clock), and the heartbeat
registry and beacon of this process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from trinity.common import heartbeat
from trinity.monitor.stall import RunStalled, StallDoctor


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def service(progress: int, at: float, waits=(), steps: int = 0) -> dict:
    return {
        "progress": progress,
        "steps": steps,
        "progressed_at": at,
        "waits": [list(w) for w in waits],
    }


def write(folder: Path, pid: int, now: float, services: dict, host: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    snap = {"pid": pid, "host": host or "elsewhere", "time": now, "services": services}
    (folder / f"x-{pid}.json").write_text(json.dumps(snap))


def doctor(tmp_path: Path, clock: Clock, timeout: float | None = 30.0, on_stall="warn"):
    printed: list[str] = []
    d = StallDoctor(tmp_path, timeout, on_stall, printed.append, now=clock)
    return d, printed


def stalled(tmp_path: Path, services: dict, idle: float = 40.0) -> str:
    """The report after `idle` s with these services and no progress (timeout 30 s)."""
    clock = Clock()
    d, printed = doctor(tmp_path, clock)
    write(tmp_path / "heartbeat", 1, clock.t, services)
    assert d.check() is None  # first look: the progress counters' baseline
    clock.t += idle
    write(tmp_path / "heartbeat", 1, clock.t, services)
    report = d.check()
    assert report is not None and printed == [report]
    return report


def cause(report: str) -> str:
    return next(line.strip() for line in report.splitlines() if line.strip().startswith("cause:"))


def test_no_report_while_anything_progresses(tmp_path):
    clock = Clock()
    d, printed = doctor(tmp_path, clock)
    for i in range(10):  # 10 looks, 10 s apart: 100 s, but the trainer moves each time
        write(tmp_path / "heartbeat", 1, clock.t, {"trainer": service(i, clock.t)})
        assert d.check() is None
        clock.t += 10
    assert printed == []


def test_a_reward_that_never_returns_is_named(tmp_path):
    t0 = 1000.0
    report = stalled(
        tmp_path,
        {
            "explorer": service(7, t0, [("reward_fn 'sleepy'", "task add#3", t0 - 2)]),
            "trainer": service(3, t0, [("explorer", "8 experiences from the buffer", t0)]),
        },
    )
    assert report.startswith("stall: no part of the run has progressed for 40 s")
    assert "monitor.stall_timeout: 30 s" in report
    assert cause(report) == "cause: reward_fn 'sleepy' has not answered for 42 s (task add#3)"
    # the chain, from the oldest wait (the explorer's) on
    assert "explorer waits on reward_fn 'sleepy' (task add#3) for 42 s" in report


def test_the_chain_is_followed_from_the_oldest_wait_to_an_engine(tmp_path):
    t0 = 1000.0
    report = stalled(
        tmp_path,
        {
            "trainer": service(3, t0, [("explorer", "8 experiences from the buffer", t0 - 5)]),
            "explorer": service(9, t0, [("engine 0", "generate for 8 prompts", t0 - 1)]),
        },
    )
    lines = [x.strip() for x in report.splitlines()]
    i = lines.index("trainer waits on explorer (8 experiences from the buffer) for 45 s")
    assert lines[i + 1] == "explorer waits on engine 0 (generate for 8 prompts) for 41 s"
    assert lines[i + 2] == "cause: engine 0 has not answered for 41 s (generate for 8 prompts)"


def test_a_service_that_waits_on_nothing_is_stuck_in_its_own_code(tmp_path):
    t0 = 1000.0
    report = stalled(
        tmp_path,
        {
            "explorer": service(9, t0, [("trainer", "waiting for the trainer's weights v2", t0)]),
            "trainer": service(4, t0 - 3),  # no open wait: not reading, not publishing
        },
    )
    assert cause(report) == (
        "cause: trainer has not progressed for 43 s and waits on no other part of the run: it "
        "is stuck in its own code (see its stack)"
    )


def test_a_weight_load_that_never_lands_names_the_synchronizer(tmp_path):
    t0 = 1000.0
    load = ("synchronizer", "engine 0 loading weights v1 (checkpoint)", t0 - 1)
    report = stalled(
        tmp_path,
        {
            "explorer": service(9, t0, [load]),
            "trainer": service(3, t0, [("explorer", "8 experiences from the buffer", t0)]),
        },
    )
    assert cause(report).startswith("cause: synchronizer has not answered for 41 s")


def test_waits_on_each_other_are_a_deadlock(tmp_path):
    t0 = 1000.0
    report = stalled(
        tmp_path,
        {
            "explorer": service(9, t0, [("trainer", "weights v2", t0 - 1)]),
            "trainer": service(3, t0, [("explorer", "8 experiences", t0)]),
        },
    )
    assert cause(report) == "cause: the parts above wait on each other (a deadlock)"


def test_explorers_by_name_match_a_wait_on_the_kind(tmp_path):
    t0 = 1000.0
    report = stalled(
        tmp_path,
        {
            "trainer": service(3, t0, [("explorer", "8 experiences", t0 - 5)]),
            "explorer 'b'": service(9, t0, [("engine 1", "generate for 4 prompts", t0)]),
        },
    )
    assert "explorer 'b' waits on engine 1" in report
    assert cause(report).startswith("cause: engine 1 has not answered")


def test_warn_reports_once_per_timeout_and_fail_raises(tmp_path):
    clock = Clock()
    services = {"explorer": service(1, clock.t, [("engine 0", "generate", clock.t)])}
    d, printed = doctor(tmp_path, clock)
    write(tmp_path / "heartbeat", 1, clock.t, services)
    d.check()
    for _ in range(7):  # 7 looks over 70 s: reported at 30 s and again at 60 s
        clock.t += 10
        write(tmp_path / "heartbeat", 1, clock.t, services)
        d.check()
    assert len(printed) == 2

    f, _ = doctor(tmp_path / "f", clock, on_stall="fail")
    write(tmp_path / "f" / "heartbeat", 1, clock.t, services)
    f.check()
    clock.t += 31
    write(tmp_path / "f" / "heartbeat", 1, clock.t, services)
    with pytest.raises(RunStalled, match=r"monitor\.on_stall: fail"):
        f.check()


def test_the_automatic_timeout_is_ten_minutes_or_ten_slowest_steps(tmp_path):
    clock = Clock()
    d, _ = doctor(tmp_path, clock, timeout=None)
    assert d.limit() == 600.0
    for steps in range(4):  # a step every 100 s: the slowest is 100 s
        write(tmp_path / "heartbeat", 1, clock.t, {"trainer": service(steps, clock.t, steps=steps)})
        d.check()
        clock.t += 100
    assert d.limit() == 1000.0
    off, _ = doctor(tmp_path / "off", clock, timeout=0)
    clock.t += 10_000
    assert off.check() is None


def test_snapshots_from_before_the_doctor_are_ignored(tmp_path):
    clock = Clock()
    write(tmp_path / "heartbeat", 9, clock.t - 3600, {"explorer": service(1, clock.t - 3600)})
    d, _ = doctor(tmp_path, clock)
    assert d.snapshots() == []


def test_the_registry_records_progress_and_open_waits():
    heartbeat.reset()
    heartbeat.progress("trainer")
    heartbeat.step("trainer")
    with heartbeat.waiting("explorer", "engine 0", "generate"):
        snap = heartbeat.snapshot()["services"]
        assert snap["explorer"]["waits"][0][:2] == ["engine 0", "generate"]
    assert heartbeat.snapshot()["services"]["explorer"]["waits"] == []
    assert snap["trainer"]["progress"] == 2 and snap["trainer"]["steps"] == 1
    with pytest.raises(KeyError), heartbeat.waiting("explorer", "x"):
        raise KeyError("the wait ends however the block does")
    assert heartbeat.snapshot()["services"]["explorer"]["waits"] == []
    token = heartbeat.CURRENT.set("explorer 'a'")
    try:
        with heartbeat.waiting_here("reward_fn 'r'", "task 1"):
            assert (
                heartbeat.snapshot()["services"]["explorer 'a'"]["waits"][0][0] == "reward_fn 'r'"
            )
    finally:
        heartbeat.CURRENT.reset(token)
    heartbeat.reset()


def test_the_beacon_writes_snapshots_and_dumps_stacks_on_its_signal(tmp_path):
    heartbeat.reset()
    folder = heartbeat.start(tmp_path)
    try:
        with heartbeat.waiting("explorer", "engine 0", "generate"):
            time.sleep(heartbeat.BEAT_S * 1.5)
            files = list(folder.glob("*.json"))
            assert len(files) == 1
            snap = json.loads(files[0].read_text())
            assert snap["pid"] == os.getpid()
            assert snap["services"]["explorer"]["waits"][0][0] == "engine 0"
        os.kill(os.getpid(), heartbeat.STACK_SIGNAL)
        time.sleep(0.2)
        [stacks] = folder.glob("stacks-*.txt")
        text = stacks.read_text()
        assert "test_the_beacon_writes_snapshots_and_dumps_stacks_on_its_signal" in text
        assert "heartbeat" in text  # the beacon's own thread is there too
    finally:
        heartbeat.stop()
        signal.signal(heartbeat.STACK_SIGNAL, signal.SIG_DFL)
        heartbeat.reset()


def test_a_report_dumps_this_process_s_stacks(tmp_path):
    import socket

    clock = Clock()
    services = {"explorer": service(1, clock.t, [("engine 0", "generate", clock.t)])}
    d, _ = doctor(tmp_path, clock)
    write(tmp_path / "heartbeat", os.getpid(), clock.t, services, host=socket.gethostname())
    d.check()
    clock.t += 31
    write(tmp_path / "heartbeat", os.getpid(), clock.t, services, host=socket.gethostname())
    report = d.check()
    [stacks] = (tmp_path / "heartbeat").glob("stacks-*.txt")
    assert f"process {socket.gethostname()}-{os.getpid()} (all in {stacks})" in report
    assert "test_a_report_dumps_this_process_s_stacks" in stacks.read_text()
