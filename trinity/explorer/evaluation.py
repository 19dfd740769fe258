"""From an evaluation's returned experiences to its metrics and per-sample records.

    metrics, samples = evaluation_report(name, tasks, ns, kept, seed, detailed=False, decode=...)

`kept` is what `Explorer._run_tasks` returns for the eval set: (position of the task, its
experiences) for every task kept; a position missing from it is a task whose workflow failed
every try (or timed out), and it counts as `n` wrong samples (`eval_metrics`). A sample's score is
its reward fn's `accuracy` component where it has one, else its reward; it is correct when that
score is at least 1. Its comparable answer (maj@k) is its response text, stripped. Each
experience is one sample: a workflow that returns several per sample (one per turn) is scored on
its first `n` experiences.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from trinity.common.experience import Experience
from trinity.explorer.eval_metrics import TaskOutcome, spread, taskset_metrics
from trinity.explorer.rollout_stats import rollout_metrics
from trinity.tasks import Task

CORRECT_AT = 1.0 - 1e-9  # a score at least this is a correct sample


def score(e: Experience) -> float:
    """The sample's `accuracy` component where its reward fn gives one, else its reward."""
    if "accuracy" in e.metrics:
        return float(e.metrics["accuracy"])
    return float(e.reward or 0.0)


def evaluation_report(
    name: str,
    tasks: Sequence[Task],
    ns: Sequence[int],
    kept: Sequence[tuple[int, list[Experience]]],
    seed: int,
    detailed: bool,
    decode: Callable[[Experience], tuple[str, str]] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`eval/<name>/...` metrics of one eval set and, when `decode` is given, a record per
    sample slot (the missing ones included, marked `failed`). `ns[i]`: task i's planned
    samples; `decode(e)`: (prompt, response) text of an experience."""
    by_task = dict(kept)
    outcomes, samples = [], []
    for i, task in enumerate(tasks):
        exps = by_task.get(i, [])
        scores = [score(e) for e in exps]
        answers = [None if e.response_text is None else e.response_text.strip() for e in exps]
        outcomes.append(
            TaskOutcome(
                n=ns[i],
                correct=[s >= CORRECT_AT for s in scores],
                scores=scores,
                answers=answers,
                truncated=[e.truncated for e in exps],
                failed=i not in by_task,
            )
        )
        for j in range(max(ns[i], len(exps)) if decode is not None else 0):
            e = exps[j] if j < len(exps) else None
            prompt, response = decode(e) if e is not None else (task.prompt, None)
            samples.append(
                {
                    "taskset": name,
                    "task": task.index,
                    "sample": j,
                    "prompt": prompt,
                    "response": response,
                    "reward": None if e is None else e.reward,
                    "score": None if e is None else scores[j],
                    "correct": e is not None and scores[j] >= CORRECT_AT,
                    "failed": e is None,
                }
            )
    report = taskset_metrics(outcomes, seed)
    n = min(ns)
    exps = [e for _, es in kept for e in es]
    m = rollout_metrics(exps, prefix="") if exps else {"reward_mean": 0.0, "response_length": 0.0}
    metrics = {f"eval/{name}/{k}": v for k, v in report.items()}
    metrics[f"eval/{name}/accuracy"] = report[f"avg@{n}"]  # honest: missing samples score 0
    metrics[f"eval/{name}/reward_mean"] = m["reward_mean"]
    metrics[f"eval/{name}/response_length"] = m["response_length"]
    metrics[f"eval/{name}/failed_tasks"] = float(len(tasks) - len(kept))
    if detailed:  # spread over tasks of each per-task mean (`monitor.detailed_stats`)
        per_task = {
            "accuracy": [
                statistics.fmean([*o.scores[:n], *[0.0] * (n - len(o.scores[:n]))])
                for o in outcomes
            ],
            "reward_mean": [statistics.fmean(e.reward or 0.0 for e in es) for _, es in kept if es],
            "response_length": [
                statistics.fmean(e.response_length for e in es) for _, es in kept if es
            ],
        }
        for key, values in per_task.items():
            if values:
                metrics.update({f"eval/{name}/{key}/{s}": v for s, v in spread(values).items()})
    return metrics, samples
