"""Collapse warnings (`trinity/explorer/collapse.py`): the distinct-response share of a step's
groups, the streak of low-diversity steps, the length drift and the one warning per streak."""

from __future__ import annotations

import pytest
import torch

from trinity.common.experience import EID, Experience
from trinity.explorer.collapse import CollapseWatch, distinct_response_frac
from trinity.explorer.rollout_stats import rollout_metrics


def sample(task: int, response: list[int], run: int = 0) -> Experience:
    return Experience(
        tokens=torch.tensor([7, 8, *response]),
        prompt_length=2,
        reward=0.0,
        eid=EID(batch=1, task=task, run=run),
    )


def test_distinct_share_by_hand():
    # task 0: 4 samples, 2 distinct -> 0.5; task 1: 2 samples, both distinct -> 1.0; task 2: one
    # sample, no group to judge
    step = [sample(0, [1, 2]), sample(0, [1, 2]), sample(0, [1, 3]), sample(0, [1, 2])]
    step += [sample(1, [5]), sample(1, [5, 6]), sample(2, [9])]
    assert distinct_response_frac(step) == pytest.approx((0.5 + 1.0) / 2)
    assert rollout_metrics(step, "rollout/")["rollout/distinct_response_frac"] == pytest.approx(
        0.75
    )
    assert distinct_response_frac([sample(2, [9])]) is None  # nothing to compare


def test_a_streak_of_low_diversity_warns_once_and_resets():
    watch = CollapseWatch(threshold=0.3, patience=2, baseline=2)
    steps = [(0.9, 10.0), (0.2, 10.0), (0.25, 6.0), (0.1, 5.0), (0.5, 5.0), (0.2, 5.0)]
    seen = []
    for i, (distinct, length) in enumerate(steps, start=1):
        report = {"rollout/distinct_response_frac": distinct, "rollout/response_length": length}
        metrics, warning = watch.observe(report, i)
        seen.append((metrics["collapse/low_diversity_steps"], metrics["collapse/warning"], warning))
    streaks = [s for s, _, _ in seen]
    assert streaks == [0, 1, 2, 3, 0, 1]
    assert [w for _, w, _ in seen] == [0, 0, 1, 1, 0, 0]
    warnings = [w for _, _, w in seen if w is not None]
    assert len(warnings) == 1 and "explore step 3" in warnings[0] and "30%" in warnings[0]
    # the length baseline is the mean of the first 2 steps (10): step 3's 6 is a 0.6 drift
    assert "0.60x" in warnings[0]


def test_a_threshold_of_0_turns_the_warning_off_but_keeps_the_drift():
    watch = CollapseWatch(threshold=0.0)
    metrics, warning = watch.observe(
        {"rollout/distinct_response_frac": 0.0, "rollout/response_length": 4.0}, 1
    )
    assert warning is None and metrics == {"collapse/response_length_drift": 1.0}
