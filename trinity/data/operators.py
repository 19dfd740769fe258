"""Experience operators: what happens to one explore step's experiences before the trainer sees
them (`data_processor.experience_pipeline.operators`, Trinity-RFT's names and arguments).

    data_processor:
      experience_pipeline:
        operators:
          - {name: invalid_reward_filter}
          - {name: reward_std_filter, args: {threshold: 0.0}}
          - {name: reward_shaping_mapper, args: {reward_shaping_configs:
              [{stats_key: quality, op_type: ADD, weight: 0.5}]}}
          - {name: pass_rate_calculator}

An operator is `process(exps) -> (kept, metrics)` over the step's experiences, as Trinity-RFT's
`ExperienceOperator` (a plugin written for it runs here unchanged): a filter returns fewer, a
mapper changes them in place. Experiences of one task share `eid.group` (the key group
advantages normalise over). What the pipeline does with what a filter drops (refill, or keep it
in the step untrained) is `trinity.data.pipeline`'s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from trinity.common.experience import Experience
from trinity.common.registry import Registry

if TYPE_CHECKING:
    from trinity.data.task_ops import OpContext

Metrics = dict[str, float]


class ExperienceOperator:
    """Base: `process` one step's experiences; `close` what it holds."""

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        raise NotImplementedError

    async def prepare(self, exps: list[Experience], ctx: OpContext) -> None:
        """Before `process`, what needs the event loop (an LLM operator's scoring with the
        served auxiliary models, `ctx.models`; a recipe run by the run's Data-Juicer server,
        `ctx.data_juicer`); nothing, for most."""

    def data_juicer_ops(self) -> list[str]:
        """The ops it has a real Data-Juicer run (`validate` checks one is configured)."""
        return []

    def close(self) -> None:
        """Release what the operator holds (nothing, for the built-in ones)."""


EXPERIENCE_OPERATORS: Registry[type[ExperienceOperator]] = Registry("experience operator")


def by_group(exps: list[Experience]) -> dict[Any, list[Experience]]:
    """The experiences of each task (`eid.group`), in first-seen order."""
    groups: dict[Any, list[Experience]] = defaultdict(list)
    for e in exps:
        groups[e.eid.group].append(e)
    return groups


def _valid(reward: float | None) -> bool:
    return reward is not None and not math.isnan(reward)


@EXPERIENCE_OPERATORS.register("reward_filter")
class RewardFilter(ExperienceOperator):
    """Keep the experiences whose reward is at least `threshold` (a missing or NaN reward is
    below every threshold)."""

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = float(threshold)

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        kept = [e for e in exps if _valid(e.reward) and e.reward >= self.threshold]
        return kept, {"filtered_count": float(len(exps) - len(kept))}


@EXPERIENCE_OPERATORS.register("reward_std_filter")
class RewardStdFilter(ExperienceOperator):
    """Keep the tasks whose samples' rewards have a (population) standard deviation above
    `threshold`; a task with fewer than 2 samples has none and is dropped. With threshold 0 it
    is DAPO's dynamic sampling: an all-equal group has zero advantage under a group baseline."""

    def __init__(self, threshold: float = 0.0) -> None:
        self.threshold = float(threshold)

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        kept: list[Experience] = []
        for group in by_group(exps).values():
            rewards = [e.reward for e in group]
            if len(group) < 2 or not all(_valid(r) for r in rewards):
                continue
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            if std > self.threshold:
                kept += group
        return kept, {"filtered_count": float(len(exps) - len(kept))}


@EXPERIENCE_OPERATORS.register("invalid_reward_filter")
class InvalidRewardFilter(ExperienceOperator):
    """Drop the experiences whose reward is missing (None) or NaN."""

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        kept = [e for e in exps if _valid(e.reward)]
        return kept, {"filtered_count": float(len(exps) - len(kept))}


_OPS = {
    "ADD": lambda r, s: r + s,
    "SUB": lambda r, s: r - s,
    "MUL": lambda r, s: r * s,
    "DIV": lambda r, s: r / s if s != 0 else r,  # Trinity-RFT leaves the reward on a zero divisor
}


@EXPERIENCE_OPERATORS.register("reward_shaping_mapper")
class RewardShapingMapper(ExperienceOperator):
    """Reshape each reward with statistics the workflow stored on the experience: for each
    `{stats_key, op_type, weight}` in order, reward = reward <op> weight · info[stats_key]
    (op_type ADD, SUB, MUL or DIV; a DIV by 0 leaves the reward). An experience without the
    statistic (or without a reward) keeps its reward. Metrics: the reward change's mean, min
    and max."""

    def __init__(self, reward_shaping_configs: list[dict[str, Any]] | None = None) -> None:
        self.configs = list(reward_shaping_configs or [])
        for c in self.configs:
            unknown = set(c) - {"stats_key", "op_type", "weight"}
            if unknown:
                raise ValueError(
                    f"reward_shaping_mapper: unknown keys {sorted(unknown)} in {c}; "
                    "each config has stats_key, op_type, weight"
                )
            if c.get("op_type", "ADD") not in _OPS:
                raise ValueError(
                    f"reward_shaping_mapper: op_type {c.get('op_type')!r} is not one of "
                    f"{', '.join(_OPS)}"
                )

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        diffs = []
        for e in exps:
            before = e.reward
            if before is None:
                diffs.append(0.0)
                continue
            for c in self.configs:
                key = c.get("stats_key")
                stat = e.info.get(key) if key is not None else None
                if stat is None:
                    stat = e.metrics.get(key) if key is not None else None
                if stat is not None:
                    op = _OPS[c.get("op_type", "ADD")]
                    e.reward = op(e.reward, float(c.get("weight", 1.0)) * float(stat))
            diffs.append(e.reward - before)
        if not diffs:
            diffs = [0.0]
        return exps, {
            "reward_diff/mean": sum(diffs) / len(diffs),
            "reward_diff/min": min(diffs),
            "reward_diff/max": max(diffs),
        }


@EXPERIENCE_OPERATORS.register("pass_rate_calculator")
class PassRateCalculator(ExperienceOperator):
    """Each task's pass rate this step (the mean reward of its samples), kept on its
    experiences (`info["pass_rate"]`) for a curriculum, and how the step's tasks spread:
    `selection/valid_ratio` (0 < rate < 1: the tasks a group baseline learns from),
    `selection/strict_valid_ratio` (1/16 < rate < 15/16), `selection/<1_ratio`,
    `selection/>0_ratio`, `selection/<15_16_ratio`, `selection/>1_16_ratio` (Trinity-RFT's)."""

    def __init__(self, **_: Any) -> None:  # Trinity-RFT's takes (and ignores) any arguments
        pass

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        rates = []
        for group in by_group(exps).values():
            rewards = [e.reward for e in group if _valid(e.reward)]
            if not rewards:
                continue
            rate = sum(rewards) / len(rewards)
            rates.append(rate)
            for e in group:
                e.info["pass_rate"] = rate
        if not rates:
            return exps, {}
        eps, n = 1e-3, len(rates)

        def share(test: Any) -> float:
            return sum(1 for r in rates if test(r)) / n

        return exps, {
            "selection/valid_ratio": share(lambda r: 0 < r < 1),
            "selection/strict_valid_ratio": share(lambda r: 1 / 16 + eps < r < 15 / 16 - eps),
            "selection/<1_ratio": share(lambda r: r < 1),
            "selection/>0_ratio": share(lambda r: r > 0),
            "selection/<15_16_ratio": share(lambda r: r < 15 / 16 - eps),
            "selection/>1_16_ratio": share(lambda r: r > 1 / 16 + eps),
        }


@EXPERIENCE_OPERATORS.register("data_juicer")
class DataJuicerOperator(ExperienceOperator):
    """A Data-Juicer recipe (`config_path`) over the step's experiences, each seen as a row of
    its `prompt_text`, `response_text` and `info`: its ops run natively (`task_ops`) or through
    Data-Juicer (`recipes`). The rows the recipe drops are dropped; the statistics it adds
    (`llm_quality_score`, ...) land in `info`, where `reward_shaping_mapper` reads them."""

    def __init__(self, config_path: str = "", timeout_s: float = 3600.0, **_dj: Any) -> None:
        from trinity.data.recipes import RecipeRunner, read_recipe

        if not config_path:
            raise ValueError("config_path is required: a Data-Juicer recipe")
        self.runner = RecipeRunner(read_recipe(config_path), timeout_s=float(timeout_s))
        self._kept: set[int] | None = None
        self._metrics: Metrics = {}

    def models_needed(self) -> list[str]:
        return self.runner.models_needed()

    def data_juicer_ops(self) -> list[str]:
        return self.runner.missing

    async def prepare(self, exps: list[Experience], ctx: OpContext) -> None:
        rows = [
            {**e.info, "prompt_text": e.prompt_text or "", "response_text": e.response_text or "",
             "_exp": i}
            for i, e in enumerate(exps)
        ]  # fmt: skip
        before = {i: set(r) for i, r in enumerate(rows)}
        kept, self._metrics = await self.runner.process(rows, ctx)
        by_index = {r["_exp"]: r for r in kept}
        for i, row in enumerate(rows):  # natively rows are changed in place; else the kept copy
            row = by_index.get(i, row)
            for key in set(row) - before[i]:
                exps[i].info[key] = row[key]
        self._kept = {id(exps[i]) for i in by_index}

    def process(self, exps: list[Experience]) -> tuple[list[Experience], Metrics]:
        if self._kept is None:
            raise RuntimeError("data_juicer: process called before prepare (the recipe's run)")
        kept, self._kept = [e for e in exps if id(e) in self._kept], None
        return kept, {"filtered_count": float(len(exps) - len(kept)), **self._metrics}


def build_operator(name: str, args: dict[str, Any]) -> ExperienceOperator:
    """The operator `name` (a registered name or a dotted path) with its `args`; a bad argument
    raises naming the operator."""
    cls = EXPERIENCE_OPERATORS.get(name)
    try:
        return cls(**args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"experience operator {name!r}: {e}") from e
