"""Generalised advantage estimation from per-token rewards and critic values.

algorithm: {advantage_fn: gae, advantage_fn_args: {gamma: 1.0, lam: 0.95}}
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _masked_whiten, _out_dtype
from trinity.algorithm.inputs import AdvantageInput


def _gae(inp: AdvantageInput, *, gamma: float = 1.0, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) over the trained tokens, whitened over the batch (verl's `gae`).

        δ_t = r_t + γ·V_next(t) - V_t
        A_t = δ_t + γλ·A_next(t)            returns G_t = A_t + V_t (the critic's target)
        A  ← (A - μ) / sqrt(σ² + 1e-8)       μ, σ² (unbiased) over every trained token of the batch

    `next(t)` is the next TRAINED position of the row: an untrained position (an environment's
    observation tokens in a multi-turn row, padding) is skipped, carrying V and A through as
    verl does, and the value after the row's last trained token is 0. r_t are the token rewards
    (the outcome on the last trained token, minus a KL reward penalty).

    Paper: "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
    (arXiv:1506.02438); PPO for LLMs as in "Training language models to follow instructions
    with human feedback" (arXiv:2203.02155).

    Args:
        inp: token_rewards [N, T], values [N, T] (a critic is needed), response_mask are read.
        gamma: γ, the discount per token.
        lam: λ, the bias/variance trade-off (1 = Monte-Carlo returns minus V).
    Returns:
        (whitened advantages [N, T], returns [N, T]), 0 off the mask.
    """
    values = inp.require("values", "gae").to(torch.float64)
    m = inp.response_mask.to(torch.float64)
    r = inp.token_rewards.to(torch.float64) * m
    n, t_len = m.shape
    adv = torch.zeros(n, t_len, dtype=torch.float64, device=values.device)
    next_value = torch.zeros(n, dtype=torch.float64, device=values.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(t_len)):
        delta = r[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        mt = m[:, t]
        next_value = values[:, t] * mt + (1 - mt) * next_value
        next_adv = a_t * mt + (1 - mt) * next_adv
        adv[:, t] = next_adv
    returns = (adv + values) * m
    whitened = _masked_whiten(adv, inp.response_mask.bool()) * m
    dtype = _out_dtype(inp.rewards)
    return whitened.to(dtype), returns.to(dtype)


gae_advantage = ADVANTAGE_FN.register("gae")(_gae)
ADVANTAGE_FN.register("ppo")(_gae)  # Trinity-RFT's name for the PPO advantage
