"""The experience pipeline: one explore step's experiences through the configured operators
(`trinity.data.operators`), and what becomes of those a filter drops.

    data_processor:
      experience_pipeline:
        operators: [{name: reward_std_filter}]
        max_num_gen_batches: 4     # refill: tasks tried per step at most 4 × batch_size

The trainer reads a fixed number of experiences per step, and an on-policy explorer waits for
that step's weights: a step written short would leave both waiting. So a filter never shortens
a step; it **refills** it (`StepGroups`, driven by the explorer's step):
- a task whose every sample a filter dropped is replaced by the next task of the selector's
  stream, whose samples go through the operators in turn, until the step has its tasks or
  `max_num_gen_batches` × batch_size tasks were tried;
- a task that lost some samples keeps the others; the dropped ones stay in the step untrained
  (`exclude_from_training`: action mask 0, `info["excluded"]`), each as a group of its own, so a
  group baseline is computed over the samples the filters kept, as if the others were gone;
- when the refills run out, the step is completed with dropped tasks, untrained the same way
  (`experience_pipeline/unfilled_tasks`).

Metrics per step: each operator's own (prefixed `experience_pipeline/`), the experiences it
dropped (`experience_pipeline/<i>_<name>/dropped`) and its time
(`time/experience_pipeline/<i>_<name>`), summed over the step's refills, plus
`experience_pipeline/refill_tasks`, `/kept_untrained` and `/unfilled_tasks`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trinity.common.experience import Experience, exclude_from_training
from trinity.data.operators import build_operator

if TYPE_CHECKING:
    from trinity.data.task_ops import OpContext

Group = tuple[int, list[Experience]]  # (the task's position in the step, its experiences)
# metrics that count: summed over a step's refills (the others are means)
COUNTS = ("/dropped", "filtered_count", "score_failed", "duplicate_count")


class ExperiencePipeline:
    """The configured operators, in order (`data_processor.experience_pipeline.operators`)."""

    def __init__(self, operators: Iterable[Any]) -> None:
        """`operators`: `OperatorConfig`s (name, args), or (name, args) pairs."""
        self.ops = []
        for i, op in enumerate(operators):
            name, args = (op.name, op.args) if hasattr(op, "name") else op
            self.ops.append((f"{i}_{name}", build_operator(name, dict(args))))

    def __bool__(self) -> bool:
        return bool(self.ops)

    async def prepare(self, exps: list[Experience], ctx: OpContext) -> None:
        """Each operator's `prepare` (what needs the event loop: an LLM operator's scoring
        with the served auxiliary models, a recipe run by the run's Data-Juicer server: `ctx`),
        before `run` sees the same experiences."""
        for _, op in self.ops:
            await op.prepare(exps, ctx)

    def run(self, exps: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        """The experiences the operators keep (changed in place by mappers), and the metrics:
        per operator its own, the experiences it dropped and its seconds."""
        metrics: dict[str, float] = {}
        for label, op in self.ops:
            t0, before = time.perf_counter(), len(exps)
            exps, own = op.process(exps)
            metrics[f"time/experience_pipeline/{label}"] = time.perf_counter() - t0
            metrics[f"experience_pipeline/{label}/dropped"] = float(before - len(exps))
            for key, value in own.items():
                metrics[f"experience_pipeline/{key}"] = float(value)
        return exps, metrics

    def close(self) -> None:
        for _, op in self.ops:
            op.close()


class StepGroups:
    """What one explore step keeps of its tasks' groups (module docstring): the pipeline's
    filters, then DAPO's dynamic sampling (`drop_flat`: a group whose rewards are all equal is
    held back, and trained only to complete a step the refills could not fill)."""

    def __init__(self, pipeline: ExperiencePipeline | None, drop_flat: bool) -> None:
        self.pipeline = pipeline if pipeline else None
        self.drop_flat = drop_flat
        self.flat: list[Group] = []  # all-equal groups (trained if they complete the step)
        self.dropped: list[Group] = []  # groups the filters dropped whole (untrained)
        self.untrained = 0  # samples kept in the step untrained (their task kept others)
        self.filled = 0  # tasks the refills took
        self.unfilled = 0  # dropped tasks that completed the step, untrained (`complete`)
        self._metrics: dict[str, float] = {}
        self._seen = 0  # experiences the pipeline saw (weights its own metrics' means)

    def keep(self, groups: list[Group], refill: bool = False) -> list[Group]:
        """The groups of `groups` the step keeps; the rest are held back for `complete`.
        `refill`: these tasks replace dropped ones."""
        if refill:
            self.filled += len(groups)
        if self.pipeline is not None:
            groups = self._filtered(groups)
        if not self.drop_flat:
            return groups
        kept = []
        for item in groups:
            rewards = {e.reward for e in item[1] if not e.info.get("excluded")}
            trained = [e for e in item[1] if not e.info.get("excluded")]
            (self.flat if len(trained) > 1 and len(rewards) == 1 else kept).append(item)
        return kept

    def _filtered(self, groups: list[Group]) -> list[Group]:
        assert self.pipeline is not None
        every = [e for _, exps in groups for e in exps]
        survivors, metrics = self.pipeline.run(list(every))
        self._merge(metrics, len(every))
        alive = {id(e) for e in survivors}
        kept = []
        for i, exps in groups:
            lost = [e for e in exps if id(e) not in alive]
            if len(lost) == len(exps):
                self.dropped.append((i, exps))
                continue
            for e in lost:  # the task stays: these stay in the step, untrained, alone
                _untrain(e, "filtered by the experience pipeline")
                e.info["own_group"] = True
            self.untrained += len(lost)
            kept.append((i, exps))
        return kept

    def _merge(self, metrics: dict[str, float], seen: int) -> None:
        """Counts and times add up over the step's refills; an operator's other metrics are
        means over the experiences each run saw."""
        total = self._seen + seen
        for key, value in metrics.items():
            if key.startswith("time/") or key.endswith(COUNTS):
                self._metrics[key] = self._metrics.get(key, 0.0) + value
            elif total:
                old = self._metrics.get(key, value)
                self._metrics[key] = (old * self._seen + value * seen) / total
        self._seen = total

    def complete(self, kept: list[Group], target: int) -> list[Group]:
        """`kept` completed to `target` tasks from the groups held back: all-equal ones first
        (trained, as DAPO does), then those the filters dropped (untrained)."""
        short = max(0, target - len(kept))
        fill, self.flat = self.flat[:short], self.flat[short:]
        unfilled = self.dropped[: short - len(fill)]
        self.dropped = self.dropped[len(unfilled) :]
        for _, exps in unfilled:
            for e in exps:
                _untrain(e, "filtered by the experience pipeline; the refills ran out")
        self.unfilled = len(unfilled)
        return kept + fill + unfilled

    def unused(self) -> list[Experience]:
        """The sampled experiences the step does not write (they still describe the policy)."""
        return [e for _, exps in self.flat + self.dropped for e in exps]

    def metrics(self) -> dict[str, float]:
        if self.pipeline is None:
            return {}
        return {
            **self._metrics,
            "experience_pipeline/refill_tasks": float(self.filled),
            "experience_pipeline/kept_untrained": float(self.untrained),
            "experience_pipeline/unfilled_tasks": float(self.unfilled),
        }


def _untrain(e: Experience, reason: str) -> None:
    exclude_from_training([e], reason)
