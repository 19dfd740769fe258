"""The start-up timeline's pieces (`trinity.common.startup`); the whole timeline of a run is
checked by `test_e2e.py::test_grpo_end_to_end`."""

from __future__ import annotations

import subprocess
import sys
import time

from trinity.common.startup import PHASES, StartupMarks, process_started_at, timeline


def test_a_process_start_is_read_from_proc_within_a_few_clock_ticks():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    after = time.time()
    try:
        started = process_started_at(child.pid)
    finally:
        child.kill()
        child.wait()
    tick = 0.03  # /proc/uptime and the start tick are 10 ms each (USER_HZ = 100), + slack
    assert before - tick <= started <= after + tick, (before, started, after)
    assert process_started_at() <= time.time()


def test_an_actor_s_marks_start_with_its_process_and_its_imports():
    marks = StartupMarks("engine")
    assert set(marks.marks) == {"engine_process", "engine_imports"}
    assert marks.marks["engine_process"] <= marks.marks["engine_imports"] <= time.time()


def test_marks_keep_their_first_time_and_are_reported_once():
    marks = StartupMarks()
    marks.mark("config", at=100.0)
    marks.mark("config", at=200.0)  # already marked: the first stays
    marks.mark("ray", at=103.5)
    assert marks.as_metrics(None) == {}  # no start to count from: nothing, and still unreported
    assert marks.as_metrics(99.0) == {"startup/config_s": 1.0, "startup/ray_s": 4.5}
    assert marks.as_metrics(99.0) == {}  # the first step's record only


def test_the_timeline_line_follows_the_phases_order():
    record = {"startup/first_update_s": 9.25, "startup/config_s": 1.0, "startup/ray_s": 3.04}
    assert timeline(record) == "config 1.0 → ray 3.0 → first update 9.2 s"
    assert timeline({"train/loss": 1.0}) == ""
    assert PHASES.index("first_rollout") < PHASES.index("first_update")


def test_a_process_gone_counts_from_now():
    no_such_pid = 2**22 + 17  # above Linux's largest pid_max (2^22): never a live process
    before = time.time()
    assert before <= process_started_at(no_such_pid) <= time.time()
