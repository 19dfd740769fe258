"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio; no token is dropped.

algorithm: {algorithm_type: cispo}     # or policy_loss_fn: cispo
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("cispo")
def cispo_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range_low: float = 1.0,
    clip_range_high: float = 0.28,
    enable_mask_clip: bool = False,
    mask_clip_range_low: float = 1.0,
    mask_clip_range_high: float = 0.28,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped IS-weight Policy Optimization (MiniMax-M1).

        r_t = exp(logprob_t - old_logprob_t)
        ℓ_t = -sg[clip(r_t, 1 - ε_low, 1 + ε_high)] · M_t · A_t · logprob_t
        M_t = 0 if (A_t > 0 and r_t > 1 + δ_high) or (A_t < 0 and r_t < 1 - δ_low), else 1
              (only with enable_mask_clip; otherwise M_t = 1)
        loss = agg(ℓ, m)

    PPO's clip zeroes the gradient of a token whose ratio left the trust region; CISPO clips only
    the weight, so every token keeps a gradient sg[w]·A·∇log π. The paper puts no lower bound on
    the weight (ε_low = 1.0: clip at 0) and tunes ε_high; these are Trinity-RFT's defaults too.
    The optional mask M is the paper's unified form, which turns the loss back into PPO-style
    token dropping.

    Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
    (arXiv:2506.13585), section 3.1.

    Args:
        inp.logprob: [B, T] log π_θ of the taken tokens (with grad).
        inp.old_logprob: [B, T] log π_old (no grad).
        inp.advantages: [B, T].
        inp.action_mask: [B, T] bool, True on trained tokens.
        agg: the loss aggregator.
        clip_range_low, clip_range_high: ε_low, ε_high of the weight's clip.
        enable_mask_clip: apply the token mask M.
        mask_clip_range_low, mask_clip_range_high: δ_low, δ_high of M.
    Returns:
        (loss, {pg_loss, pg_clipfrac, ppo_kl, is_weight_mean, unmasked_frac}). pg_clipfrac: the
        fraction of masked tokens whose IS weight was clipped, r_t outside [1 - ε_low,
        1 + ε_high] (verl's definition; such a token keeps its gradient, with the clipped
        weight); unmasked_frac: the fraction with M_t = 1.
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    log_ratio = (logprob - old_logprob).detach().clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # [B, T], no grad
    weight = ratio.clamp(1.0 - clip_range_low, 1.0 + clip_range_high)
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if enable_mask_clip:
        keep = ~(
            ((advantages > 0) & (ratio > 1.0 + mask_clip_range_high))
            | ((advantages < 0) & (ratio < 1.0 - mask_clip_range_low))
        )
    loss = agg(-(weight * keep) * advantages * logprob, action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((weight != ratio).float(), action_mask),
        "ppo_kl": masked_mean(-log_ratio, action_mask),
        "is_weight_mean": masked_mean(weight, action_mask),
        "unmasked_frac": masked_mean(keep.float(), action_mask),
    }
