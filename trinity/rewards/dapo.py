"""`math_dapo_reward` and `math_boxed_reward_naive_dapo`: DAPO's math reward (Trinity-RFT's names).

    default_reward_fn_type: math_dapo_reward
    reward_fn_args: {enable_overlong_penalty: true, penalty_factor: 1.0,
                     max_response_length: 20480, cache_length: 4096}
    default_reward_fn_type: math_boxed_reward_naive_dapo     # accuracy only

Both score accuracy the "naive DAPO" way (Reasoning360's `naive_dapo`, which Trinity-RFT adapts):
only the text after the last `</think>` counts; its last `\\boxed{}` (or `\\fbox{}`) holds the
answer, and a response without one is an answer only if that whole text is one (no prose). The
answer is right when it equals the truth after a light string normalisation (spaces, `$`, `\\text{}`,
`\\left`/`\\right`, `\\dfrac`) or when math-verify finds the two equal (`\\frac{1}{2}` = `0.5`).
Departure: Trinity-RFT compares with Hendrycks' MATH normalisation, sympy and PRIME's grader
(verl's `prime_math`); here math-verify does that part, as in `math_reward`.

`math_dapo_reward` adds DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13) as its
"format_score" component, from the response's length in tokens, which the math workflows pass
(`needs_response_length`); L = max_response_length, C = cache_length, F = penalty_factor:

    penalty(len) = 0                        len ≤ L - C
                 = (L - C - len) / C · F    L - C < len ≤ L
                 = -F                       len > L
"""

from __future__ import annotations

import re
from typing import Any

from trinity.rewards.base import REWARD_FN, needs_truth, require_truth
from trinity.rewards.math_answer import _as_math, answers_match

_PROSE = re.compile(r"[A-Za-z]{2,}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def _last_box_content(text: str) -> str | None:
    """The content of the last `\\boxed{...}` or `\\fbox{...}` with balanced braces."""
    starts = [(m.start(), m.end()) for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for _, end in reversed(starts):
        depth, i = 1, end
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[end : i - 1].strip()
    return None


def _normalise(answer: str) -> str:
    """A light string normalisation: `\\text{x}` → x, no `$`, spaces, `\\left`/`\\right`, thin
    spaces or a trailing period; `\\dfrac`/`\\tfrac` → `\\frac`; lower case."""
    s = _TEXT.sub(r"\1", answer)
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""),
                     ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("$", "")):  # fmt: skip
        s = s.replace(old, new)
    return re.sub(r"\s+", "", s).rstrip(".").lower()


def naive_dapo_score(response: str, truth: str) -> float:
    """1.0 when the final answer of `response` (module docstring) equals `truth`, else 0.0."""
    text = response.split("</think>")[-1]
    answer = _last_box_content(text)
    if answer is None:  # no box: the whole text must be the answer
        answer = text.strip()
        if not answer or _PROSE.search(re.sub(r"\\[A-Za-z]+", "", _TEXT.sub("", answer))):
            return 0.0
    if _normalise(answer) == _normalise(truth):
        return 1.0
    try:
        return float(answers_match(_as_math(answer), truth))
    except ValueError:  # math-verify cannot parse the truth: the string comparison decided
        return 0.0


def overlong_penalty(
    response_length: int, max_response_length: int, cache_length: int, penalty_factor: float
) -> float:
    """DAPO's soft overlong punishment of a response of `response_length` tokens (module doc)."""
    expected = max_response_length - cache_length
    if response_length <= expected:
        return 0.0
    if response_length > max_response_length:
        return -float(penalty_factor)
    return (expected - response_length) / cache_length * float(penalty_factor)


def _penalty_problems(args: dict[str, Any]) -> list[str]:
    """What is wrong with `reward_fn_args` that enable the overlong penalty."""
    if "response_length" in args:
        return ["math_dapo_reward: response_length is not a reward_fn_args key (the workflow "
                "passes each response's length)"]  # fmt: skip
    if not args.get("enable_overlong_penalty"):
        return []
    need = ("penalty_factor", "max_response_length", "cache_length")
    missing = [k for k in need if args.get(k) is None]
    if missing:
        return [f"math_dapo_reward: enable_overlong_penalty needs {', '.join(missing)}"]
    if not args["max_response_length"] > args["cache_length"] > 0:
        return ["math_dapo_reward: needs max_response_length > cache_length > 0"]
    return []


@REWARD_FN.register("math_dapo_reward")
@needs_truth
def math_dapo_reward(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    enable_overlong_penalty: bool | None = None,
    penalty_factor: float | None = None,
    max_response_length: int | None = None,
    cache_length: int | None = None,
    response_length: int | None = None,
) -> dict[str, float]:
    """DAPO's math reward: the naive-DAPO accuracy and the soft overlong penalty.

    Returns {"accuracy": `naive_dapo_score`, "format_score": the overlong penalty (0.0 unless
    `enable_overlong_penalty`)}. `response_length`: the response's tokens, passed by the workflow
    (not a `reward_fn_args` key)."""
    truth = require_truth("math_dapo_reward", truth)
    args = {
        "enable_overlong_penalty": enable_overlong_penalty,
        "penalty_factor": penalty_factor,
        "max_response_length": max_response_length,
        "cache_length": cache_length,
    }
    if problems := _penalty_problems(args):
        raise ValueError(problems[0])
    penalty = 0.0
    if enable_overlong_penalty:
        if response_length is None:
            raise ValueError(
                "math_dapo_reward: enable_overlong_penalty needs the response's length in "
                "tokens, which this workflow does not pass (math_workflow and "
                "math_boxed_workflow do)"
            )
        assert max_response_length is not None and cache_length is not None  # checked above
        penalty = overlong_penalty(
            response_length, max_response_length, cache_length, float(penalty_factor or 0.0)
        )
    return {"accuracy": naive_dapo_score(response, truth), "format_score": penalty}


math_dapo_reward.arg_problems = _penalty_problems  # type: ignore[attr-defined]
# the workflow passes `response_length` when these args need it (pre-flight checks it does)
math_dapo_reward.needs_response_length = lambda args: bool(  # type: ignore[attr-defined]
    args.get("enable_overlong_penalty")
)


@REWARD_FN.register("math_boxed_reward_naive_dapo")
@needs_truth
def math_boxed_reward_naive_dapo(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    with_think: bool = False,
    format_score_coef: float = 0.1,
) -> dict[str, float]:
    """The naive-DAPO accuracy of a boxed answer, with no format score.

    Returns {"accuracy": `naive_dapo_score`, "format_score": 0.0}. `with_think` and
    `format_score_coef` are accepted (math_boxed_workflow passes them, as Trinity-RFT's) and
    ignored, as there."""
    truth = require_truth("math_boxed_reward_naive_dapo", truth)
    return {"accuracy": naive_dapo_score(response, truth), "format_score": 0.0}
