"""`exact_match`: the response, stripped of surrounding whitespace, is the truth, character for character.

For answers whose spelling matters, not only their value: zero-padded or reversed digits (`05`,
where `arithmetic_reward` would also take `5`), labels, code tokens.
"""

from __future__ import annotations

from typing import Any

from trinity.rewards.base import REWARD_FN, needs_truth, require_truth


@REWARD_FN.register("exact_match")
@needs_truth
def exact_match(response: str, truth: str | None, task_raw: dict[str, Any]) -> dict[str, float]:
    """{"accuracy": 1.0} when response.strip() == truth.strip(), else 0.0."""
    expected = require_truth("exact_match", truth).strip()
    return {"accuracy": float(response.strip() == expected)}
