"""Curricula: task selectors that order a taskset by difficulty (Trinity-RFT's names).

    data_selector:
      selector_type: difficulty_based          # BOTS: learns each task's pass rate online
      feature_keys: [ref_pass_rate_7b, ref_pass_rate_30b]   # 0, 1 or 2 offline columns
      kwargs: {m: 16, lamb: 0.1, rho: 0.1, target_reward: 0.5, tau: 0, do_sample: true}

- `offline_easy2hard`: the tasks sorted once by their `feature_keys` columns, highest first
  (higher = easier), served in that order every epoch.
- `difficulty_based`: BOTS ("Bayesian Online Task Selection", Trinity-RFT's
  `DifficultyBasedSelector`): each task's pass rate p has a Beta(α, β) posterior
  (`BetaPassRates`), updated after every explore step from its tasks' observed pass rates; each
  batch favours the tasks whose (sampled, with `do_sample`) pass rate is nearest
  `target_reward`: scores s = -|target - p|, the top `batch_size` (`tau` 0) or a draw without
  replacement with probabilities softmax(s / tau). `staleness_coef` (ours; Prioritized Level
  Replay's staleness term, Jiang et al. 2021) draws that share of every batch by how long each
  task has gone undrawn, so a task whose estimate says "solved" or "hopeless" is looked at
  again: a pass rate can fall as well as rise, and only a draw shows it.

Unlike Trinity-RFT's, whose state is its position alone, the posterior, the random draws and
the batch being served are the selector's state: it travels with the explorer's cursor in the
buffer (`Cursor.selector`), so a resumed run selects exactly what the uninterrupted run would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from trinity.tasks.selector import SELECTORS, TaskSelector


def feature_matrix(tasks: Sequence[Any], keys: Sequence[str]) -> np.ndarray:
    """[N, len(keys)] float: each task's row value of each key (a dotted key reads nested
    dicts). A task without the value raises naming it."""
    out = np.zeros((len(tasks), len(keys)), dtype=float)
    for i, task in enumerate(tasks):
        for j, key in enumerate(keys):
            value: Any = task.raw
            for part in key.split("."):
                if not isinstance(value, dict) or part not in value:
                    raise ValueError(
                        f"data_selector.feature_keys: task {task.index} of "
                        f"{task.taskset_name!r} has no {key!r}"
                    )
                value = value[part]
            out[i, j] = float(value)
    return out


@SELECTORS.register("offline_easy2hard")
class OfflineEasy2HardSelector(TaskSelector):
    """Easiest first by offline features: sorted once by `feature_keys` (descending, the first
    key first; ties: the later task first, as Trinity-RFT's), the same order every epoch."""

    def __init__(self, seed: int = 42, feature_keys: Sequence[str] = (), **_: Any) -> None:
        super().__init__(seed)
        if not feature_keys:
            raise ValueError("offline_easy2hard needs data_selector.feature_keys")
        self.feature_keys = list(feature_keys)
        self.order: list[int] | None = None

    def prepare(self, tasks: Sequence[Any]) -> None:
        features = feature_matrix(tasks, self.feature_keys)
        rows = [(*features[i].tolist(), i) for i in range(len(tasks))]
        self.order = [int(r[-1]) for r in sorted(rows, reverse=True)]

    def epoch_order(self, n: int, epoch: int) -> list[int]:
        if self.order is None or len(self.order) != n:
            raise RuntimeError("offline_easy2hard: prepare(tasks) must come first")
        return list(self.order)


class BetaPassRates:
    """Each task's pass rate as a Beta(α, β) posterior, updated online (BOTS).

    After a step observed pass rates r_i of tasks I (each from its m samples):

        α ← (1 - λ)·α + λ + (1 - ρ)·s̄ + ρ·m·p̃        s̄_i = m·r_i (i in I, else 0)
        β ← (1 - λ)·β + λ + (1 - ρ)·f̄ + ρ·m·(1 - p̃)   f̄_i = m·(1 - r_i)

    λ discounts the history, ρ weighs pseudo-counts from p̃, the pass rate each task is
    predicted to have now: its observed rate for i in I, else from its offline reference
    columns (`features`, [N, k]):
    - k = 2 (Trinity-RFT's interpolation): two reference models' pass rates f0, f1 and the
      policy's capability c between them, p̃ = clip(f0 + c·(f1 - f0), 0, 1); c is estimated
      from the step, (mean r - mean f0) / (mean f1 - mean f0), smoothed with `cap_discount`;
    - k = 1: one reference column shifted by the policy's offset from it, p̃ = clip(f0 + c);
    - k = 0: no reference: the step's mean observed pass rate for every unobserved task.
    `adaptive_rho` halves ρ when the predictions missed the step's rates by 0.25 or more
    (mean absolute error), as Trinity-RFT's.
    """

    def __init__(
        self,
        n: int,
        features: np.ndarray | None = None,
        m: int = 16,
        lamb: float = 0.2,
        rho: float = 0.2,
        adaptive_rho: bool = False,
        cap_discount: float = 0.9,
    ) -> None:
        k = 0 if features is None else features.shape[1]
        if k > 2:
            raise ValueError(f"difficulty_based takes 0, 1 or 2 feature_keys, not {k}")
        if not (m >= 1 and 0 <= lamb <= 1 and 0 <= rho <= 1 and 0 <= cap_discount <= 1):
            raise ValueError("difficulty_based: m >= 1 and lamb, rho in [0, 1]")
        self.n, self.m, self.lamb, self.rho = n, m, lamb, rho
        self.features = features if k else None
        self.adaptive_rho, self.cap_discount = adaptive_rho, cap_discount
        self.alphas = np.ones(n)
        self.betas = np.ones(n)
        self.cap: float | None = None

    def predicted(self, indices: np.ndarray, rates: np.ndarray) -> np.ndarray:
        """p̃ of every task, given this step's observed `rates` of `indices`."""
        f = self.features
        if f is None:
            return np.full(self.n, float(rates.mean()))
        anchors = f[indices].mean(axis=0)
        if f.shape[1] == 2:
            estimate = (rates.mean() - anchors[0]) / (anchors[1] - anchors[0] + 1e-6)
        else:
            estimate = rates.mean() - anchors[0]
        d = self.cap_discount
        self.cap = estimate if self.cap is None else d * self.cap + (1 - d) * estimate
        if f.shape[1] == 2:
            return np.clip(f[:, 0] + self.cap * (f[:, 1] - f[:, 0]), 0, 1)
        return np.clip(f[:, 0] + self.cap, 0, 1)

    def update(self, indices: Sequence[int], rates: Sequence[float]) -> None:
        idx, r = np.asarray(indices, dtype=int), np.asarray(rates, dtype=float)
        if idx.size == 0:
            return
        p = self.predicted(idx, r)
        if self.adaptive_rho and np.abs(p[idx] - r).mean() >= 0.25:
            self.rho *= 0.5
        p[idx] = r
        s = np.zeros(self.n)
        s[idx] = r * self.m
        f = np.zeros(self.n)
        f[idx] = (1 - r) * self.m
        keep, rho, m = 1 - self.lamb, self.rho, self.m
        self.alphas = keep * self.alphas + self.lamb + (1 - rho) * s + rho * m * p
        self.betas = keep * self.betas + self.lamb + (1 - rho) * f + rho * m * (1 - p)

    def pass_rates(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """The posterior means, or one draw from each posterior (`rng`)."""
        if rng is None:
            return self.alphas / (self.alphas + self.betas)
        return rng.beta(self.alphas, self.betas)

    def state_dict(self) -> dict[str, Any]:
        return {"alphas": self.alphas.tolist(), "betas": self.betas.tolist(),
                "rho": self.rho, "cap": self.cap}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alphas = np.asarray(state["alphas"], dtype=float)
        self.betas = np.asarray(state["betas"], dtype=float)
        self.rho, self.cap = state["rho"], state["cap"]


@SELECTORS.register("difficulty_based")
class DifficultyBasedSelector(TaskSelector):
    """BOTS (module docstring): batches near `target_reward` under a learned posterior."""

    adaptive = True

    def __init__(
        self,
        seed: int = 42,
        feature_keys: Sequence[str] = (),
        m: int = 16,
        lamb: float = 0.2,
        rho: float = 0.2,
        target_reward: float = 1.0,
        tau: float = 1.0,
        do_sample: bool = False,
        adaptive_rho: bool = False,
        staleness_coef: float = 0.0,
    ) -> None:
        super().__init__(seed)
        if tau < 0:
            raise ValueError(f"difficulty_based: tau must be >= 0, got {tau}")
        if not 0 <= staleness_coef <= 1:
            raise ValueError(
                f"difficulty_based: staleness_coef must be in [0, 1], got {staleness_coef}"
            )
        self.feature_keys = list(feature_keys)
        self.settings = {"m": m, "lamb": lamb, "rho": rho, "adaptive_rho": adaptive_rho}
        self.target, self.tau, self.do_sample = target_reward, tau, do_sample
        self.staleness_coef = staleness_coef
        self.rates: BetaPassRates | None = None
        self.steps = 0  # feedback calls so far
        self.last_seen: np.ndarray | None = None  # per task: the step it was last observed, 0 never

    def prepare(self, tasks: Sequence[Any]) -> None:
        features = feature_matrix(tasks, self.feature_keys) if self.feature_keys else None
        self.rates = BetaPassRates(len(tasks), features, **self.settings)
        self.last_seen = np.zeros(len(tasks), dtype=np.int64)

    def next_batch(self, n: int, batch_size: int, batch_no: int) -> list[int]:
        """Batch `batch_no` (0-based): the draws depend on the seed, the batch number and the
        posterior alone."""
        if self.rates is None or self.rates.n != n:
            raise RuntimeError("difficulty_based: prepare(tasks) must come first")
        rng = np.random.default_rng([self.seed, batch_no])
        p = self.rates.pass_rates(rng if self.do_sample else None)
        scores = -np.abs(self.target - p)
        size = min(batch_size, n)
        stale = round(self.staleness_coef * size)
        if self.tau == 0:
            chosen = np.argsort(-scores, kind="stable")[: size - stale]
        else:
            logits = scores / self.tau
            probs = np.exp(logits - logits.max())
            chosen = rng.choice(n, size=size - stale, replace=False, p=probs / probs.sum())
        return [int(i) for i in chosen] + self._stalest(chosen, stale, rng)

    def _stalest(self, chosen: np.ndarray, count: int, rng: np.random.Generator) -> list[int]:
        """`count` tasks outside `chosen`, drawn without replacement with probabilities
        proportional to their staleness, the steps since each was last observed (PLR's
        P_C(l) = (c - C_l) / Σ_k (c - C_k)); a task never observed has C = 0."""
        if count == 0:
            return []
        assert self.last_seen is not None
        weights = (self.steps + 1 - self.last_seen).astype(float)
        weights[chosen] = 0.0
        return [
            int(i)
            for i in rng.choice(len(weights), count, replace=False, p=weights / weights.sum())
        ]

    def batch_count(self, n: int, batch_size: int, total_epochs: int) -> int:
        """As the epoch-based selectors: ceil(total_epochs · n / batch_size) batches."""
        return math.ceil(total_epochs * n / batch_size) if n else 0

    def feedback(self, indices: Sequence[int], values: Sequence[float]) -> None:
        assert self.rates is not None and self.last_seen is not None
        self.rates.update(indices, values)
        self.steps += 1
        self.last_seen[np.asarray(indices, dtype=int)] = self.steps

    def state_dict(self) -> dict[str, Any]:
        assert self.rates is not None and self.last_seen is not None
        return {
            **self.rates.state_dict(),
            "steps": self.steps,
            "last_seen": self.last_seen.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.rates is not None
        self.rates.load_state_dict(state)
        self.steps = state.get("steps", 0)  # absent in a cursor written before staleness
        if "last_seen" in state:
            self.last_seen = np.asarray(state["last_seen"], dtype=np.int64)
