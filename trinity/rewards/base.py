"""The reward-function registry and contract.

    buffer.explorer_input.default_reward_fn_type: math_reward
    buffer.explorer_input.taskset.reward_fn_args: {format_score: 0.1}

A reward fn is `fn(response, truth, task_raw, **args) -> dict[str, float]`: named components whose
SUM is the experience's reward. It names the keyword arguments it accepts, so pre-flight checks
`reward_fn_args` against them (a `**kwargs` catch-all turns that check off); a fn that cannot score
without the reference answer is decorated with `@needs_truth`, so pre-flight requires
`format.response_key` on every row of the tasksets it scores; one that reads fields of the task
row is decorated with `@needs_task_fields("numbers", "target")`, so every row must hold them. By convention every fn returns an "accuracy" component in {0, 1}
(the eval metric), plus e.g. "format" for partial credit; a fn returns the same keys on every
call, so the monitor sees a steady set of metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from trinity.common.registry import Registry


class RewardFn(Protocol):
    def __call__(
        self, response: str, truth: str | None, task_raw: dict[str, Any], **args: Any
    ) -> dict[str, float]: ...


REWARD_FN: Registry[RewardFn] = Registry("reward_fn")
F = TypeVar("F")


def needs_truth(fn: F) -> F:
    """Mark a reward fn that needs the task's reference answer (`truth` not None)."""
    fn.needs_truth = True  # type: ignore[attr-defined]
    return fn


def needs_task_fields(*fields: str) -> Callable[[F], F]:
    """Mark a reward fn that reads these fields of the task row (`task_raw`): pre-flight and the
    taskset loader refuse a row without one of them, naming its file and line."""

    def mark(fn: F) -> F:
        fn.task_fields = fields  # type: ignore[attr-defined]
        return fn

    return mark


def require_truth(name: str, truth: str | None) -> str:
    """`truth`, or a ValueError saying the taskset has no reference answer (format.response_key)."""
    if truth is None:
        raise ValueError(
            f"{name}: the task has no reference answer; set the taskset's format.response_key"
        )
    return truth
