"""Native versions of the Data-Juicer operators a task pipeline (or a `data_juicer` recipe) uses,
with Data-Juicer's names and arguments, so Trinity-RFT's pipeline examples run without it.

    text_length_filter          min_len, max_len, text_key: keep min_len <= len(text) <= max_len
    words_num_filter            min_num, max_num, text_key: the same over whitespace words
    document_deduplicator       lowercase, ignore_non_character, text_key: exact duplicates go
                                (the first copy stays)
    llm_difficulty_score_filter api_or_hf_model, min_score, max_score, input_keys, field_names:
    llm_quality_score_filter    an auxiliary model (`explorer.auxiliary_models`, by name) scores
                                each row from 0 to 1; the score goes into the row's
                                `llm_difficulty_score` / `llm_quality_score` column; rows
                                outside [min_score, max_score] go

    pass_rate_filter            min_pass_rate, max_pass_rate (ours): the rollout model runs
                                each row as a task (its workflow, `repeat_times` samples); the
                                mean reward goes into the `pass_rate` column (what a curriculum's
                                `feature_keys` read); rows outside the range go

An operator is `await op.process(rows, ctx) -> (kept, metrics)`: `rows` are dicts (a task's
columns, or an experience's `prompt_text` / `response_text` view), `ctx` an `OpContext`: the
served `AuxiliaryModels` (None when none are served: an LLM operator then raises naming the
model) and, in a task pipeline, the explorer's `pass_rates`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trinity.common.registry import Registry
from trinity.judges.judge import PointwiseJudge

Metrics = dict[str, float]


@dataclass
class OpContext:
    """What an operator may call: the served auxiliary models, (in a task pipeline) the
    rollout model's pass rate of each row run as a task (None: its workflow failed), and the
    run's Data-Juicer server (`dj_server.DataJuicerServer`; None: a recipe runs `dj-process`)."""

    models: Any = None
    pass_rates: Callable[[list[dict]], Awaitable[list[float | None]]] | None = None
    data_juicer: Any = None


class RowOperator:
    """Base: `process` rows; `models_needed` names the auxiliary models it calls."""

    def models_needed(self) -> list[str]:
        return []

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        raise NotImplementedError


ROW_OPERATORS: Registry[type[RowOperator]] = Registry("data operator")


def _text(row: dict, key: str, op: str) -> str:
    if key not in row:
        raise KeyError(f"{op}: a row has no {key!r} column (set text_key); it has {sorted(row)}")
    return str(row[key])


@ROW_OPERATORS.register("text_length_filter")
class TextLengthFilter(RowOperator):
    """Keep the rows whose text has min_len to max_len characters (both included)."""

    def __init__(self, min_len: int = 10, max_len: int = sys.maxsize, text_key: str = "text"):
        self.min_len, self.max_len, self.text_key = int(min_len), int(max_len), text_key

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        kept = []
        for r in rows:
            n = len(_text(r, self.text_key, "text_length_filter"))
            r["text_len"] = n
            if self.min_len <= n <= self.max_len:
                kept.append(r)
        return kept, {"filtered_count": float(len(rows) - len(kept))}


@ROW_OPERATORS.register("words_num_filter")
class WordsNumFilter(RowOperator):
    """Keep the rows whose text has min_num to max_num whitespace-separated words."""

    def __init__(self, min_num: int = 10, max_num: int = sys.maxsize, text_key: str = "text"):
        self.min_num, self.max_num, self.text_key = int(min_num), int(max_num), text_key

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        kept = []
        for r in rows:
            n = len(_text(r, self.text_key, "words_num_filter").split())
            r["num_words"] = n
            if self.min_num <= n <= self.max_num:
                kept.append(r)
        return kept, {"filtered_count": float(len(rows) - len(kept))}


@ROW_OPERATORS.register("document_deduplicator")
class DocumentDeduplicator(RowOperator):
    """Drop exact duplicates of the text (md5 of it, after lower-casing with `lowercase` and
    removing non-word characters with `ignore_non_character`); the first copy stays."""

    def __init__(
        self, lowercase: bool = False, ignore_non_character: bool = False, text_key: str = "text"
    ):
        self.lowercase, self.ignore = bool(lowercase), bool(ignore_non_character)
        self.text_key = text_key

    def key(self, text: str) -> str:
        if self.lowercase:
            text = text.lower()
        if self.ignore:
            text = re.sub(r"[^\w]|_", "", text)
        return hashlib.md5(text.encode("utf-8")).hexdigest()

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        seen: set[str] = set()
        kept = []
        for r in rows:
            k = self.key(_text(r, self.text_key, "document_deduplicator"))
            if k not in seen:
                seen.add(k)
                kept.append(r)
        return kept, {"duplicate_count": float(len(rows) - len(kept))}


DIFFICULTY_PROMPT = (
    "{content}\n\nRate how difficult the problem above is to solve correctly, from {low:g} "
    "(trivial) to {high:g} (very hard). Explain briefly, then end with a line "
    '"Score: N".'
)
QUALITY_PROMPT = (
    "{content}\n\nRate the overall quality of the sample above (correctness, clarity, "
    "usefulness), from {low:g} (useless) to {high:g} (excellent). Explain briefly, then end "
    'with a line "Score: N".'
)


# Data-Juicer's LLM-op settings of the model and its prompt: here the auxiliary model's own
# settings (explorer.auxiliary_models) apply, so they are accepted and not read
DJ_MODEL_ARGS = {
    "is_hf_model", "api_endpoint", "response_path", "system_prompt", "input_template",
    "field_template", "try_num", "enable_vllm", "model_params", "sampling_params",
    "dim_required_keys",
}  # fmt: skip


class _LLMScoreFilter(RowOperator):
    """Score each row with an auxiliary model (`api_or_hf_model`: its `name` in
    `explorer.auxiliary_models`), keep the rows scored in [min_score, max_score]. The row's
    fields `input_keys` are shown titled `field_names`. A reply without a score drops the row
    (counted in `score_failed`), or with `keep_unscored` (ours, not Data-Juicer's) keeps it
    with score None."""

    stats_key = ""
    prompt = ""

    def __init__(
        self,
        api_or_hf_model: str = "",
        min_score: float = 0.5,
        max_score: float = 1.0,
        input_keys: list[str] | None = None,
        field_names: list[str] | None = None,
        keep_unscored: bool = False,
        **dj_only: Any,
    ) -> None:
        unknown = set(dj_only) - DJ_MODEL_ARGS
        if unknown:
            raise ValueError(
                f"unknown argument(s) {sorted(unknown)}; built: api_or_hf_model, min_score, "
                "max_score, input_keys, field_names, keep_unscored (Data-Juicer's "
                f"{sorted(DJ_MODEL_ARGS)} are read by the auxiliary model's own settings)"
            )
        if not api_or_hf_model:
            raise ValueError("api_or_hf_model is required: the name of an auxiliary model")
        self.model = str(api_or_hf_model)
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.keep_unscored = bool(keep_unscored)
        self.input_keys = list(input_keys or ["text"])
        self.field_names = list(field_names or self.input_keys)
        if len(self.field_names) != len(self.input_keys):
            raise ValueError(
                f"field_names ({len(self.field_names)}) and input_keys ({len(self.input_keys)}) "
                "differ in length"
            )
        self.judge = PointwiseJudge(prompt=self.prompt, system_prompt=None, score_range=(0, 10))

    def models_needed(self) -> list[str]:
        return [self.model]

    def content(self, row: dict) -> str:
        parts = []
        for key, title in zip(self.input_keys, self.field_names, strict=True):
            if key not in row:
                raise KeyError(f"a row has no {key!r} column (input_keys); it has {sorted(row)}")
            parts.append(f"{title}: {row[key]}")
        return "\n".join(parts)

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        handle = auxiliary_handle(ctx.models, self.model)
        verdicts = await asyncio.gather(
            *(self.judge.score(handle, {"content": self.content(r)}) for r in rows)
        )
        kept, failed, scores = [], 0, []
        for r, v in zip(rows, verdicts, strict=True):
            r[self.stats_key] = v.score
            if v.score is None:
                failed += 1
                kept += [r] if self.keep_unscored else []
                continue
            scores.append(v.score)
            if self.min_score <= v.score <= self.max_score:
                kept.append(r)
        metrics = {"filtered_count": float(len(rows) - len(kept)), "score_failed": float(failed)}
        if scores:
            metrics[f"{self.stats_key}/mean"] = sum(scores) / len(scores)
        return kept, metrics


@ROW_OPERATORS.register("llm_difficulty_score_filter")
class LLMDifficultyScoreFilter(_LLMScoreFilter):
    stats_key = "llm_difficulty_score"
    prompt = DIFFICULTY_PROMPT


@ROW_OPERATORS.register("llm_quality_score_filter")
class LLMQualityScoreFilter(_LLMScoreFilter):
    stats_key = "llm_quality_score"
    prompt = QUALITY_PROMPT


@ROW_OPERATORS.register("pass_rate_filter")
class PassRateFilter(RowOperator):
    """Each row's pass rate with the current rollout model (its mean reward over the taskset's
    `repeat_times` samples) in the `pass_rate` column; keep min_pass_rate <= rate <=
    max_pass_rate (a row whose workflow failed has None and goes, counted in `failed`)."""

    def __init__(self, min_pass_rate: float = 0.0, max_pass_rate: float = 1.0) -> None:
        self.low, self.high = float(min_pass_rate), float(max_pass_rate)
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(
                f"need 0 <= min_pass_rate <= max_pass_rate <= 1, got {self.low}, {self.high}"
            )

    async def process(self, rows: list[dict], ctx: OpContext) -> tuple[list[dict], Metrics]:
        if ctx.pass_rates is None:
            raise RuntimeError(
                "pass_rate_filter runs in a task pipeline only (it needs the rollout model)"
            )
        rates = await ctx.pass_rates(rows)
        kept, failed = [], 0
        for r, rate in zip(rows, rates, strict=True):
            r["pass_rate"] = rate
            failed += rate is None
            if rate is not None and self.low <= rate <= self.high:
                kept.append(r)
        valid = [x for x in rates if x is not None]
        metrics = {"filtered_count": float(len(rows) - len(kept)), "failed": float(failed)}
        if valid:
            metrics["pass_rate/mean"] = sum(valid) / len(valid)
        return kept, metrics


def auxiliary_handle(models: Any, name: str) -> Any:
    """A handle on the served auxiliary model named `name`; LookupError saying how to serve
    one otherwise."""
    from trinity.explorer.auxiliary import AuxiliaryHandle

    if models is None:
        raise LookupError(
            f"api_or_hf_model {name!r}: no auxiliary model is served; add one to "
            f"explorer.auxiliary_models with name: {name}"
        )
    try:
        model = models.find(name)
    except LookupError as e:
        raise LookupError(
            f"api_or_hf_model {name!r}: {e}; name one of them, or add it to "
            f"explorer.auxiliary_models with name: {name}"
        ) from e
    return AuxiliaryHandle(model, None, None)


def build_row_operator(name: str, args: dict[str, Any]) -> RowOperator:
    """The operator `name` with `args`; a bad argument raises naming the operator."""
    cls = ROW_OPERATORS.get(name)
    try:
        return cls(**args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"data operator {name!r}: {e}") from e


# Trinity-RFT's operators that cannot run here, refused by name with the reason
ROW_OPERATORS.refuse(
    "human_preference_annotation_mapper",
    "it sends each row to a Label Studio server (api_url) for people to choose the preferred "
    "answer and waits for their annotations; no Label Studio client or server is here",
)
