"""The reward sandbox (trinity/rewards/sandbox.py): worker processes under CPU-time and memory
limits; a call past a limit is killed with its worker, which is replaced, and the pool keeps
working. One pool of one worker per test, so each replacement is visible as a new pid."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from tests.reward_fixtures import FOREVER_S
from trinity.rewards.guard import RewardFailed, reward_log, score_responses
from trinity.rewards.limits import RewardLimits
from trinity.rewards.sandbox import SandboxPool, close_pools, sandbox_pool
from trinity.tasks import Task

FIX = "tests.reward_fixtures."
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux rlimits")


@pytest.fixture(autouse=True)
def fresh_pools():
    """Each test starts with no pool (its counts are its own) and ends its workers."""
    close_pools()
    yield
    close_pools()


def sandboxed(**limits: Any) -> Task:
    return Task(
        index=5,
        raw={"question": "2+2"},
        prompt="2+2",
        truth="4",
        taskset_name="code",
        reward_fn_args={},
        reward_limits=RewardLimits(sandbox="subprocess", sandbox_workers=1, **limits),
    )


async def outcome(t: Task, name: str, response: str = "4") -> Any:
    try:
        return (await score_responses(t, name, [response]))[0]
    except RewardFailed as e:
        return e


def pool_of(t: Task) -> SandboxPool:
    return sandbox_pool(t.reward_limits)


def test_a_sandboxed_call_runs_in_a_reused_worker():
    t = sandboxed(timeout=60)

    async def go() -> list[Any]:
        return [await outcome(t, FIX + "pid"), await outcome(t, FIX + "pid")]

    first, second = asyncio.run(go())
    assert first["pid"] == second["pid"] != os.getpid()  # one worker, not a fork per call
    assert asyncio.run(outcome(t, "exact_match", "4")) == {"accuracy": 1.0}  # by registry name


def test_a_reward_over_its_memory_is_killed_and_the_pool_keeps_working():
    t = sandboxed(timeout=60, memory_mb=64)

    async def go() -> list[Any]:
        before = await outcome(t, FIX + "pid")
        failed = await outcome(t, FIX + "allocates")  # 1024 MiB > 64
        after = await outcome(t, FIX + "pid")
        return [before, failed, after]

    with reward_log() as log:
        before, failed, after = asyncio.run(go())
    assert isinstance(failed, RewardFailed) and failed.kind == "error"
    assert "exceeded memory_mb=64" in str(failed) and "MemoryError" in str(failed)
    assert after["accuracy"] == 1.0 and after["pid"] != before["pid"]  # replaced
    assert log.failed_tasks() == {"error": ["code#5"]}


def test_a_reward_that_spins_past_its_cpu_seconds_is_killed_and_replaced():
    t = sandboxed(cpu_seconds=1, timeout=FOREVER_S)  # only the CPU limit can stop it

    async def go() -> list[Any]:
        before = await outcome(t, FIX + "pid")
        t0 = time.perf_counter()
        failed = await outcome(t, FIX + "spins")
        took = time.perf_counter() - t0
        return [before, failed, took, await outcome(t, FIX + "pid")]

    before, failed, took, after = asyncio.run(go())
    assert isinstance(failed, RewardFailed) and failed.kind == "timeout"
    assert "cpu_seconds=1" in str(failed) and "SIGXCPU" in str(failed)
    # 1 to 2 CPU seconds (the limit is whole seconds over what the worker used), on a loaded
    # 2-core machine a few times that in wall time
    assert took < 30
    assert after["pid"] != before["pid"] and after["accuracy"] == 1.0


def test_a_sandboxed_call_past_its_timeout_is_killed_and_replaced():
    # 3 s: room for a fresh worker's first import of the fixtures on a loaded machine
    t = sandboxed(timeout=3.0)

    async def go() -> list[Any]:
        before = await outcome(t, FIX + "pid")
        t0 = time.perf_counter()
        failed = await outcome(t, FIX + "sleep_forever")
        took = time.perf_counter() - t0
        errors = await outcome(t, FIX + "raises")  # an exception leaves the worker in the pool
        return [before, failed, took, errors, await outcome(t, FIX + "pid")]

    before, failed, took, errors, after = asyncio.run(go())
    assert isinstance(failed, RewardFailed) and failed.kind == "timeout"
    assert 3.0 <= took < 3.0 + 5  # the timeout, plus killing the worker
    assert isinstance(errors, RewardFailed) and errors.kind == "error"
    assert "ValueError: the reward code broke" in str(errors)
    assert not isinstance(after, RewardFailed), f"{after} ({after.__dict__})"
    assert after["pid"] != before["pid"]  # the killed worker's replacement ...
    assert pool_of(t).started == 2  # ... and no other (the exception kept its worker)


def test_calls_beyond_the_pool_wait_for_a_worker():
    t = sandboxed(timeout=60)

    async def go() -> list[Any]:
        return await asyncio.gather(*(outcome(t, FIX + "pid") for _ in range(3)))

    results = asyncio.run(go())
    assert len({r["pid"] for r in results}) == 1  # three calls, one worker, taken in turn


def test_a_waiting_call_gets_the_replacement_of_a_killed_worker():
    t = sandboxed(timeout=3.0)  # room for the replacement's first import on a loaded machine

    async def go() -> list[Any]:
        return await asyncio.gather(outcome(t, FIX + "sleep_forever"), outcome(t, FIX + "pid"))

    hung, waited = asyncio.run(go())
    assert isinstance(hung, RewardFailed) and hung.kind == "timeout"
    assert not isinstance(waited, RewardFailed), f"{waited} ({waited.__dict__})"
    assert waited["accuracy"] == 1.0 and pool_of(t).started == 2
