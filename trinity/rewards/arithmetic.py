"""`arithmetic_reward`: exact integer answers (the synthetic `arithmetic` tasks).

The last number in the response is compared with the integer truth; a sign counts only when it
is unary (`-5`, `= -5`), so `10-5` reads as 5. Thousands separators (`1,234`) are allowed.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from trinity.rewards.base import REWARD_FN, needs_truth, require_truth

# An optional sign, then 1,234 / 1234 / 12.50.
_NUMBER = re.compile(r"([+-]?)\s*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!\d)")


def last_number(text: str) -> Fraction | None:
    """The value of the last number in `text` (None if there is none)."""
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    sign, whole, frac = m.groups()
    value = Fraction(whole.replace(",", "") + (frac or ""))
    before = text[: m.start()].rstrip()
    binary = bool(before) and (before[-1].isdigit() or before[-1] == ")")  # `10-5`, `(3) - 5`
    return -value if sign == "-" and not binary else value


@REWARD_FN.register("arithmetic_reward")
@needs_truth
def arithmetic_reward(
    response: str, truth: str | None, task_raw: dict[str, Any]
) -> dict[str, float]:
    """{"accuracy": 1.0} when the last number of the response equals int(truth), else 0.0."""
    expected = last_number(require_truth("arithmetic_reward", truth))
    if expected is None:
        raise ValueError(f"arithmetic_reward: truth {truth!r} holds no number")
    got = last_number(response)
    return {"accuracy": float(got is not None and got == expected)}
