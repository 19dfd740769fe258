"""Sample strategies (`algorithm.sample_strategy`, args in `sample_strategy_args`).

One signature: ``fn(experiences: list, **args) -> list`` selects and/or reorders the experiences
that one train step uses (e.g. mixing in an auxiliary SFT buffer, dropping stale ones). It must
not mutate its input list.
"""

from __future__ import annotations

from typing import Any

from trinity.common.registry import Registry

SAMPLE_STRATEGY: Registry = Registry("sample_strategy")


@SAMPLE_STRATEGY.register("default")
def default_sample_strategy(experiences: list[Any]) -> list[Any]:
    """Identity: every experience, in order (a new list)."""
    return list(experiences)


@SAMPLE_STRATEGY.register("staleness_control")
def staleness_control(experiences: list[Any], max_staleness: int | None = None) -> list[Any]:
    """Trinity-RFT's bound on off-policy lag, enforced by admission, not here: identity.

    `max_staleness = N`: explore step s may start only with weights of train step >= s - 1 - N
    (the explorer waits for them, `trinity.sync.schedule.admission_version`), so an experience is
    at most N versions older than the weights that train on it, and no finished rollout is
    thrown away. Upstream drops experiences older than that when the trainer reads instead, which
    wastes their rollouts. The trainer reports each batch's staleness (`staleness/*` metrics).
    None: no bound.
    """
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return list(experiences)


def max_staleness(sample_strategy: str | None, args: dict[str, Any]) -> int | None:
    """The admission bound a config sets (`staleness_control`'s `max_staleness`), or None."""
    if sample_strategy != "staleness_control":
        return None
    return args.get("max_staleness")
