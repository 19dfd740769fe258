"""TOPR: tapered off-policy REINFORCE.

algorithm: {algorithm_type: topr}      # or policy_loss_fn: topr
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("topr")
def topr_policy_loss(
    inp: PolicyLossInput, *, agg: Aggregator, advantage_threshold: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """Tapered off-policy REINFORCE: full weight on good samples, a capped ratio on bad ones.

        ρ_t = π_θ(y_t) / μ(y_t)           (μ = π_old, the policy that sampled)
        α_t = 1                    if A_t > threshold     (positive: plain SFT-like push up)
        α_t = clip(ρ_t, 0, 1)      otherwise              (negative: truncated IS, push down less
                                                          where π_θ already dropped the token)
        ℓ_t = -sg[α_t] · A_t · log π_θ(y_t)              loss = agg(ℓ, m)

    The paper's A is the reward R(x, y); any advantage (a baseline) works (Trinity-RFT's record
    uses `reinforce`'s). With threshold 0 the loss is positively homogeneous in A, so an
    off-policy correction weight keeps its meaning; with another threshold a weight can move A
    across it.

    Paper: "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement learning for LLMs"
    (arXiv:2503.14286).

    Args:
        inp: logprob, old_logprob, advantages, action_mask are read.
        agg: the loss aggregator.
        advantage_threshold: A above it counts as positive.
    Returns:
        (loss, {pg_loss, topr_alpha, ratio_mean, ppo_kl}).
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    log_ratio = (logprob.detach() - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    alpha = torch.where(advantages > advantage_threshold, torch.ones_like(ratio), ratio.clamp(0, 1))
    loss = agg(-alpha * advantages * logprob, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "topr_alpha": masked_mean(alpha, action_mask),
        "ratio_mean": masked_mean(ratio, action_mask),
        "ppo_kl": masked_mean(-log_ratio, action_mask),
    }
