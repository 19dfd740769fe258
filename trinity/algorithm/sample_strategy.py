"""Sample strategies (`algorithm.sample_strategy`, args in `sample_strategy_args`).

One signature: ``fn(experiences: list, ctx: SampleContext, **args) -> list`` selects, reorders or
adds to the experiences that one train step uses (e.g. mixing in an auxiliary SFT buffer). It
must not mutate its input list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity.common.registry import Registry

SAMPLE_STRATEGY: Registry = Registry("sample_strategy")


@dataclass(frozen=True)
class SampleContext:
    """What a strategy may read besides the step's experiences.

    Fields:
        step: the train step being assembled (1-based).
        auxiliary: `buffer.trainer_input.auxiliary_buffers` by name: reader(n) returns the
            buffer's next n experiences (cycling over its rows).
        planned_rows: (rollouts, expert rows) of a full train step as the config resolved them
            (`config.resolved.mixed_rows`); None = not planned.
    """

    step: int = 1
    auxiliary: Mapping[str, Callable[[int], list[Any]]] = field(default_factory=dict)
    planned_rows: tuple[int, int] | None = None


@SAMPLE_STRATEGY.register("default")
def default_sample_strategy(experiences: list[Any], ctx: SampleContext) -> list[Any]:
    """Identity: every experience, in order (a new list)."""
    del ctx
    return list(experiences)


@SAMPLE_STRATEGY.register("staleness_control")
def staleness_control(
    experiences: list[Any], ctx: SampleContext, max_staleness: int | None = None
) -> list[Any]:
    """Trinity-RFT's bound on off-policy lag, enforced by admission, not here: identity.

    `max_staleness = N`: explore step s may start only with weights of train step >= s - 1 - N
    (the explorer waits for them, `trinity.sync.schedule.admission_version`), so an experience is
    at most N versions older than the weights that train on it, and no finished rollout is
    thrown away. Upstream drops experiences older than that when the trainer reads instead, which
    wastes their rollouts. The trainer reports each batch's staleness (`staleness/*` metrics).
    None: no bound.
    """
    del ctx
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return list(experiences)


@SAMPLE_STRATEGY.register("best_of_group")
def best_of_group(
    experiences: list[Any], ctx: SampleContext, min_reward: float | None = None
) -> list[Any]:
    """RAFT's selection: each group's (task's) highest-rewarded experience, first among ties.

    `min_reward`: drop a group whose best reward is below it (None: keep every group's best),
    so a batch of only failed attempts trains nothing rather than imitating a failure. Order:
    the groups' first appearance.

    Paper: "RAFT: Reward rAnked FineTuning for Generative Foundation Model Alignment"
    (arXiv:2304.06767).
    """
    del ctx
    best: dict[Any, Any] = {}
    for e in experiences:
        key = e.eid.group
        reward = float("-inf") if e.reward is None else e.reward
        if key not in best or reward > (best[key].reward or float("-inf")):
            best[key] = e
    return [e for e in best.values() if min_reward is None or (e.reward or 0.0) >= min_reward]


@SAMPLE_STRATEGY.register("mix")
def mix_sample_strategy(
    experiences: list[Any],
    ctx: SampleContext,
    expert_data_ratio: float = 0.5,
    sft_dataset_name: str = "sft_dataset",
) -> list[Any]:
    """The step's rollouts plus expert (SFT) experiences from an auxiliary buffer, marked
    `info["is_expert"] = True`, so that experts are `expert_data_ratio` of the batch. A full
    step takes the count the config resolved (`ctx.planned_rows`, `config.resolved.mixed_rows`:
    Trinity-RFT's ceil(ρ · train_batch_size) when `buffer.train_batch_size` is written); a step
    of other size (the last, when the data ran out), and a step planned by nobody:

        n_expert = ceil(ρ / (1 - ρ) · n_rollouts)

    Mixed-policy losses (`mix`, `mix_chord`) train the two parts apart.

    Papers: LUFFY, "Learning to Reason under Off-Policy Guidance" (arXiv:2504.14945); CHORD,
    "On-Policy RL Meets Off-Policy Experts" (arXiv:2508.11408).

    Args:
        ctx: its `auxiliary[sft_dataset_name]` reader supplies the experts.
        expert_data_ratio: ρ in [0, 1).
        sft_dataset_name: the auxiliary buffer's name (`buffer.trainer_input.auxiliary_buffers`).
    """
    if not 0 <= expert_data_ratio < 1:
        raise ValueError(f"expert_data_ratio must be in [0, 1), got {expert_data_ratio}")
    n_expert = math.ceil(expert_data_ratio / (1 - expert_data_ratio) * len(experiences))
    if ctx.planned_rows is not None and ctx.planned_rows[0] == len(experiences):
        n_expert = ctx.planned_rows[1]
    if n_expert == 0:
        return list(experiences)
    if sft_dataset_name not in ctx.auxiliary:
        raise ValueError(
            f"sample_strategy mix reads buffer.trainer_input.auxiliary_buffers.{sft_dataset_name}"
            f", which is not configured (have: {sorted(ctx.auxiliary) or 'none'})"
        )
    experts = ctx.auxiliary[sft_dataset_name](n_expert)
    for e in experts:
        e.info["is_expert"] = True
    return [*experiences, *experts]


def max_staleness(sample_strategy: str | None, args: dict[str, Any]) -> int | None:
    """The admission bound a config sets (`staleness_control`'s `max_staleness`), or None."""
    if sample_strategy != "staleness_control":
        return None
    return args.get("max_staleness")
