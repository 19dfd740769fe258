"""What a step's rollouts report: reward, length, truncation, flat-group and distinct-response
shares."""

from __future__ import annotations

import statistics

from trinity.common.experience import Experience
from trinity.explorer.collapse import distinct_response_frac


def rollout_metrics(experiences: list[Experience], prefix: str) -> dict[str, float]:
    """Mean/std reward, mean of every metric (over the experiences that carry it), length,
    truncation, flat-group share, distinct-response share (`collapse.py`)."""
    rewards = [e.reward or 0.0 for e in experiences]
    out = {
        f"{prefix}reward_mean": statistics.fmean(rewards),
        f"{prefix}reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        f"{prefix}response_length": statistics.fmean(e.response_length for e in experiences),
        f"{prefix}truncated_frac": statistics.fmean(float(e.truncated) for e in experiences),
    }
    components = sorted({k for e in experiences for k in e.metrics})
    for k in components:  # over the experiences that report it (a judge's agreement: judged ones)
        out[f"{prefix}{k}_mean"] = statistics.fmean(
            e.metrics[k] for e in experiences if k in e.metrics
        )
    groups: dict[tuple, list[float]] = {}
    for e, r in zip(experiences, rewards, strict=True):
        groups.setdefault(e.eid.group, []).append(r)
    multi = [g for g in groups.values() if len(g) > 1]
    if multi:
        out[f"{prefix}flat_group_frac"] = statistics.fmean(float(len(set(g)) == 1) for g in multi)
    if (distinct := distinct_response_frac(experiences)) is not None:
        out[f"{prefix}distinct_response_frac"] = distinct
    return out
