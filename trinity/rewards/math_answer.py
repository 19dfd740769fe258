"""`math_reward`, `format_reward`, `math_with_format`, `math_boxed_reward`: free-form math answers
checked by math-verify.

    default_reward_fn_type: math_with_format
    reward_fn_args: {format_score: 0.1}
    default_reward_fn_type: math_boxed_reward     # Trinity-RFT's name: only a \boxed{} answer counts
    reward_fn_args: {with_think: true, format_score_coef: 0.1}

The final answer is taken from the last `\\boxed{...}` or `#### ...` of the response (GSM8K style)
and, the same way, from the truth (a full GSM8K solution ending in `#### 72` works); a response
without one is searched whole by math-verify, a truth without one is the answer itself. The two
are compared with `math_verify.verify` (`\\frac{1}{2}` equals `0.5`, `1,234` equals `1234`).

math-verify bounds its work with `signal.alarm`, which only works in the main thread: there we
keep its timeouts, in any other thread (Ray actors' thread pools, asyncio executors) we switch
them off (`parsing_timeout=None`, `timeout_seconds=None`) instead of letting it fail.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from trinity.rewards.base import REWARD_FN, needs_truth, require_truth

_TIMEOUT_S = 5
_GSM8K = re.compile(r"####\s*([^\n]*?)\s*$", re.MULTILINE)
_BOXED = "\\boxed"
# The default of `format_reward`: the response ends with a \boxed{...} or a `#### ...` answer.
DEFAULT_FORMAT_PATTERN = r"(\\boxed\{.+\}|####\s*\S[^\n]*)\s*\.?\s*$"

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once when timeouts are off


def _last_boxed(text: str) -> tuple[int, str] | None:
    """(position, `\\boxed{content}`) of the last boxed answer with balanced braces."""
    start = text.rfind(_BOXED + "{")
    while start != -1:
        depth, i = 0, start + len(_BOXED)
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return start, text[start : i + 1]
            i += 1
        start = text.rfind(_BOXED + "{", 0, start)  # unbalanced: try an earlier one
    return None


def last_boxed_content(text: str) -> str | None:
    """What the last balanced `\\boxed{...}` of `text` holds; None without one."""
    boxed = _last_boxed(text)
    return None if boxed is None else boxed[1][len(_BOXED) + 1 : -1]


def extract_answer(text: str) -> str | None:
    """The final answer of `text`: its last `\\boxed{...}` or `#### ...`; None without one."""
    boxed = _last_boxed(text)
    gsm = list(_GSM8K.finditer(text))
    gsm_pos = gsm[-1].start() if gsm and gsm[-1].group(1) else -1
    if boxed is not None and boxed[0] > gsm_pos:
        return boxed[1]
    if gsm_pos >= 0:
        return gsm[-1].group(1)
    return None


def _as_math(answer: str) -> str:
    """Wrap a bare formula in `$...$` so math-verify reads it as LaTeX (`1+x`, `\\frac{1}{2}`);
    leave prose (`72 dollars`), boxed and already-delimited answers as they are."""
    if answer.startswith(_BOXED) or "$" in answer:
        return answer
    if re.search(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", "", answer)):
        return answer
    return f"${answer}$"


def answers_match(response: str, truth: str) -> bool:
    """True when math-verify finds the final answers of `response` and `truth` equal."""
    from math_verify import parse, verify

    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_text = _as_math((extract_answer(truth) or truth).strip())
    gold = parse(gold_text, parsing_timeout=timeout)  # type: ignore[arg-type]
    if not gold:
        raise ValueError(f"math_reward: math-verify cannot parse the truth {truth!r}")
    final = extract_answer(response)
    answer_text = response if final is None else _as_math(final.strip())
    answer = parse(answer_text, parsing_timeout=timeout)  # type: ignore[arg-type]
    if not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=timeout))


@REWARD_FN.register("math_reward")
@needs_truth
def math_reward(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    """{"accuracy": 1.0} when the response's final answer equals the truth's, else 0.0."""
    truth = require_truth("math_reward", truth)
    return {"accuracy": float(answers_match(response, truth))}


@REWARD_FN.register("format_reward")
def format_reward(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    pattern: str = DEFAULT_FORMAT_PATTERN,
    format_score: float = 0.1,
) -> dict[str, float]:
    """{"format": format_score} when `pattern` (re.search) matches the response, else 0.0."""
    return {"format": float(format_score) if re.search(pattern, response) else 0.0}


@REWARD_FN.register("math_with_format")
@needs_truth
def math_with_format(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    pattern: str = DEFAULT_FORMAT_PATTERN,
    format_score: float = 0.1,
) -> dict[str, float]:
    """The components of `math_reward` and `format_reward` together (their sum is the reward)."""
    return {
        **math_reward(response, truth, task_raw),
        **format_reward(response, truth, task_raw, pattern=pattern, format_score=format_score),
    }


def think_well_formed(text: str) -> bool:
    """Exactly one `<think>` and one `</think>`, in that order."""
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    return text.index("<think>") < text.index("</think>")


@REWARD_FN.register("math_boxed_reward")
@needs_truth
def math_boxed_reward(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    with_think: bool = False,
    format_score_coef: float = 0.1,
) -> dict[str, float]:
    """Trinity-RFT's `math_boxed_reward`: {"accuracy": 1.0 when the response's last `\\boxed{}`
    equals the truth (its own boxed or `####` answer if it has one), else 0.0 (also without a
    box), "format_score": -format_score_coef when `with_think` and the response's
    `<think>...</think>` is missing or repeated, else 0.0}.

    Departs from Trinity-RFT in how the two answers are compared: by math-verify (`0.5` equals
    `\\frac{1}{2}`, `1,234` equals `1234`), as `math_reward` does, instead of Hendrycks' MATH
    string normalisation.
    """
    truth = require_truth("math_boxed_reward", truth)
    boxed = _last_boxed(response)
    correct = boxed is not None and answers_match(boxed[1], truth)
    penalty = -float(format_score_coef) if with_think and not think_well_formed(response) else 0.0
    return {"accuracy": float(correct), "format_score": penalty}
