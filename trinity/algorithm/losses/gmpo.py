"""GMPO: the PPO clip on the geometric mean of a sequence's token ratios.

policy_loss_fn: geo_mean        # (or gmpo)
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


def geo_mean_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float = 0.4,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Geometric-Mean Policy Optimization: one objective per sequence, clipped in log space.

        d_t   = log π_θ(y_t) - log π_old(y_t),  s = sign(A_i)
        d̃_t   = s · min(s·d_t, s·clip(d_t, -ε_low, ε_high))     (PPO's pessimistic side, per token)
        ρ̄_i   = exp( (1/|y_i|) Σ_t d̃_t )                         (geometric mean of the ratios)
        ℓ_i   = -Ā_i · ρ̄_i,   Ā_i = mean_t A_it                  loss = Σ_i ℓ_i / N_seqs

    The geometric mean is less sensitive to one token's outlier ratio than GRPO's arithmetic
    mean, so the clip can be wider (ε = 0.4 in log space, the paper's and verl's default). The
    loss is a mean over sequences whatever `loss_agg_mode` is (`Aggregator.seq_mean`); a row
    without a trained token contributes 0. verl's `geo_mean`.

    Paper: "GMPO: Geometric-Mean Policy Optimization" (arXiv:2507.20673).

    Args:
        inp: logprob, old_logprob, advantages, action_mask are read.
        agg: the aggregator (its global sequence count).
        clip_range: ε for both sides, in log-ratio units; clip_range_low / _high override it.
    Returns:
        (loss, {pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl, seq_ratio_mean}), verl's
        definitions: a token is clipped when its log-ratio d_t lies outside [-ε_low, ε_high]
        (whichever side the min then picks); pg_clipfrac is the fraction of masked tokens that
        are clipped with A > 0, pg_clipfrac_lower with A < 0; ppo_kl = mean_t -d_t;
        seq_ratio_mean = mean ρ̄_i over rows with a trained token.
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    lo = clip_range if clip_range_low is None else clip_range_low
    hi = clip_range if clip_range_high is None else clip_range_high
    m = action_mask.bool()
    d = torch.where(m, logprob - old_logprob, torch.zeros_like(logprob))  # [B, T]
    s = torch.sign(advantages)
    d_min = s * torch.minimum(s * d, s * d.clamp(-lo, hi))
    length = m.sum(dim=-1).to(logprob.dtype)  # [B]
    has = length > 0
    seq_ratio = torch.exp((d_min * m).sum(dim=-1) / length.clamp(min=1))  # [B]
    seq_adv = (advantages * m).sum(dim=-1) / length.clamp(min=1)  # [B]
    seq_loss = torch.where(has, -seq_adv * seq_ratio, torch.zeros_like(seq_ratio))
    loss = agg.seq_mean(seq_loss)
    clipped = (d != d.clamp(-lo, hi)) & m  # [B, T] outside the band
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((clipped & (advantages > 0)).float(), m),
        "pg_clipfrac_lower": masked_mean((clipped & (advantages < 0)).float(), m),
        "ppo_kl": masked_mean(-d.detach(), m),
        "seq_ratio_mean": float(seq_ratio.detach()[has].mean()) if has.any() else 0.0,
    }


POLICY_LOSS_FN.register("geo_mean")(geo_mean_policy_loss)
POLICY_LOSS_FN.register("gmpo")(geo_mean_policy_loss)
