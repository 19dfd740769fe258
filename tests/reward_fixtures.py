"""Reward fns that misbehave on purpose, importable by dotted path (`tests.reward_fixtures.<fn>`)
in the reward sandbox's worker processes (tests/test_reward_guard.py, test_reward_sandbox.py).

`by_reply` does what its response says: "hang" sleeps (about forever), "raise" raises, "nan"
returns NaN, anything else is scored against the truth, so one taskset can mix all of them.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

FOREVER_S = 3600.0


def sleep_forever(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    time.sleep(FOREVER_S)
    return {"accuracy": 1.0}


async def sleep_forever_async(
    response: str, truth: str | None, task_raw: dict[str, Any]
) -> dict[str, float]:
    await asyncio.sleep(FOREVER_S)
    return {"accuracy": 1.0}


def raises(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    raise ValueError("the reward code broke")


def returns_nan(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    return {"accuracy": 1.0, "format": float("nan")}


def allocates(
    response: str, truth: str | None, task_raw: dict[str, Any], mb: int = 1024
) -> dict[str, float]:
    """Allocate `mb` MiB and touch it."""
    block = bytearray(mb * 2**20)
    return {"accuracy": float(len(block) > 0)}


def spins(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    """Burn CPU forever (no sleep: wall clock and CPU time grow together)."""
    x = 0
    while True:
        x += 1


def pid(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    """The worker's process id as a component (which worker ran the call)."""
    return {"accuracy": 1.0, "pid": float(os.getpid())}


def by_reply(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    if "hang" in response:
        time.sleep(FOREVER_S)
    if "raise" in response:
        raise ValueError(f"cannot score {response!r}")
    if "nan" in response:
        return {"accuracy": float("nan")}
    return {"accuracy": float(truth is not None and truth in response)}


def own_timeout(
    response: str, truth: str | None, task_raw: dict[str, Any], timeout: float = 1.0
) -> dict[str, float]:
    """A fn with an argument named like a limit key (pre-flight tells the user)."""
    return {"accuracy": 1.0}
