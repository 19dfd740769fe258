"""DPPO: a trust region on the sampled token's probability shift instead of PPO's ratio clip.

algorithm: {policy_loss_fn: dppo_tv, policy_loss_fn_args: {clip_range: 0.15}}     # or dppo_kl, 0.05
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN

BINARY_KL_EPS = 1e-8  # verl's guard in log((1 - p_old) / (1 - p))


def binary_tv(prob: Tensor, old_prob: Tensor) -> Tensor:
    """Signed binary total variation p - p_old: the TV distance between (p, 1 - p) and
    (p_old, 1 - p_old) is |p - p_old|; the sign says which way the sampled token moved."""
    return prob - old_prob


def binary_kl(logprob: Tensor, old_logprob: Tensor) -> Tensor:
    """KL((p_old, 1 - p_old) ‖ (p, 1 - p)) = p_old·log(p_old/p) + (1-p_old)·log((1-p_old)/(1-p))
    from the log-probabilities, the second log guarded by 1e-8 in numerator and denominator
    (verl)."""
    prob, old_prob = torch.exp(logprob), torch.exp(old_logprob)
    rest = torch.log((1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS))
    return old_prob * (old_logprob - logprob) + (1.0 - old_prob) * rest


def _dppo(
    inp: PolicyLossInput,
    agg: Aggregator,
    divergence: str,
    clip_range: float,
    clip_range_low: float | None,
    clip_range_high: float | None,
    clip_ratio_c: float | None,
    anchor: str,
) -> tuple[Tensor, dict[str, float]]:
    logprob, old_logprob, advantages, action_mask = inp.core()
    if anchor == "rollout":
        old_logprob = inp.require("rollout_logprob", f"dppo_{divergence} with anchor: rollout")
    elif anchor != "old":
        raise ValueError(f"anchor must be 'old' or 'rollout', got {anchor!r}")
    lo = clip_range if clip_range_low is None else clip_range_low
    hi = clip_range if clip_range_high is None else clip_range_high
    log_ratio = (logprob - old_logprob).detach().clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)
    weight = ratio if clip_ratio_c is None else ratio.clamp(max=clip_ratio_c)
    prob, old_prob = torch.exp(logprob.detach()), torch.exp(old_logprob)
    if divergence == "tv":
        shift = binary_tv(prob, old_prob)  # [B, T]
        keep_pos, keep_neg = shift <= hi, shift >= -lo
    else:
        kl = binary_kl(logprob.detach(), old_logprob)  # [B, T]
        keep_pos = (kl <= hi) | (prob <= old_prob)
        keep_neg = (kl <= lo) | (prob >= old_prob)
    valid = torch.where(advantages > 0, keep_pos, keep_neg)  # [B, T] bool
    loss_mat = -advantages * (weight * valid) * logprob
    loss = agg(loss_mat, action_mask)
    truncated = torch.zeros_like(valid) if clip_ratio_c is None else ratio > clip_ratio_c
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((~valid).float(), action_mask),
        "pg_clipfrac_lower": masked_mean((truncated & valid).float(), action_mask),
        "ppo_kl": masked_mean(-log_ratio, action_mask),
    }


_DOC = """DPPO-Binary-{name}: importance-weighted policy gradient inside a divergence trust region.

        r_t  = exp(logprob_t - old_logprob_t)      (log-ratio clamped to [-20, 20]; π_old = μ
                                                    with anchor: rollout)
        p_t  = π_θ(y_t), p_old_t = π_old(y_t)      (the sampled token's probabilities)
        {formula}
        V_t  = up_t if A_t > 0 else down_t       (the move the advantage asks for stays inside)
        ℓ_t  = -A_t · sg[min(r_t, C)] · V_t · logprob_t
        loss = agg(ℓ, m)

    ∇ℓ_t = -A_t·min(r_t, C)·∇log π_t = -A_t·∇r_t where r_t < C: the unclipped surrogate's
    gradient, dropped (V_t = 0) only on the tokens whose update would leave the trust region in
    the harmful direction. PPO bounds the ratio r_t, which a rare token exceeds with a tiny
    absolute change and a likely token stays under with a large one; DPPO bounds the change of
    the distribution, approximated on the binary split (sampled token, everything else). The
    Top-K approximation of the paper is not built.

    Paper: "Rethinking the Trust Region in LLM Reinforcement Learning" (Qi et al.,
    arXiv:2602.04879); verl's `dppo_{lower}` loss mode (same mask, truncation and metrics). The
    paper anchors the region on the engine's policy μ (its §5.2; verl's bypass mode):
    `anchor: rollout` uses the engine's logprobs as π_old (do not combine it with
    `rollout_correction`, which would weigh by π_old/μ again).

    Args:
        inp: logprob [B, T] (with grad), old_logprob, advantages, action_mask are read
            (rollout_logprob too with anchor: rollout).
        agg: the loss aggregator.
        clip_range: δ for both sides ({default}, the paper's and verl's example value);
            clip_range_low / clip_range_high override it (δ_low for A ≤ 0, δ_high for A > 0).
        clip_ratio_c: C, the truncation of the importance weight (verl's default 20; None = no
            truncation; the paper's runs disable it).
        anchor: "old" (π_old, the trainer's recomputed or pre-update logprobs) or "rollout".
    Returns:
        (loss, {{pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl}}), verl's definitions:
        pg_clipfrac = fraction of masked tokens with V_t = 0; pg_clipfrac_lower = fraction with
        V_t = 1 and r_t > C (weight truncated); ppo_kl = mean_t -log r_t.
    """


@POLICY_LOSS_FN.register("dppo_tv")
def dppo_tv_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float = 0.15,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 20.0,
    anchor: str = "old",
) -> tuple[Tensor, dict[str, float]]:
    return _dppo(inp, agg, "tv", clip_range, clip_range_low, clip_range_high, clip_ratio_c, anchor)


@POLICY_LOSS_FN.register("dppo_kl")
def dppo_kl_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float = 0.05,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 20.0,
    anchor: str = "old",
) -> tuple[Tensor, dict[str, float]]:
    return _dppo(inp, agg, "kl", clip_range, clip_range_low, clip_range_high, clip_ratio_c, anchor)


dppo_tv_policy_loss.__doc__ = _DOC.format(
    name="TV",
    lower="tv",
    default="0.15",
    formula="up_t = [p_t - p_old_t ≤ δ_high],  down_t = [p_t - p_old_t ≥ -δ_low]",
)
dppo_kl_policy_loss.__doc__ = _DOC.format(
    name="KL",
    lower="kl",
    default="0.05",
    formula="D_t  = KL((p_old, 1-p_old) ‖ (p, 1-p))      (`binary_kl`)\n"
    "        up_t = [D_t ≤ δ_high or p_t ≤ p_old_t],  down_t = [D_t ≤ δ_low or p_t ≥ p_old_t]",
)
