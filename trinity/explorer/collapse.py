"""Collapse warnings: a policy whose samples stop differing says so before its reward does.

    monitor: {collapse_threshold: 0.25, collapse_patience: 3}

Each explore step reports `rollout/distinct_response_frac` (`distinct_response_frac`: the share
of a task's samples that are distinct token sequences, averaged over its multi-sample tasks) and
`rollout/response_length`. `CollapseWatch` turns them into

    collapse/low_diversity_steps     consecutive steps with distinct_response_frac < threshold
    collapse/response_length_drift   response length / its mean over the first `baseline` steps
    collapse/warning                 1 on the step the streak reaches `patience` (and after)

and a console line on the step a streak reaches `patience` (once per streak). GRPO-style
advantages vanish when a group's samples are identical, so a collapsed policy also stops
learning; the trainer's `train/entropy` (when the algorithm computes it) tells the same story
per token.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from trinity.common.experience import Experience


def distinct_response_frac(experiences: list[Experience]) -> float | None:
    """Mean over the groups of more than one sample of (distinct responses / samples); None
    when no group has two samples. Responses are compared by their token ids."""
    groups: dict[tuple, list[tuple[int, ...]]] = {}
    for e in experiences:
        groups.setdefault(e.eid.group, []).append(tuple(e.tokens[e.prompt_length :].tolist()))
    multi = [g for g in groups.values() if len(g) > 1]
    if not multi:
        return None
    return statistics.fmean(len(set(g)) / len(g) for g in multi)


@dataclass
class CollapseWatch:
    """Watches a run's explore steps (module doc); `threshold` 0 turns the warning off."""

    threshold: float = 0.25
    patience: int = 3
    baseline: int = 3  # steps whose mean response length the drift is measured against
    _low: int = 0
    _lengths: list[float] = field(default_factory=list)

    def observe(self, report: dict[str, float], step: int) -> tuple[dict[str, float], str | None]:
        """The step's `collapse/*` metrics from its rollout report, and the warning to print
        (None: none this step)."""
        out: dict[str, float] = {}
        length = report.get("rollout/response_length")
        if length is not None:
            if len(self._lengths) < self.baseline:
                self._lengths.append(length)
            base = statistics.fmean(self._lengths)
            out["collapse/response_length_drift"] = length / base if base > 0 else 1.0
        distinct = report.get("rollout/distinct_response_frac")
        if distinct is None or self.threshold <= 0:
            return out, None
        self._low = self._low + 1 if distinct < self.threshold else 0
        out["collapse/low_diversity_steps"] = float(self._low)
        out["collapse/warning"] = float(self._low >= self.patience)
        if self._low != self.patience:
            return out, None
        drift = out.get("collapse/response_length_drift")
        return out, (
            f"warning: explore step {step}: the policy may be collapsing: for {self._low} steps "
            f"fewer than {self.threshold:.0%} of each task's samples were distinct (now "
            f"{distinct:.0%})"
            + (f"; response length {drift:.2f}x its first steps'" if drift is not None else "")
            + " (monitor.collapse_threshold, monitor.collapse_patience)"
        )
