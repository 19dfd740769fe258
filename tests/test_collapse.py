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


@pytest.mark.slow  # a whole run (10-20 s on 2 cores)
def test_a_run_whose_samples_are_all_alike_warns_at_the_patience(tmp_path, tiny_model_dir):
    """Greedy sampling gives every task 4 identical samples (a distinct share of 1/4, under the
    0.3 threshold): the warning comes at step 2 (patience 2), once, with its metrics."""
    import json

    from test_e2e import grpo_config, run_trinity

    config = grpo_config(tmp_path, tiny_model_dir)
    r = run_trinity(
        config,
        overrides=[
            "buffer.explorer_input.taskset.rollout_args.temperature=0",
            "monitor.collapse_threshold=0.3",
            "monitor.collapse_patience=2",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert out.count("may be collapsing") == 1 and "explore step 2:" in out
    recs = [json.loads(x) for x in (tmp_path / "ckpt/e2e/grpo/metrics.jsonl").open()]
    steps = [x for x in recs if "rollout/distinct_response_frac" in x]
    assert [x["rollout/distinct_response_frac"] for x in steps] == [0.25] * 3
    assert [x["collapse/warning"] for x in steps] == [0.0, 1.0, 1.0]
