"""SAPO: a smooth, sign-dependent sigmoid gate on the importance ratio instead of a hard clip.

algorithm: {algorithm_type: sapo}      # or policy_loss_fn: sapo
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("sapo")
def sapo_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimization: the paper's objective, differentiated by autograd.

        r_t  = exp(logprob_t - old_logprob_t)
        τ_t  = τ_pos if A_t > 0 else τ_neg
        f(r) = (4 / τ) · σ(τ (r - 1))
        ℓ_t  = -f(r_t) · A_t                       loss = agg(ℓ, m)
        ∇ℓ_t = -A_t · 4 σ_t (1 - σ_t) · r_t · ∇log π_t

    The gate's slope is 1 at r = 1, so on-policy tokens get the plain policy gradient, and the
    weight 4σ(1-σ)·r decays smoothly as r leaves 1 (faster for negative advantages, τ_neg > τ_pos),
    where PPO's clip cuts the gradient off. The paper averages per sequence (seq-mean-token-mean,
    the `sapo` algorithm's default).

    Deliberate difference from Trinity-RFT's `sapo`, which minimises -sg[f(r)]·A·log π: that
    weighs the gradient by f(r) (2/τ at r = 1, twice the paper's) instead of f'(r)·r.

    Paper: "Soft Adaptive Policy Optimization" (arXiv:2511.20347).

    Args:
        inp.logprob: [B, T] log π_θ of the taken tokens (with grad).
        inp.old_logprob: [B, T] log π_old (no grad).
        inp.advantages: [B, T].
        inp.action_mask: [B, T] bool, True on trained tokens.
        agg: the loss aggregator.
        tau_pos, tau_neg: the gate's temperatures for positive and other advantages (> 0).
    Returns:
        (loss, {pg_loss, ppo_kl, gate_mean, ratio_mean}). gate_mean: mean f(r_t).
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # [B, T]
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = agg(-gate * advantages, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl": masked_mean(-log_ratio.detach(), action_mask),
        "gate_mean": masked_mean(gate.detach(), action_mask),
        "ratio_mean": masked_mean(ratio.detach(), action_mask),
    }
