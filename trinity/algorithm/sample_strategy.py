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


@SAMPLE_STRATEGY.register("best_of_group")
def best_of_group(experiences: list[Any], min_reward: float | None = None) -> list[Any]:
    """RAFT's selection: each group's (task's) highest-rewarded experience, first among ties.

    `min_reward`: drop a group whose best reward is below it (None: keep every group's best),
    so a batch of only failed attempts trains nothing rather than imitating a failure. Order:
    the groups' first appearance.

    Paper: "RAFT: Reward rAnked FineTuning for Generative Foundation Model Alignment"
    (arXiv:2304.06767).
    """
    best: dict[Any, Any] = {}
    for e in experiences:
        key = e.eid.group
        reward = float("-inf") if e.reward is None else e.reward
        if key not in best or reward > (best[key].reward or float("-inf")):
            best[key] = e
    return [e for e in best.values() if min_reward is None or (e.reward or 0.0) >= min_reward]


def max_staleness(sample_strategy: str | None, args: dict[str, Any]) -> int | None:
    """The admission bound a config sets (`staleness_control`'s `max_staleness`), or None."""
    if sample_strategy != "staleness_control":
        return None
    return args.get("max_staleness")
