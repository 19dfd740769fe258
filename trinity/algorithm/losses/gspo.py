"""GSPO: the PPO clip on a sequence-level, length-normalised importance ratio.

algorithm: {algorithm_type: gspo}      # or policy_loss_fn: gspo on another algorithm
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN

MAX_LOG_RATIO = 10.0  # verl clamps the sequence log-ratio from above at 10 (e^10 ≈ 2.2e4)


@POLICY_LOSS_FN.register("gspo")
def gspo_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float | None = None,
    clip_range_low: float = 3e-4,
    clip_range_high: float = 4e-4,
) -> tuple[Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization, in its GSPO-token form (verl's `gspo` loss).

        s_i     = exp( (1/|y_i|) Σ_t m_it (logprob_it - old_logprob_it) )   (sequence ratio)
        s_it    = sg[s_i] · π_θ(y_it) / sg[π_θ(y_it)]     (= s_i in value; ∇s_it = s_i ∇log π_it)
        ℓ_it    = max(-A_it·s_it, -A_it·clip(s_it, 1 - ε_low, 1 + ε_high))
        loss    = agg(ℓ, m)        (the paper averages per sequence: seq-mean-token-mean)

    With one advantage per sequence (A_it = A_i, as GRPO gives) this is the paper's sequence-level
    GSPO exactly; GSPO-token lets A vary by token. The log of s_i is clamped above at 10, as verl
    does. The clip range is in ratio units and tiny (3e-4 / 4e-4, the paper's and verl's values)
    because s_i is a geometric mean: a length-normalised ratio moves far less than a token's.

    Paper: "Group Sequence Policy Optimization" (arXiv:2507.18071).

    Args:
        inp.logprob: [B, T] log π_θ of the taken tokens (with grad).
        inp.old_logprob: [B, T] log π_old of the same tokens (no grad).
        inp.advantages: [B, T].
        inp.action_mask: [B, T] bool, True on trained tokens; a row without one has s_i = 1.
        agg: the loss aggregator.
        clip_range: ε for both sides when given (overrides clip_range_low / clip_range_high).
        clip_range_low: ε_low.
        clip_range_high: ε_high.
    Returns:
        (loss, {pg_loss, pg_clipfrac, ppo_kl, ppo_kl_seq, seq_ratio_mean}). pg_clipfrac: fraction
        of masked tokens where the clipped branch is active; ppo_kl_seq: mean over sequences
        with a trained token of -(1/|y_i|) Σ_t log-ratio; seq_ratio_mean: mean s_i over them.
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    if clip_range is not None:
        clip_range_low = clip_range_high = clip_range
    m = action_mask.bool()
    log_ratio = torch.where(m, logprob - old_logprob, torch.zeros_like(logprob))  # [B, T]
    length = m.sum(dim=-1).clamp(min=1).to(logprob.dtype)  # [B]
    seq_log_ratio = log_ratio.sum(dim=-1) / length  # [B]
    log_s = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, T]
    s = torch.exp(log_s.clamp(max=MAX_LOG_RATIO))
    loss_unclipped = -advantages * s
    loss_clipped = -advantages * s.clamp(1.0 - clip_range_low, 1.0 + clip_range_high)
    loss = agg(torch.maximum(loss_unclipped, loss_clipped), m)
    rows = m.any(dim=-1)  # [B]
    seq = seq_log_ratio.detach()[rows]
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), m),
        "ppo_kl": masked_mean(-log_ratio, m),
        "ppo_kl_seq": float(-seq.mean()) if seq.numel() else 0.0,
        "seq_ratio_mean": float(seq.exp().mean()) if seq.numel() else 0.0,
    }
