"""Reward shaping before the advantage: DAPO's soft overlong punishment.

algorithm: {overlong_penalty: {enable: true, buffer_len: 4096, penalty_factor: 1.0}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")


def overlong_penalty(
    lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """The length penalty of each response (added to its reward).

        R_len(y) = 0                                   |y| ≤ L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| ≤ L_max
                 = -1                                  |y| > L_max
        penalty  = penalty_factor · R_len(y)

    A response is penalised linearly as it enters the last L_cache tokens of the budget, so a
    truncated answer (|y| = L_max) gets -penalty_factor instead of a reward its truncation made
    arbitrary. Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
    (arXiv:2503.14476), eq. 13.

    Args:
        lengths: [N] response lengths in tokens (end-of-turn token included).
        max_len: L_max (`model.max_response_tokens`).
        buffer_len: L_cache, 1 ≤ L_cache ≤ L_max.
        penalty_factor: the penalty at L_max.
    Returns:
        [N] float penalties, ≤ 0.
    """
    if not 1 <= buffer_len <= max_len:
        raise ValueError(f"overlong buffer_len must be in [1, {max_len}], got {buffer_len}")
    start = max_len - buffer_len
    n = lengths.to(torch.float64)
    ramp = (start - n) / buffer_len
    r = torch.where(n <= start, torch.zeros_like(n), torch.clamp(ramp, min=-1.0))
    return (penalty_factor * r).to(torch.float32)
