"""Evaluation estimators: pass@k against its closed form and a brute-force count, maj@k and
the intervals with forced failures counted as wrong, the interval's 1/sqrt(n) narrowing."""

import itertools
import math

import numpy as np
import pytest

from trinity.explorer.eval_metrics import (
    TaskOutcome,
    bootstrap_ci,
    maj_at_k,
    maj_vote,
    pass_at_k,
    powers_of_two,
    taskset_metrics,
)


def _task(n, correct, answers=None, truncated=None, failed=False):
    answers = answers if answers is not None else ["ok" if c else "no" for c in correct]
    return TaskOutcome(
        n=n,
        correct=correct,
        scores=[float(c) for c in correct],
        answers=answers,
        truncated=truncated if truncated is not None else [False] * len(correct),
        failed=failed,
    )


@pytest.mark.parametrize("c", range(9))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_pass_at_k_is_the_closed_form_and_the_subset_count(c, k):
    n = 8
    closed = 1 - math.comb(n - c, k) / math.comb(n, k)  # Chen et al. 2021, eq. 1
    # the same by counting: the share of the k-subsets of n samples (c correct) holding one
    subsets = list(itertools.combinations(range(n), k))
    counted = sum(any(i < c for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(counted, abs=1e-12)


def test_pass_at_k_hand_values_and_bad_input():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 1, 1) == pytest.approx(1 / 8)  # pass@1 = c/n
    assert pass_at_k(8, 2, 2) == pytest.approx(1 - 15 / 28)  # C(6,2)=15, C(8,2)=28
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    assert powers_of_two(8) == [1, 2, 4, 8] and powers_of_two(6) == [1, 2, 4]
    assert powers_of_two(1) == [1]


def test_majority_vote_by_hand():
    assert maj_vote(["a", "a", "b"], [True, True, False]) == 1.0
    assert maj_vote(["a", "b", "b"], [True, False, False]) == 0.0
    assert maj_vote(["a", "b"], [True, False]) == 0.5  # a tie: half the tied answers correct
    assert maj_vote([None, None, "b"], [False, False, False]) == 0.0  # missing never wins
    assert maj_vote([None, None], [False, False]) == 0.0
    rng = np.random.default_rng(0)
    # answers a a b b, a correct: maj@2 over the 6 pairs: aa 1, bb 0, ab (4 pairs) 0.5 each
    assert maj_at_k(["a", "a", "b", "b"], [1, 1, 0, 0], 2, rng) == pytest.approx((1 + 4 * 0.5) / 6)
    # maj@1 = the share of correct answers
    assert maj_at_k(["a", "a", "b", "b"], [1, 1, 0, 0], 1, rng) == pytest.approx(0.5)


def test_forced_failures_count_as_wrong():
    # 50 tasks, n = 4: 40 answer right every time, 10 (20%) fail every try, and one of the 40
    # drops a sample (3 of 4 returned: the missing one is wrong)
    ok = [_task(4, [True] * 4) for _ in range(39)]
    dropped = _task(4, [True] * 3)
    failed = [_task(4, [], failed=True) for _ in range(10)]
    m = taskset_metrics([*ok, dropped, *failed], seed=1)
    assert m["avg@4"] == pytest.approx((39 + 0.75) / 50)  # = 0.795
    assert m["pass@1"] == pytest.approx((39 + 0.75) / 50)
    # pass@2 of the 3-of-4 task: 1 - C(1,2)/C(4,2) = 1; pass@4 too: 40 of 50 tasks
    assert m["pass@2"] == pytest.approx(40 / 50) and m["pass@4"] == pytest.approx(40 / 50)
    # maj@4 of the dropped task: three "ok" votes win; failed tasks have no answer: wrong
    assert m["maj@4"] == pytest.approx(40 / 50)
    assert m["failed"] == pytest.approx((10 * 4 + 1) / 200)
    assert m["truncated"] == 0.0
    for key in ("avg@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"):
        low, high = m[f"{key}_ci_low"], m[f"{key}_ci_high"]
        assert low < m[key] < high and high <= 1.0, key  # a failure rate of 20% leaves spread
    assert taskset_metrics([*ok, dropped, *failed], seed=1) == m  # seeded: deterministic


def test_truncation_and_no_answers():
    m = taskset_metrics(
        [_task(2, [True, False], answers=[None, "x"], truncated=[True, False])], seed=0
    )
    assert m["truncated"] == 0.5 and "maj@1" not in m  # a sample without text: no maj@k
    assert m["avg@2"] == m["avg@2_ci_low"] == m["avg@2_ci_high"] == 0.5  # one task: no spread
    with pytest.raises(ValueError, match="no tasks"):
        taskset_metrics([], seed=0)
    with pytest.raises(ValueError, match="differ in length"):
        TaskOutcome(n=2, correct=[True], scores=[], answers=[], truncated=[])


def test_interval_narrows_as_one_over_sqrt_tasks():
    # per-task values exactly half 1 and half 0: sd 0.5, so the 95% interval of the mean is
    # about 2 * 1.96 * 0.5 / sqrt(T). With 1000 resamples the 2.5%/97.5% quantiles each carry a
    # Monte Carlo error of about sqrt(.025 * .975 / 1000) / phi(1.96) ~ 0.085 standard errors,
    # ~3% of the 3.92-standard-error width, and the resampled mean is discrete in steps of 1/T:
    # 10% tolerance is several of those errors.
    widths = {}
    for tasks in (100, 400, 1600):
        values = [1.0, 0.0] * (tasks // 2)
        low, high = bootstrap_ci(values, np.random.default_rng(7))
        widths[tasks] = high - low
        assert widths[tasks] == pytest.approx(2 * 1.96 * 0.5 / math.sqrt(tasks), rel=0.10)
    # so 16x the tasks gives a quarter of the width, within the two widths' errors compounded
    assert widths[1600] / widths[100] == pytest.approx(0.25, rel=0.2)


def test_interval_of_samples_per_task_with_forced_failures():
    # the same 20%-failure fixture with 4x the tasks: the interval halves (1/sqrt(4))
    def fixture(copies):
        tasks = []
        for _ in range(copies):
            tasks += [_task(4, [True, True, False, True]) for _ in range(4)]
            tasks += [_task(4, [False, True, False, False]) for _ in range(4)]
            tasks += [_task(4, [], failed=True) for _ in range(2)]
        return taskset_metrics(tasks, seed=3)

    small, big = fixture(20), fixture(80)  # 200 and 800 tasks, 20% failed
    assert small["avg@4"] == big["avg@4"] == pytest.approx((4 * 0.75 + 4 * 0.25) / 10)
    assert small["failed"] == big["failed"] == pytest.approx(0.2)
    for key in ("avg@4", "pass@2", "maj@4"):
        ratio = (big[f"{key}_ci_high"] - big[f"{key}_ci_low"]) / (
            small[f"{key}_ci_high"] - small[f"{key}_ci_low"]
        )
        assert ratio == pytest.approx(0.5, rel=0.15), key


def test_an_eval_sets_experiences_become_metrics_and_records():
    from trinity.common.experience import Experience
    from trinity.explorer.evaluation import evaluation_report
    from trinity.tasks import Task

    def exp(text, acc, truncated=False):
        return Experience(
            tokens=[1, 2, 3], prompt_length=2, reward=acc, response_text=text,
            truncated=truncated, metrics={"accuracy": acc},
        )  # fmt: skip

    tasks = [Task(index=i, raw={}, prompt=f"q{i}") for i in range(3)]
    # task 0: 2 samples, one right; task 1 failed every try (absent); task 2 returned 1 of 2
    kept = [(0, [exp(" 5", 1.0), exp("6", 0.0, truncated=True)]), (2, [exp("7", 1.0)])]
    m, records = evaluation_report(
        "s", tasks, [2, 2, 2], kept, seed=0, detailed=True, decode=lambda e: ("p", e.response_text)
    )
    assert m["eval/s/accuracy"] == m["eval/s/avg@2"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert m["eval/s/pass@2"] == pytest.approx((1 + 0 + 1) / 3)
    assert m["eval/s/failed"] == pytest.approx(3 / 6) and m["eval/s/failed_tasks"] == 1.0
    assert m["eval/s/truncated"] == pytest.approx(1 / 3)  # of the 3 samples returned
    assert m["eval/s/maj@1"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    # detailed: per-task accuracy 0.5, 0, 0.5
    assert m["eval/s/accuracy/min"] == 0.0 and m["eval/s/accuracy/max"] == 0.5
    assert m["eval/s/accuracy/std"] == pytest.approx(math.sqrt(2 / 9) / 2)  # pstdev(.5, 0, .5)
    assert [(r["task"], r["sample"], r["correct"], r["failed"]) for r in records] == [
        (0, 0, True, False), (0, 1, False, False), (1, 0, False, True), (1, 1, False, True),
        (2, 0, True, False), (2, 1, False, True),
    ]  # fmt: skip
    assert records[2]["prompt"] == "q1" and records[2]["response"] is None
    no_records = evaluation_report("s", tasks, [2, 2, 2], kept, seed=0, detailed=False)
    assert no_records[1] == [] and "eval/s/accuracy/std" not in no_records[0]


def test_one_resampling_for_every_metric():
    # per-task values of pass@1 and avg@4 are equal: so are their intervals; pass@k's bounds
    # grow with k (the same resampled tasks, each task's pass@k growing with k)
    tasks = [_task(4, [i % 3 == 0, i % 5 == 0, False, i % 2 == 0]) for i in range(60)]
    m = taskset_metrics(tasks, seed=11)
    assert (m["pass@1_ci_low"], m["pass@1_ci_high"]) == (m["avg@4_ci_low"], m["avg@4_ci_high"])
    assert m["pass@1_ci_low"] <= m["pass@2_ci_low"] <= m["pass@4_ci_low"]
    assert m["pass@1_ci_high"] <= m["pass@2_ci_high"] <= m["pass@4_ci_high"]
