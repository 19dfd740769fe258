"""The reward-function registry and contract.

    buffer.explorer_input.default_reward_fn_type: math_reward
    buffer.explorer_input.taskset.reward_fn_args: {format_score: 0.1}

A reward fn is `fn(response, truth, task_raw, **args) -> dict[str, float]`: named components whose
SUM is the experience's reward. By convention every fn returns an "accuracy" component in {0, 1}
(the eval metric), plus e.g. "format" for partial credit; a fn returns the same keys on every
call, so the monitor sees a steady set of metrics.
"""

from __future__ import annotations

from typing import Any, Protocol

from trinity.common.registry import Registry


class RewardFn(Protocol):
    def __call__(
        self, response: str, truth: str | None, task_raw: dict[str, Any], **args: Any
    ) -> dict[str, float]: ...


REWARD_FN: Registry[RewardFn] = Registry("reward_fn")


def require_truth(name: str, truth: str | None) -> str:
    """`truth`, or a ValueError saying the taskset has no reference answer (format.response_key)."""
    if truth is None:
        raise ValueError(
            f"{name}: the task has no reference answer; set the taskset's format.response_key"
        )
    return truth
