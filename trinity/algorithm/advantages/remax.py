"""ReMax: REINFORCE with the reward of the task's greedy answer as the baseline.

algorithm: {algorithm_type: remax}
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _out_dtype
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("remax")
def remax_advantage(inp: AdvantageInput) -> tuple[Tensor, Tensor]:
    """A_it = G_it - b_i, the undiscounted return minus the greedy answer's reward (verl's
    `remax`).

        G_it = Σ_{t' ≥ t} r_it'   over the trained tokens (the outcome reward, minus any KL
                                  penalty, summed from t to the end)
        b_i  = reward of a greedy (temperature 0) answer to row i's task, scored by the same
               reward fn (`inp.baselines`; the explorer produces it for `remax`)

    The greedy answer is what the policy does without exploration, so a sample is pushed up
    only if it beats it: a baseline from one extra generation per task instead of a critic or
    a group. Returns = G.

    Paper: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models" (arXiv:2310.10505).

    Args:
        inp: token_rewards [N, T], baselines [N], response_mask [N, T] are read.
    Returns:
        (advantages [N, T], returns [N, T]), 0 off the mask.
    """
    baselines = inp.require("baselines", "remax").to(torch.float64)
    m = inp.response_mask.to(torch.float64)
    r = inp.token_rewards.to(torch.float64) * m
    returns = r.flip(-1).cumsum(-1).flip(-1) * m
    adv = returns - baselines[:, None] * m
    dtype = _out_dtype(inp.rewards)
    return adv.to(dtype), returns.to(dtype)
