"""What an evaluation reports per taskset: avg@n, unbiased pass@k, maj@k, each with a 95% interval.

    report = taskset_metrics([TaskOutcome(n=4, correct=[1, 0, 1], answers=[...], truncated=[...])],
                             seed=key)   # {"avg@4": ..., "pass@2": ..., "pass@2_ci_low": ..., ...}

Every task has `n` sample slots (its sampling's `n`). The denominator is honest: a sample that
did not come back (the task's workflow failed every try or timed out: `failed`; or it returned
fewer than `n` experiences: dropped) counts as wrong, and the share of such slots is reported
beside the scores (`failed`). Samples are i.i.d. draws per task, so:

- avg@n = mean over tasks of (1/n) sum_i score_i (a sample's score: its `accuracy`, else its
  reward; a missing slot scores 0). With n = 1 and greedy sampling it is plain accuracy.
- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1, the
  unbiased estimator): with c correct of n samples of a task,
  pass@k = E_tasks[1 - C(n-c, k) / C(n, k)], for every k <= n that is a power of two.
  pass@1 = avg@n when scores are 0/1.
- maj@k: a task is solved when the most frequent answer among k of its samples is correct (a tie
  between answers counts as the tied answers' share of correct ones: the expectation under a
  random tie-break); averaged over the C(n, k) subsets of its samples (enumerated when there are
  at most `MAJ_SUBSETS`, else that many drawn with the seed). Only for sets whose samples carry an
  answer (the response text, stripped); a missing slot is an answer that is never correct.
- The interval of each is a seeded percentile bootstrap over tasks (the task is the unit that is
  resampled; `BOOTSTRAP_REPS` resamples, the same ones for every metric), so its width shrinks as
  1/sqrt(number of tasks).
- With the tie rule, maj@2 equals maj@1 in expectation (p^2 + 2p(1-p)/2 = p for two samples that
  agree or split), as it does for majority voting in general.

Departs from Trinity-RFT, which reports `mean@n`, `std@n` and bootstrap `best@k`/`worst@k` of each
metric and counts failed tasks out of the denominator.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_REPS = 1000
CI_LEVEL = 0.95
MAJ_SUBSETS = 256


@dataclass(frozen=True)
class TaskOutcome:
    """One eval task's samples as they came back: `n` slots planned, one entry per sample
    returned (`correct` 0/1, `score` in [0, 1], `answers` comparable text or None, `truncated`)."""

    n: int
    correct: Sequence[bool]
    scores: Sequence[float]
    answers: Sequence[str | None]
    truncated: Sequence[bool]
    failed: bool = False  # the workflow failed every try: no sample came back

    def __post_init__(self) -> None:
        got = len(self.correct)
        if not (len(self.scores) == len(self.answers) == len(self.truncated) == got):
            raise ValueError("TaskOutcome: correct, scores, answers and truncated differ in length")
        if self.n < 1:
            raise ValueError(f"TaskOutcome: n must be at least 1, got {self.n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task (Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k), the
    chance that k of its n samples drawn without replacement hold at least one of the c correct.
    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) (their numerically stable form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def maj_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """1 when the most frequent answer is a correct one, 0 when not; among tied answers, the
    share of them that are correct. Missing answers (None) never win a vote."""
    right = {a for a, c in zip(answers, correct, strict=True) if c and a is not None}
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [a for a, v in votes.items() if v == top]
    return sum(a in right for a in tied) / len(tied)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int, rng) -> float:
    """maj@k of one task: `maj_vote` averaged over k-subsets of its samples (all of them when
    there are at most MAJ_SUBSETS, else MAJ_SUBSETS drawn with `rng`)."""
    n = len(answers)
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets = list(itertools.combinations(range(n), k))
    else:
        subsets = [rng.choice(n, size=k, replace=False) for _ in range(MAJ_SUBSETS)]
    return float(
        np.mean([maj_vote([answers[i] for i in s], [correct[i] for i in s]) for s in subsets])
    )


def bootstrap_ci(values: Sequence[float], rng, reps: int = BOOTSTRAP_REPS) -> tuple[float, float]:
    """Percentile bootstrap interval (level CI_LEVEL) of the mean of `values` (one per task):
    `reps` resamples of the tasks with replacement."""
    v = np.asarray(values, dtype=float)
    means = v[rng.integers(0, len(v), size=(reps, len(v)))].mean(axis=1)  # [reps]
    tail = (1 - CI_LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    return [2**i for i in range(n.bit_length()) if 2**i <= n]


def _padded(values: Sequence, n: int, fill) -> list:
    """A task's per-slot values: those returned (at most n), then `fill` for missing slots."""
    return [*values[:n], *[fill] * max(0, n - len(values))]


def taskset_metrics(outcomes: Sequence[TaskOutcome], seed: int) -> dict[str, float]:
    """avg@n, pass@k and maj@k (k a power of two <= n) with `_ci_low`/`_ci_high`, and the share of
    truncated and of missing (failed, timed-out or dropped) samples, over a taskset's tasks.
    `n` is the smallest `n` of the tasks (they share one in a taskset); maj@k only when every
    returned sample carries an answer. Deterministic for `seed`."""
    if not outcomes:
        raise ValueError("taskset_metrics: no tasks")
    n = min(o.n for o in outcomes)
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}

    def add(name: str, per_task: Callable[[TaskOutcome], float]) -> None:
        values = [per_task(o) for o in outcomes]
        out[name] = float(np.mean(values))
        # the same resamples of the tasks for every metric (a fresh generator from `seed`): equal
        # per-task values get equal intervals, and pass@k's bounds grow with k as pass@k does
        ci = bootstrap_ci(values, np.random.default_rng(seed))
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = ci

    add(f"avg@{n}", lambda o: float(np.mean(_padded(o.scores, n, 0.0))))
    for k in powers_of_two(n):
        add(f"pass@{k}", lambda o, k=k: pass_at_k(n, sum(_padded(o.correct, n, False)), k))
    if all(a is not None for o in outcomes for a in o.answers):
        for k in powers_of_two(n):
            add(
                f"maj@{k}",
                lambda o, k=k: maj_at_k(
                    _padded(o.answers, n, None), _padded(o.correct, n, False), k, rng
                ),
            )
    returned = sum(min(len(o.correct), n) for o in outcomes)
    out["failed"] = 1.0 - returned / (n * len(outcomes))
    out["truncated"] = sum(sum(o.truncated[:n]) for o in outcomes) / returned if returned else 0.0
    return out


def spread(per_task: Sequence[float]) -> dict[str, float]:
    """std (population), min and max over tasks (`monitor.detailed_stats`)."""
    v = np.asarray(per_task, dtype=float)
    return {"std": float(v.std()), "min": float(v.min()), "max": float(v.max())}
