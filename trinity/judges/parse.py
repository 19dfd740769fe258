"""Reading a judge's verdict out of its reply: one score, or one score per response of a group.

    parse_score("... the answer is right.\nScore: 8", 0, 10)      # Parsed(8.0)
    parse_score('```json\n{"rating": 7}\n```', 1, 10)             # Parsed(7.0)
    parse_scores("... so: [0.2, 0.9, 0.5]", 3, 0, 1)              # Parsed([0.2, 0.9, 0.5])

A reply that does not hold a verdict in the expected form is never guessed at: the result says
why (`Parsed.error`), and the caller's failure policy decides what happens (`judges/judge.py`).
Numbers are read with `json` or `ast.literal_eval`, never `eval`.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any

_OBJECT = re.compile(r"\{[^{}]*\}")  # a JSON object without nested objects
_LIST = re.compile(r"\[[^\[\]]*\]")  # a bracketed list without nested lists
# `Score: 8`, `**Rating**: 7.5`, `score = 3/10` (the number before a slash is the score)
_LINE = re.compile(r"(?i)\b(?:score|rating)\b[*_\s]*[:=][*_\s]*(-?\d+(?:\.\d+)?)")
SCORE_KEYS = ("score", "rating")


@dataclass(frozen=True)
class Parsed:
    """A verdict read from a reply (`value`), or why none could be (`error`)."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _number(x: Any) -> float | None:
    """`x` as a finite float when it is a number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _in_range(x: float, low: float, high: float) -> str | None:
    return None if low <= x <= high else f"score {x:g} outside [{low:g}, {high:g}]"


def parse_score(text: str, low: float, high: float) -> Parsed:
    """One score in [low, high] from a judge's reply.

    1. the last JSON object in the reply with a numeric "score" or "rating" key (a ```json
       block or inline);
    2. else the last `Score: N` / `Rating: N` (any case, markdown emphasis allowed, `N/10`
       read as N);
    3. else a failure, as is a score outside [low, high] (it is not clipped).
    """
    for raw in reversed(_OBJECT.findall(text)):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        key = next((k for k in SCORE_KEYS if isinstance(obj, dict) and k in obj), None)
        if key is None:
            continue
        value = _number(obj[key])
        if value is None:
            return Parsed(error=f"the JSON {key!r} is not a number: {obj[key]!r}")
        return _bounded(value, low, high)
    lines = _LINE.findall(text)
    if lines:
        return _bounded(float(lines[-1]), low, high)
    return Parsed(error='no score found (expected "Score: N" or a JSON object with a "score")')


def _bounded(value: float, low: float, high: float) -> Parsed:
    why = _in_range(value, low, high)
    return Parsed(error=why) if why else Parsed(value)


def parse_scores(text: str, n: int, low: float, high: float) -> Parsed:
    """n scores in [low, high], in the order the judge saw the responses: the last bracketed
    list in the reply that reads as a list (`[0.2, 0.9]`). A failure when there is none, when
    it holds other than n entries, a non-number, or a score outside [low, high]."""
    found = None
    for raw in reversed(_LIST.findall(text)):
        found = _literal_list(raw)
        if found is not None:
            break
    if found is None:
        return Parsed(error=f"no list of scores found (expected [s1, ..., s{n}])")
    if len(found) != n:
        return Parsed(error=f"{len(found)} scores for {n} responses")
    scores = [_number(x) for x in found]
    if any(x is None for x in scores):
        return Parsed(error=f"not all scores are numbers: {found!r}")
    for x in scores:
        assert x is not None
        if why := _in_range(x, low, high):
            return Parsed(error=why)
    return Parsed(scores)


def _literal_list(raw: str) -> list[Any] | None:
    """`raw` read as a JSON or Python literal list; None if it is not one."""
    for read in (json.loads, ast.literal_eval):
        try:
            value = read(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, list):
            return value
    return None
