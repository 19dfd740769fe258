"""REC: REINFORCE with clipping as regularisation (token masks from the ratio), optional
importance or advantage weights and an additive regulariser.

algorithm: {algorithm_type: rec, policy_loss_fn_args: {clip_mode: one-side, weight: none}}
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN

CLIP_MODES = ("none", "one-side", "gspo-one-side", "two-side", "ring")
WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling", "advantage")
REGULARIZERS = ("none", "k2", "forward-kl")


def _validate(
    clip_mode: str, weight: str, regularizer: str, bounds: dict[str, tuple[float, bool]]
) -> None:
    """ValueError naming the first bad choice or the first argument out of its range."""
    for name, value, valid in (
        ("clip_mode", clip_mode, CLIP_MODES),
        ("weight", weight, WEIGHTS),
        ("regularizer", regularizer, REGULARIZERS),
    ):
        if value not in valid:
            raise ValueError(f"rec: {name} must be one of {', '.join(valid)}; got {value!r}")
    for name, (value, ok) in bounds.items():
        if not ok:
            raise ValueError(f"rec: {name} out of range: {value}")


def in_range(
    ratio: Tensor,
    seq_ratio: Tensor,
    adv: Tensor,
    clip_mode: str,
    lo: float,
    hi: float,
    lo2: float,
    hi2: float,
) -> Tensor:
    """[B, T] bool: the tokens REC trains (its clipping is a mask, not a clamp); module doc of
    `rec_policy_loss` for each mode."""
    pos, neg = adv >= 0, adv <= 0
    if clip_mode == "two-side":
        return (ratio >= 1 - lo) & (ratio <= 1 + hi)
    if clip_mode == "one-side":
        return (pos & (ratio <= 1 + hi)) | (neg & (ratio >= 1 - lo))
    if clip_mode == "gspo-one-side":
        return (pos & (seq_ratio <= 1 + hi)) | (neg & (seq_ratio >= 1 - lo))
    if clip_mode == "ring":
        inner = (ratio >= 1 - lo) & (ratio <= 1 + hi)
        return inner | (pos & (ratio <= 1 - lo2)) | (neg & (ratio >= 1 + hi2))
    return torch.ones_like(ratio, dtype=torch.bool)


@POLICY_LOSS_FN.register("rec")
def rec_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    epsilon_low_prime: float = 0.4,
    epsilon_high_prime: float = 0.4,
    clip_mode: str = "none",
    weight: str = "none",
    regularizer: str = "none",
    regularizer_coef: float = 0.0,
    temp: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """REC's policy loss: a REINFORCE term on the tokens the clip mask keeps.

        r_t = sg[exp(logprob_t - old_logprob_t)]
        s_i = sg[exp(mean_{t in row i} (logprob_t - old_logprob_t))]   (sequence ratio)
        ℓ_t = -A'_t · logprob_t · K_t  (+ c·(logprob_t - old_logprob_t)²  regularizer=k2)
                                        (- c·logprob_t                     regularizer=forward-kl)
        A'_t = A_t (weight=none), A_t·r_t (importance_sampling), A_t·s_i
               (gspo_importance_sampling), A_t·exp(A_t / temp) (advantage)
        K_t  = 1 (clip_mode=none)
             | 1-ε_lo ≤ r_t ≤ 1+ε_hi (two-side)
             | (A_t ≥ 0 and r_t ≤ 1+ε_hi) or (A_t ≤ 0 and r_t ≥ 1-ε_lo) (one-side; gspo-one-side
               with s_i for r_t)
             | two-side or (A_t ≥ 0 and r_t ≤ 1-ε'_lo) or (A_t ≤ 0 and r_t ≥ 1+ε'_hi) (ring)
        loss = agg(ℓ, m)   (gspo-one-side: seq-mean-token-mean, whatever loss_agg_mode says)

    With an off-policy correction (weights w already in A) the regulariser is weighed by w and
    the advantage weight takes exp(A/w / temp), so the whole per-token loss is w·ℓ (the
    `PolicyLossInput` contract). Trinity-RFT averages REC per token (token-mean) in every other
    clip mode, whatever
    `loss_agg_mode` says; here they follow `loss_agg_mode`, whose default in the `rec` record is
    token-mean. Its `gspo_importance_sampling` weight exists only with `gspo-one-side` there;
    here s_i is computed for every mode. The primes' defaults (0.4, 0.4) are Trinity-RFT's
    constructor's, what it uses whenever a config gives `policy_loss_fn_args`.

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some
    Myths About GRPO and Its Friends" (arXiv:2509.24203), section 2.2.

    Args:
        inp.logprob: [B, T] log π_θ (with grad); inp.old_logprob: [B, T] log π_old (no grad);
        inp.advantages: [B, T]; inp.action_mask: [B, T] bool.
        agg: the loss aggregator.
        epsilon_low, epsilon_high: ε_lo ∈ (0, 1], ε_hi > 0.
        epsilon_low_prime, epsilon_high_prime: the ring's outer bounds ε'_lo ∈ (0, 1], ε'_hi > 0.
        clip_mode: none | one-side | gspo-one-side | two-side | ring.
        weight: none | importance_sampling | gspo_importance_sampling | advantage.
        regularizer: none | k2 | forward-kl; regularizer_coef: c ≥ 0.
        temp: the advantage weight's temperature, > 0.
    Returns:
        (loss, {pg_loss, pg_clipfrac}): pg_clipfrac is the masked fraction with K_t = 0.
    """
    _validate(
        clip_mode,
        weight,
        regularizer,
        {
            "epsilon_low (0 < ε ≤ 1)": (epsilon_low, 0.0 < epsilon_low <= 1.0),
            "epsilon_high (> 0)": (epsilon_high, epsilon_high > 0.0),
            "epsilon_low_prime (0 < ε ≤ 1)": (epsilon_low_prime, 0.0 < epsilon_low_prime <= 1.0),
            "epsilon_high_prime (> 0)": (epsilon_high_prime, epsilon_high_prime > 0.0),
            "regularizer_coef (≥ 0)": (regularizer_coef, regularizer_coef >= 0.0),
            "temp (> 0)": (temp, temp > 0.0),
        },
    )
    logprob, old_logprob, adv, mask = inp.core()
    diff = (logprob - old_logprob).detach()  # [B, T]
    ratio = torch.exp(diff.clamp(-20.0, 20.0))
    m = mask.to(diff.dtype)
    seq_ratio = torch.exp((diff * m).sum(-1) / m.sum(-1).clamp(min=1)).unsqueeze(-1)  # [B, 1]
    keep = in_range(
        ratio, seq_ratio, adv, clip_mode, epsilon_low, epsilon_high,
        epsilon_low_prime, epsilon_high_prime,
    )  # fmt: skip
    if weight == "importance_sampling":
        adv = adv * ratio
    elif weight == "gspo_importance_sampling":
        adv = adv * seq_ratio
    elif weight == "advantage":  # exp of the uncorrected A: the loss stays w·ℓ(A) (inputs.py)
        w = inp.is_weights
        raw = adv if w is None else torch.where(w > 0, adv / w.clamp(min=1e-30), 0.0)
        adv = adv * torch.exp(raw / temp)
    per_token = -adv * logprob * keep
    if regularizer == "forward-kl":
        per_token = per_token - inp.weigh(regularizer_coef * logprob)
    elif regularizer == "k2":
        per_token = per_token + inp.weigh(regularizer_coef * (logprob - old_logprob) ** 2)
    if clip_mode == "gspo-one-side":
        agg = dataclasses.replace(agg, mode="seq-mean-token-mean")
    loss = agg(per_token, mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((~keep).float(), mask),
    }
