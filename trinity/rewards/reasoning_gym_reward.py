"""`reasoning_gym_reward`: a reasoning-gym dataset's own scorer on the answer of a response.

    buffer.explorer_input.default_reward_fn_type: reasoning_gym_reward
    buffer.explorer_input.taskset.reward_fn_args: {answer_format: answer_tag}   # or boxed, raw

Reads rows of the `reasoning_gym` generator (`trinity/tasks/reasoning_gym_tasks.py`): it rebuilds
the entry (`question`, `answer`, `metadata`) and the dataset (`dataset`, `dataset_args`; one per
process and arguments) and returns the dataset's `score_answer(answer, entry)`, in [0, 1], split
into `accuracy` (1.0 when the score is 1, else 0.0: the eval metric) and `partial_credit` (the
score when it is below 1, e.g. gsm_symbolic's 0.01 for a wrong number): their sum, the reward,
is the dataset's score.

The answer is taken from the response by `answer_format`:
- `answer_tag` (default): the last `<answer>...</answer>`, as reasoning-gym's own prompts ask
  (its `SYSTEM_PROMPTS["default"]`, a good `format.system_prompt`); none: no answer (score 0);
- `boxed`: the content of the last `\\boxed{...}`; none: no answer;
- `raw`: the whole response;
- `last_number`: the last number in the response (thousands separators dropped, `12,000` is
  `12000`), as lm-eval-harness's "flexible-extract" reads GSM8K answers: for small models that do
  not follow a tag instruction (SmolLM2-135M writes "... = 23" and no tags), it gives GRPO a reward
  that varies within a group; none: no answer.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from trinity.rewards.base import REWARD_FN, needs_task_fields
from trinity.rewards.math_answer import last_boxed_content

ANSWER_FORMATS = ("answer_tag", "boxed", "raw", "last_number")
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def extract(response: str, answer_format: str) -> str | None:
    """The answer part of `response` (None when it has none) by `answer_format`."""
    if answer_format == "answer_tag":
        found = _ANSWER_TAG.findall(response)
        return found[-1].strip() if found else None
    if answer_format == "boxed":
        return last_boxed_content(response)
    if answer_format == "raw":
        return response
    if answer_format == "last_number":
        found = _NUMBER.findall(_THOUSANDS.sub("", response))
        return found[-1] if found else None
    raise ValueError(
        f"reasoning_gym_reward: unknown answer_format {answer_format!r}; "
        f"use one of {', '.join(ANSWER_FORMATS)}"
    )


@lru_cache(maxsize=64)
def _scorer(dataset: str, dataset_args_json: str) -> Any:
    from trinity.tasks.reasoning_gym_tasks import make_dataset

    return make_dataset(dataset, json.loads(dataset_args_json), seed=0, size=1).score_answer


@REWARD_FN.register("reasoning_gym_reward")
@needs_task_fields("question", "answer", "metadata", "dataset")
def reasoning_gym_reward(
    response: str, truth: str | None, task_raw: dict[str, Any], answer_format: str = "answer_tag"
) -> dict[str, float]:
    """{"accuracy": score == 1, "partial_credit": score below 1} of the dataset's scorer."""
    answer = extract(response, answer_format)
    entry = {k: task_raw[k] for k in ("question", "answer", "metadata")}
    args = json.dumps(task_raw.get("dataset_args") or {}, sort_keys=True)
    score = float(_scorer(task_raw["dataset"], args)(answer, entry))
    return {"accuracy": float(score >= 1.0), "partial_credit": score if score < 1.0 else 0.0}


def _arg_problems(args: dict[str, Any]) -> list[str]:
    """Pre-flight: an `answer_format` that is not one of ANSWER_FORMATS."""
    fmt = args.get("answer_format", "answer_tag")
    if fmt in ANSWER_FORMATS:
        return []
    return [f"answer_format {fmt!r} is not one of {', '.join(ANSWER_FORMATS)}"]


reasoning_gym_reward.arg_problems = _arg_problems  # type: ignore[attr-defined]
