"""The weight-sync schedule, against hand-derived tables and a step-by-step simulation."""

import pytest

from trinity.sync.schedule import (
    explorer_syncs_after,
    trainer_publishes_after,
    version_for_explore_step,
    weights_version_after_explore_step,
)


def simulate(interval: int, offset: int, steps: int) -> list[int]:
    """Version used by each explore step, by walking the protocol one step at a time."""
    current, used = 0, []
    for s in range(1, steps + 1):
        used.append(current)
        if explorer_syncs_after(s, interval, offset):
            v = weights_version_after_explore_step(s, interval, offset)
            assert trainer_publishes_after(v, interval), (
                "explorer waits for a version never published"
            )
            assert v <= s, "explorer would wait for a train step whose data it has not produced"
            current = v
    return used


def test_on_policy_interval_1():
    # k=1, d=0: step s samples with the weights of train step s-1
    assert [version_for_explore_step(s, 1, 0) for s in range(1, 6)] == [0, 1, 2, 3, 4]


def test_one_step_off_policy():
    # k=1, d=1: steps 1 and 2 use v0; then step s uses v(s-2)
    assert [version_for_explore_step(s, 1, 1) for s in range(1, 7)] == [0, 0, 1, 2, 3, 4]
    assert not explorer_syncs_after(1, 1, 1)
    assert explorer_syncs_after(2, 1, 1) and weights_version_after_explore_step(2, 1, 1) == 1


def test_interval_3():
    # k=3, d=0: syncs after steps 3, 6 to v3, v6
    assert [version_for_explore_step(s, 3, 0) for s in range(1, 11)] == [
        0,
        0,
        0,
        3,
        3,
        3,
        6,
        6,
        6,
        9,
    ]
    assert [s for s in range(1, 11) if explorer_syncs_after(s, 3, 0)] == [3, 6, 9]
    assert [t for t in range(1, 11) if trainer_publishes_after(t, 3)] == [3, 6, 9]


def test_interval_2_offset_1():
    # k=2, d=1: syncs after steps 3, 5, 7 to v2, v4, v6
    assert [s for s in range(1, 9) if explorer_syncs_after(s, 2, 1)] == [3, 5, 7]
    assert [weights_version_after_explore_step(s, 2, 1) for s in (3, 5, 7)] == [2, 4, 6]
    assert [version_for_explore_step(s, 2, 1) for s in range(1, 9)] == [0, 0, 0, 2, 2, 4, 4, 6]


@pytest.mark.parametrize("interval", [1, 2, 3, 5])
@pytest.mark.parametrize("offset", [0, 1, 2, 4])
def test_closed_form_matches_simulation(interval, offset):
    steps = 30
    assert simulate(interval, offset, steps) == [
        version_for_explore_step(s, interval, offset) for s in range(1, steps + 1)
    ]


def test_staleness_bounded_by_interval_and_offset():
    for k in (1, 2, 4):
        for d in (0, 1, 3):
            for s in range(1, 40):
                staleness = (s - 1) - version_for_explore_step(s, k, d)
                assert 0 <= staleness <= k - 1 + d


def test_bad_values_raise():
    with pytest.raises(ValueError, match="sync_interval"):
        version_for_explore_step(1, 0, 0)
    with pytest.raises(ValueError, match="sync_offset"):
        explorer_syncs_after(1, 1, -1)


def test_sync_styles_pick_how_the_explorer_takes_weights():
    from trinity.sync.schedule import explorer_sync, versions_to_keep

    assert explorer_sync("fixed", trainer_in_run=True) == "schedule"
    assert explorer_sync("fixed", trainer_in_run=False) == "latest"  # mode explore
    assert explorer_sync("trainer_driven", trainer_in_run=True) == "latest"
    assert explorer_sync("explorer_driven", trainer_in_run=True) == "request"
    assert explorer_sync("explorer_driven", trainer_in_run=False) == "request"
    with pytest.raises(ValueError, match="valid: fixed"):
        explorer_sync("dynamic", trainer_in_run=True)
    # the trainer publishes unasked on the interval, except when the explorer drives
    assert [trainer_publishes_after(t, 2, "trainer_driven") for t in (1, 2, 3, 4)] == [
        False,
        True,
        False,
        True,
    ]
    assert not any(trainer_publishes_after(t, 1, "explorer_driven") for t in range(1, 10))
    # a dynamic style takes the newest: the newest and the one an engine may still be loading
    assert versions_to_keep(1, 5, True, "trainer_driven") == 2
    assert versions_to_keep(1, 5, True, "fixed") == 6


def test_admission_bound_and_when_it_cannot_be_met():
    from trinity.sync.schedule import admission_version, staleness_bound_problem

    # N = 1: explore step s starts with weights of train step >= s - 2 (never below 0)
    assert [admission_version(s, 1) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [admission_version(s, 0) for s in range(1, 5)] == [0, 1, 2, 3]  # on-policy
    assert admission_version(9, None) == 0
    # publishing every 3 steps, step s needs a multiple of 3 in [s-1-N, s-1]: N >= 2
    assert staleness_bound_problem("fixed", 3, 2) is None
    assert "sync_interval - 1 = 2" in staleness_bound_problem("trainer_driven", 3, 1)
    assert staleness_bound_problem("explorer_driven", 3, 0) is None  # publishes on request


def simulate_admission(interval: int, offset: int, bound: int, steps: int) -> list[int]:
    """fixed style + admission, walked step by step; the trainer trains as far as data allows."""
    current, used, published = 0, [], {0}
    for s in range(1, steps + 1):
        if s > 1 and explorer_syncs_after(s - 1, interval, offset):
            want = weights_version_after_explore_step(s - 1, interval, offset)
            current = max(current, want)
        oldest = max(0, s - 1 - bound)
        if current < oldest:
            current = min(v for v in published if v >= oldest)
        used.append(current)
        published |= {t for t in range(1, s + 1) if trainer_publishes_after(t, interval)}
        published = {v for v in published if v <= s}  # the trainer has data up to step s
    return used


@pytest.mark.parametrize("interval,offset,bound", [(1, 3, 1), (2, 0, 1), (1, 2, 0), (3, 5, 2)])
def test_admission_keeps_every_step_within_the_bound(interval, offset, bound):
    used = simulate_admission(interval, offset, bound, 20)
    ages = [s - 1 - v for s, v in zip(range(1, 21), used, strict=True)]
    assert max(ages) <= bound
    assert used == sorted(used)
