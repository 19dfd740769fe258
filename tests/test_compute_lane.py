"""The compute lane (`trinity.common.compute`): a process's model work on one thread.

By hand: a lane runs its calls on one thread that is not the caller's, in the order they came,
and hands back results and errors; a call made from the lane runs at once (waiting for the lane
from the lane would never end). Engines on a lane (`InThread(lane=...)`) and the trainer
(`TrainerRunner`) put their work there: two engines' calls take turns on the one thread, and
closing one leaves the lane serving the other. The reason for the lane, shown on torch itself:
under OpenMP a thread count is per thread, so a count set on one thread does not reach work on
another.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trinity.common.compute import ComputeLane, compute_lane
from trinity.explorer.in_process import InThread


def test_calls_run_in_order_on_one_thread_that_is_not_the_callers():
    lane = ComputeLane()
    log: list[tuple[int, int]] = []

    def job(i: int, seconds: float) -> int:
        time.sleep(seconds)
        log.append((i, threading.get_ident()))
        return i * 10

    # submitted 0, 1, 2 with the first the slowest: a pool of threads would finish it last
    futures = [lane.submit(job, i, 0.03 * (3 - i)) for i in range(3)]
    assert [f.result() for f in futures] == [0, 10, 20]
    assert [i for i, _ in log] == [0, 1, 2]
    threads = {t for _, t in log}
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert not lane.here()
    assert lane.run(lane.here)


def test_run_hands_back_the_error_and_the_lane_goes_on():
    lane = ComputeLane()

    def fail() -> None:
        raise ValueError("no room")

    with pytest.raises(ValueError, match="no room"):
        lane.run(fail)
    assert lane.run(lambda: 7) == 7


def test_a_call_from_the_lane_runs_at_once_instead_of_waiting_for_itself():
    lane = ComputeLane()

    def outer() -> tuple[int, int]:
        return threading.get_ident(), lane.run(threading.get_ident)

    done = lane.submit(outer)
    outer_thread, inner_thread = done.result(timeout=10)  # a deadlock would time out here
    assert outer_thread == inner_thread


def test_the_process_has_one_lane():
    with ThreadPoolExecutor(4) as pool:
        lanes = list(pool.map(lambda _: compute_lane(), range(8)))
    assert all(lane is lanes[0] for lane in lanes)


class _Recorder:
    def __init__(self, tag: str, log: list) -> None:
        self.tag, self.log = tag, log
        log.append((tag, "built", threading.get_ident()))

    def work(self, x: int, seconds: float = 0.0) -> int:
        time.sleep(seconds)
        self.log.append((self.tag, x, threading.get_ident()))
        return x


def test_engines_on_one_lane_take_turns_on_its_thread():
    lane = ComputeLane()
    log: list = []
    a = InThread(lambda: _Recorder("a", log), lane=lane)
    b = InThread(lambda: _Recorder("b", log), lane=lane)

    async def main() -> list[int]:
        # interleaved a, b, a, b; the earlier calls are the slower ones
        calls = [(a, 0, 0.04), (b, 1, 0.03), (a, 2, 0.02), (b, 3, 0.01)]
        return await asyncio.gather(*(e.work.remote(x, s) for e, x, s in calls))

    assert asyncio.run(main()) == [0, 1, 2, 3]
    assert [(tag, x) for tag, x, _ in log] == [
        ("a", "built"),
        ("b", "built"),
        ("a", 0),
        ("b", 1),
        ("a", 2),
        ("b", 3),
    ]
    assert {t for *_, t in log} == {lane.run(threading.get_ident)}
    a.close()
    b.close()


def test_closing_an_engine_cancels_its_queued_calls_and_leaves_the_lane_to_the_others():
    lane = ComputeLane()
    log: list = []
    a = InThread(lambda: _Recorder("a", log), lane=lane)
    b = InThread(lambda: _Recorder("b", log), lane=lane)
    gate = threading.Event()
    blocker = lane.submit(gate.wait)  # holds the lane so that a's calls stay queued

    async def queue_then_close() -> list:
        pending = [asyncio.ensure_future(a.work.remote(i)) for i in range(3)]
        await asyncio.sleep(0)
        threading.Timer(0.1, gate.set).start()
        a.close()  # cancels a's queued calls, waits for none running
        return await asyncio.gather(*pending, return_exceptions=True)

    results = asyncio.run(queue_then_close())
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert blocker.result(timeout=10) is True

    async def after() -> int:
        return await b.work.remote(5)

    assert asyncio.run(after()) == 5  # the lane serves b
    assert ("a", 0) not in [(tag, x) for tag, x, _ in log]

    async def closed() -> int:
        return await a.work.remote(1)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(closed())
    b.close()


TORCH_THREADS = """
import ctypes, glob, os, threading, torch
from trinity.common.compute import ComputeLane
gomp = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*"))[0])
torch.set_num_threads(2)  # on this thread only
seen = []
t = threading.Thread(target=lambda: seen.append(gomp.omp_get_max_threads()))
t.start(); t.join()
lane = ComputeLane()
lane.run(torch.set_num_threads, 2)
print(gomp.omp_get_max_threads(), seen[0], lane.run(gomp.omp_get_max_threads))
"""


def test_a_thread_count_is_the_setting_threads_own_and_the_lane_keeps_it():
    """Why the trainer builds and steps on one thread: under OpenMP a count set on one thread
    is not another thread's (with OMP_NUM_THREADS=1, as Ray sets for an actor without CPUs,
    another thread computes with one), and the count set on the lane is the lane's."""
    import torch

    gomp = list((Path(torch.__file__).parent / "lib").glob("libgomp*"))
    if "OpenMP" not in torch.__config__.parallel_info() or not gomp:
        pytest.skip("torch does not use GNU OpenMP here")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", TORCH_THREADS], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["2", "1", "2"]
