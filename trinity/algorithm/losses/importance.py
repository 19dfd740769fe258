"""Unclipped losses: plain importance sampling and REINFORCE.

policy_loss_fn: importance_sampling    # on-policy distillation uses it
policy_loss_fn: reinforce
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("importance_sampling")
def importance_sampling_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
) -> tuple[Tensor, dict[str, float]]:
    """The importance-weighted surrogate without a clip (Trinity-RFT's `importance_sampling`).

        ρ_t = exp(logprob_t - old_logprob_t)      (log-ratio clamped to [-20, 20])
        ℓ_t = -A_t · ρ_t                          loss = agg(ℓ, m)
        ∇ℓ_t = -A_t · ρ_t · ∇log π_t

    Off-policy policy gradient with a per-token ratio (Degris et al., "Off-Policy Actor-Critic",
    arXiv:1205.4839); unbounded ρ makes it high-variance far from π_old.

    Args:
        inp.logprob: [B, T] (with grad). inp.old_logprob: [B, T]. advantages: [B, T].
        inp.action_mask: [B, T] bool. agg: the loss aggregator.
    Returns:
        (loss, {pg_loss, ppo_kl, ratio_mean}).
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss = agg(-advantages * ratio, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl": masked_mean(-log_ratio.detach(), action_mask),
        "ratio_mean": masked_mean(ratio.detach(), action_mask),
    }


@POLICY_LOSS_FN.register("reinforce")
def reinforce_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE: the score-function gradient, no ratio and no clip.

        ℓ_t = -A_t · logprob_t                    loss = agg(ℓ, m)
        ∇ℓ_t = -A_t · ∇log π_t

    Equals `importance_sampling`'s gradient at ρ = 1 (on-policy); off-policy it ignores the
    mismatch. Paper: Williams, "Simple Statistical Gradient-Following Algorithms for
    Connectionist Reinforcement Learning" (Machine Learning 8, 1992).

    Args:
        inp.logprob: [B, T] (with grad). inp.old_logprob: [B, T], only for the ppo_kl metric.
        inp.advantages: [B, T]. inp.action_mask: [B, T] bool. agg: the loss aggregator.
    Returns:
        (loss, {pg_loss, ppo_kl}).
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    loss = agg(-advantages * logprob, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl": masked_mean(old_logprob - logprob.detach(), action_mask),
    }
