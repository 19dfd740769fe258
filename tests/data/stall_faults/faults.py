"""Faults for tests/test_stall_runs.py, chosen by the STALL_FAULT environment variable: each
blocks one part of a run forever, as a hung reward, engine, trainer or weight sync would."""

from __future__ import annotations

import os
import threading

from trinity.rewards.base import REWARD_FN

FAULT = os.environ.get("STALL_FAULT", "")
_NEVER = threading.Event()


def hang() -> None:
    """Block this thread for good (the run's stall ends it)."""
    _NEVER.wait()


@REWARD_FN.register("sleepy_reward")
def sleepy_reward(response: str, truth: str | None, task_raw: dict, **args: object) -> dict:
    hang()
    return {"accuracy": 0.0}


def _after(n: int, method):
    """`method` for its first `n` calls, then a hang."""
    calls = [0]

    def patched(*args, **kwargs):
        calls[0] += 1
        if calls[0] > n:
            hang()
        return method(*args, **kwargs)

    return patched


if FAULT == "engine":
    from trinity.explorer.engine import HFRolloutEngine

    HFRolloutEngine.generate_stream = _after(1, HFRolloutEngine.generate_stream)
elif FAULT == "trainer":
    from trinity.trainer.runner import TrainerRunner

    TrainerRunner._read = _after(1, TrainerRunner._read)
elif FAULT == "sync":
    from trinity.sync.checkpoint import CheckpointSync

    CheckpointSync.receive = _after(0, CheckpointSync.receive)
