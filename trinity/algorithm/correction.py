"""Off-policy correction against the engine's logprobs (`algorithm.rollout_correction`).

The engine that sampled a batch is the behaviour policy μ: its weights may be versions behind the
trainer's (asynchronous and off-policy modes) and its numerics differ (batching, kernels). PPO's
ratio π_θ/π_old assumes the samples came from π_old. The correction reweights (truncated
importance sampling, TIS) or drops (masked importance sampling, MIS) what came from too far away:

    δ_t  = log π_old(y_t) - log μ(y_t)               per trained token
    token:      w_t = exp(δ_t)
    sequence:   w_t = exp(Σ_t' δ_t')                  the same weight on every token of the row
    geometric:  w_t = exp(mean_t' δ_t')               (masking only; the length-normalised ratio)

    rollout_is: w ← min(w, C)  (C = rollout_is_threshold)      the loss uses A_t · w_t
    rollout_rs: tokens (token) or whole rows (sequence, geometric) whose w lies outside
                [rollout_rs_threshold_lower, rollout_rs_threshold] leave the train mask, and
                so the aggregation's token count; a row left with no trained token leaves
                the sequence count too (`Batch.num_seqs`), so a seq-mean mode averages over
                the sequences that are trained

With π_old recomputed by the trainer (it always is when a correction is on), the PPO clip on
π_θ/π_old times the weight π_old/μ is decoupled PPO ("Batch size-invariance for policy
optimization", arXiv:2110.13799; AReaL, arXiv:2505.24298); TIS follows "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (Yao et al., 2025) and the key names follow verl's
`algorithm.rollout_correction`. Log-weights are clamped to [-20, 20] before `exp`, as verl.

The weight multiplies the advantage (`PolicyLossInput.advantages`), which equals weighting the
per-token loss for every loss that is positively homogeneous in A (every built-in loss that
reads A; tested): w ≥ 0 keeps the sign that picks their branches. `sft` and `dpo` do not read A
and are not reweighted.

The engine's logprobs are those of the raw policy (temperature 1, no top-k/top-p filter; see
`trinity/explorer/engine.py`), the same distribution the trainer recomputes. So δ measures weight
staleness and numerical mismatch only. Sampling at another temperature or with a filter draws
from a sharpened or truncated distribution that this weight does not undo: sample at
temperature 1 without filters where strict on-policy data matters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")


MAX_LOG_WEIGHT = 20.0
Level = Literal["token", "sequence", "geometric"]


def log_weights(old_logprob: Tensor, rollout_logprob: Tensor, mask: Tensor, level: Level) -> Tensor:
    """Log importance weights log(π_old/μ) at `level`, broadcast to [B, T], 0 off the mask.

    Args:
        old_logprob: [B, T] log π_old.
        rollout_logprob: [B, T] log μ (the engine's).
        mask: [B, T] bool, trained tokens.
        level: token | sequence | geometric (see the module docstring).
    Returns:
        [B, T] float log-weights, clamped to [-20, 20].
    """
    m = mask.bool()
    delta = torch.where(m, old_logprob - rollout_logprob, torch.zeros_like(old_logprob))
    if level == "token":
        out = delta
    elif level in ("sequence", "geometric"):
        row = delta.sum(dim=-1, keepdim=True)  # [B, 1]
        if level == "geometric":
            row = row / m.sum(dim=-1, keepdim=True).clamp(min=1)
        out = row.expand_as(delta)
    else:
        raise ValueError(f"unknown correction level {level!r}. Valid: token, sequence, geometric")
    return torch.where(m, out.clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT), torch.zeros_like(out))


def rollout_correction(
    old_logprob: Tensor,
    rollout_logprob: Tensor,
    mask: Tensor,
    *,
    rollout_is: Literal["token", "sequence"] | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: Level | None = None,
    rollout_rs_threshold: float = 2.0,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """Truncated IS weights and the rejection mask for one train batch (module docstring).

    Args:
        old_logprob: [B, T] log π_old (recomputed by the trainer).
        rollout_logprob: [B, T] log μ, the engine's.
        mask: [B, T] bool, trained tokens.
        rollout_is: level of the truncated IS weight; None = no weight.
        rollout_is_threshold: C > 0, the weight's upper truncation.
        rollout_rs: level of the rejection mask; None = nothing dropped.
        rollout_rs_threshold: upper bound of the kept weights (> 1 to keep on-policy tokens).
        rollout_rs_threshold_lower: lower bound; None = 1 / rollout_rs_threshold.
    Returns:
        (weights [B, T] (0 off the mask) or None, keep [B, T] bool (mask minus the rejected),
        metrics: is_weight_mean, is_truncated_frac, rs_masked_frac, as fractions of trained
        tokens; rs_rejected_seq_frac, the fraction of rows with a trained token that lost
        every one).
    """
    m = mask.bool()
    n = max(int(m.sum()), 1)
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        if rollout_is not in ("token", "sequence"):
            raise ValueError(f"rollout_is must be token or sequence, got {rollout_is!r}")
        if rollout_is_threshold <= 0:
            raise ValueError(f"rollout_is_threshold must be > 0, got {rollout_is_threshold}")
        raw = torch.exp(log_weights(old_logprob, rollout_logprob, m, rollout_is))
        weights = torch.where(m, raw.clamp(max=rollout_is_threshold), torch.zeros_like(raw))
        metrics["is_weight_mean"] = float(weights.sum() / n)
        metrics["is_truncated_frac"] = float((m & (raw > rollout_is_threshold)).sum() / n)
    keep = m
    if rollout_rs is not None:
        hi = rollout_rs_threshold
        lo = 1.0 / hi if rollout_rs_threshold_lower is None else rollout_rs_threshold_lower
        if not 0 <= lo <= 1 <= hi:
            raise ValueError(
                f"rollout_rs thresholds must satisfy 0 <= lower <= 1 <= upper, got [{lo}, {hi}]"
            )
        w = torch.exp(log_weights(old_logprob, rollout_logprob, m, rollout_rs))
        keep = m & (w >= lo) & (w <= hi)
        metrics["rs_masked_frac"] = float((m & ~keep).sum() / n)
        rows = max(int(m.any(dim=-1).sum()), 1)
        metrics["rs_rejected_seq_frac"] = float(rejected_rows(m, keep).sum() / rows)
    return weights, keep, metrics


def rejected_rows(mask: Tensor, keep: Tensor) -> Tensor:
    """Rows the correction rejected entirely: a trained token before, none after.

    Such a row is no longer a sequence of the batch: with no trained token it is out of N_seqs,
    the seq-mean modes' denominator (`trinity.algorithm.aggregation`), as a row that never had
    one (a zero-mask experience) is; this count is what `rs_rejected_seq_frac` reports.

    Args:
        mask: [B, T] bool, trained tokens before the correction.
        keep: [B, T] bool, after it (`rollout_correction`'s second result).
    Returns:
        [B] bool.
    """
    return mask.bool().any(dim=-1) & ~keep.bool().any(dim=-1)


def mismatch_metrics(
    old_logprob: Tensor, rollout_logprob: Tensor, mask: Tensor, sequence_level: bool = False
) -> dict[str, float]:
    """How far the engine's policy μ is from π_old on the trained tokens.

        δ_t = log π_old - log μ
        mismatch_kl     = mean_t (e^δ - 1 - δ)    k3 estimate of KL(μ ‖ π_old), samples from μ
        mismatch_kl_k1  = mean_t (-δ)             k1 estimate of the same KL
        abs_logprob_diff = mean_t |δ|
        is_weight_{min,p50,p90,p99,max}: quantiles of e^δ per token (per row with
            `sequence_level`: e^(Σ_t δ_t), log clamped to [-20, 20])
        is_ess: effective sample size fraction (Σw)² / (n Σw²) of those weights, 1 on-policy

    Args:
        old_logprob, rollout_logprob: [B, T]. mask: [B, T] bool (rows without engine logprobs
            must be masked out by the caller).
    Returns:
        the metrics above; {} when the mask is empty.
    """
    m = mask.bool()
    if not m.any():
        return {}
    delta = (old_logprob - rollout_logprob)[m].double()  # [n]
    level: Level = "sequence" if sequence_level else "token"
    lw = log_weights(old_logprob, rollout_logprob, m, level).double()  # [B, T], 0 off the mask
    if sequence_level:  # the row's weight sits on each of its trained tokens: take it once
        rows = m.any(dim=-1)
        lw = (lw.sum(dim=-1)[rows] / m.sum(dim=-1)[rows]).double()
    else:
        lw = lw[m]
    w = lw.exp()  # one per row, or one per token
    q = torch.quantile(w, torch.tensor([0.5, 0.9, 0.99], dtype=w.dtype))
    return {
        "mismatch_kl": float((delta.exp() - 1 - delta).mean()),
        "mismatch_kl_k1": float((-delta).mean()),
        "abs_logprob_diff": float(delta.abs().mean()),
        "is_weight_min": float(w.min()),
        "is_weight_p50": float(q[0]),
        "is_weight_p90": float(q[1]),
        "is_weight_p99": float(q[2]),
        "is_weight_max": float(w.max()),
        "is_ess": float(w.sum() ** 2 / (w.numel() * (w**2).sum())),
    }
