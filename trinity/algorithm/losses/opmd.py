"""OPMD's and sPPO's losses: policy gradients without PPO's clip.

policy_loss_fn: opmd        # algorithm_type: opmd
policy_loss_fn: sppo        # algorithm_type: sppo
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("opmd")
def opmd_policy_loss(
    inp: PolicyLossInput, *, agg: Aggregator, tau: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """Online policy mirror descent's surrogate: the policy gradient scaled by 1 / (1 + τ).

        ℓ_t = -A_t · log π_θ(y_t) / (1 + τ)              loss = agg(ℓ, m)

    With OPMD's advantage (reward minus the group's τ-soft baseline, `advantage_fn: opmd`) the
    gradient is that of the mirror-descent step toward π* ∝ π_old·exp(r/τ); 1/(1 + τ) is its
    step size with the KL term on the current policy (Trinity-RFT's OPMD).

    Papers: "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv:2501.12599); Trinity-RFT
    (arXiv:2505.17826).

    Args:
        inp: logprob, advantages, action_mask are read (old_logprob for the ppo_kl metric).
        agg: the loss aggregator.
        tau: τ ≥ 0.
    Returns:
        (loss, {pg_loss, ppo_kl}).
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    logprob, old_logprob, advantages, action_mask = inp.core()
    loss = agg(-advantages * logprob, action_mask) / (1.0 + tau)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl": masked_mean(old_logprob - logprob.detach(), action_mask),
    }


@POLICY_LOSS_FN.register("sppo")
def sppo_policy_loss(
    inp: PolicyLossInput, *, agg: Aggregator, epsilon: float = 0.3
) -> tuple[Tensor, dict[str, float]]:
    """sPPO-token: the log-ratio surrogate, with tokens outside the trust region dropped.

        ρ_t = exp(log π_θ - log π_old)
        ℓ_t = -A_t · log ρ_t · 1[1/(1+ε) ≤ ρ_t ≤ 1+ε]     loss = agg(ℓ, m)
        ∇ℓ_t = -A_t · ∇log π_θ inside the region, 0 outside

    The gradient equals REINFORCE's where the policy has not moved far, and stops where it has
    (the indicator is a stop-gradient mask, as in Trinity-RFT's `sppo`).

    Paper: Vaswani et al., "A general class of surrogate functions for stable and efficient
    reinforcement learning" (arXiv:2108.05828), its sPPO surrogate, per token.

    Args:
        inp: logprob, old_logprob, advantages, action_mask are read.
        agg: the loss aggregator.
        epsilon: ε > 0, the trust region 1/(1+ε) ≤ ρ ≤ 1+ε.
    Returns:
        (loss, {pg_loss, pg_clipfrac}).
    """
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    logprob, old_logprob, advantages, action_mask = inp.core()
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio.detach())
    inside = (ratio >= 1.0 / (1.0 + epsilon)) & (ratio <= 1.0 + epsilon)
    loss = agg(-advantages * log_ratio * inside, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((~inside).float(), action_mask),
    }
