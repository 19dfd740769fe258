"""Clip-Cov and KL-Cov: PPO variants that restrain the few tokens whose covariance between
advantage and log-probability drives the policy's entropy down.

algorithm: {policy_loss_fn: kl_cov, policy_loss_fn_args: {kl_cov_ratio: 0.002, ppo_kl_coef: 1.0}}
algorithm: {policy_loss_fn: clip_cov, policy_loss_fn_args: {clip_cov_ratio: 0.0002}}

The paper shows that the entropy change of a softmax policy under policy gradient follows the
covariance between a token's log-probability and its advantage, and that a small fraction of
tokens with a large covariance collapses the entropy. Both losses score each trained token of the
call (a micro-batch) by its centred product

    cov_t = (A_t - mean A) · (log π_t - mean log π)      (means over the call's trained tokens)

and restrain a fraction of them. Like verl, the score and the fraction are taken over the tokens
of one call, so with several micro-batches the selection (and so the loss) depends on how the
batch is split; the aggregation counts are the whole batch's as everywhere. With an off-policy
correction the score uses the corrected advantages A·w (`PolicyLossInput.advantages`), where verl
scores the raw ones.

Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (Cui et
al., arXiv:2505.22617); verl's `clip_cov` and `kl_cov` loss modes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


def centred_covariance(advantages: Tensor, logprob: Tensor, mask: Tensor) -> Tensor:
    """cov_t = (A_t - mean A)·(log π_t - mean log π), means over the masked tokens; [B, T],
    detached, 0 off the mask."""
    m = mask.bool()
    n = m.sum().clamp(min=1)
    a, lp = advantages.detach(), logprob.detach()
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    mean_a = torch.where(m, a, zero).sum() / n
    mean_lp = torch.where(m, lp, zero).sum() / n
    return torch.where(m, (a - mean_a) * (lp - mean_lp), zero)


def _count(ratio: float, mask: Tensor) -> int:
    """max(1, ⌊ratio · trained tokens⌋): how many tokens a Cov loss restrains."""
    return max(int(ratio * int(mask.sum())), 1)


@POLICY_LOSS_FN.register("clip_cov")
def clip_cov_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    seed: int = 0,
) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov: PPO's clipped surrogate with the gradient of a few high-covariance tokens cut.

        ρ_t  = exp(logprob_t - old_logprob_t)     (log-ratio clamped to [-20, 20]; verl does not)
        ℓ_t  = max(-A_t·ρ_t, -A_t·clip(ρ_t, 1 - ε_low, 1 + ε_high))      (PPO, no dual clip)
        C    = trained tokens that PPO's clip left unclipped with clip_cov_lb < cov_t < clip_cov_ub
        S    = min(|C|, max(1, ⌊clip_cov_ratio · trained tokens⌋)) tokens of C drawn uniformly
        ℓ_t  = 0 on S (no value, no gradient)
        loss = agg(ℓ, m)

    The draw is random as in the paper and verl, but seeded (`seed` + `inp.step`): the same
    batch at the same step restrains the same tokens, so a run is reproducible. Defaults are the
    paper's and verl's (r = 2e-4, bounds 1 and 5). The bounds are absolute, so the selection
    depends on the advantages' scale (and, with a correction, on the weights).

    Args:
        inp: logprob [B, T] (with grad), old_logprob, advantages, action_mask are read.
        agg: the loss aggregator.
        clip_range, clip_range_low, clip_range_high: PPO's ε (ε_low / ε_high override it).
        clip_cov_ratio: r > 0, the fraction of trained tokens restrained at most.
        clip_cov_lb, clip_cov_ub: the covariance band of the candidates.
        seed: the draw's seed (mixed with the step).
    Returns:
        (loss, {pg_loss, pg_clipfrac, ppo_kl}): pg_clipfrac = |S| / trained tokens (verl's
        definition for this loss: the tokens Clip-Cov cut, not PPO's clip); ppo_kl = mean -log ρ.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    logprob, old_logprob, advantages, action_mask = inp.core()
    m = action_mask.bool()
    lo = clip_range if clip_range_low is None else clip_range_low
    hi = clip_range if clip_range_high is None else clip_range_high
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - lo, 1.0 + hi)
    cov = centred_covariance(advantages, logprob, m)  # [B, T]
    ppo_clipped = loss_clipped > loss_unclipped
    band = m & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    candidates = band.flatten().nonzero().flatten()  # [n_candidates]
    generator = torch.Generator().manual_seed(int(seed) + int(inp.step))
    order = torch.randperm(candidates.numel(), generator=generator).to(candidates.device)
    chosen = candidates[order[: _count(clip_cov_ratio, m)]]
    cut = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    cut[chosen] = True
    cut = cut.view_as(m)  # [B, T]
    loss_mat = torch.where(cut, 0.0, torch.maximum(loss_unclipped, loss_clipped))
    loss = agg(loss_mat, m)
    return loss, {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": masked_mean(cut.float(), m),
        "ppo_kl": masked_mean(-log_ratio.detach(), m),
    }


@POLICY_LOSS_FN.register("kl_cov")
def kl_cov_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov: the unclipped surrogate, with a |log-ratio| penalty on the top-covariance tokens.

        ρ_t  = exp(logprob_t - old_logprob_t)     (log-ratio clamped to [-20, 20]; verl does not)
        K    = the k = max(1, ⌊kl_cov_ratio · trained tokens⌋) trained tokens of largest cov_t
        ℓ_t  = -A_t·ρ_t + [t ∈ K] · β·|logprob_t - old_logprob_t|
        loss = agg(ℓ, m)

    No ratio clip: the trust region is the penalty on the selected tokens only. Defaults are
    verl's (k = 2e-4, β = 1); the paper uses k = 2e-3 for its 7B model and 2e-4 for 32B. With
    an off-policy correction the penalty is weighted by w_t (`PolicyLossInput.weigh`), as verl
    weighs the whole token loss.

    Args:
        inp: logprob [B, T] (with grad), old_logprob, advantages, action_mask are read.
        agg: the loss aggregator.
        kl_cov_ratio: the fraction k > 0 of trained tokens penalised.
        ppo_kl_coef: β ≥ 0.
    Returns:
        (loss, {pg_loss, ppo_kl_abs, kl_cov_frac}): ppo_kl_abs = mean_t |log ρ_t| (verl logs this
        under the name ppo_kl, which is mean_t -log ρ_t for every other loss here); kl_cov_frac
        = |K| / trained tokens.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    logprob, old_logprob, advantages, action_mask = inp.core()
    m = action_mask.bool()
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)
    cov = centred_covariance(advantages, logprob, m)  # [B, T]
    selected = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    if m.any():
        scores = torch.where(m, cov, -torch.inf).flatten()
        k = min(_count(kl_cov_ratio, m), int(m.sum()))
        selected[torch.topk(scores, k).indices] = True
    selected = selected.view_as(m)  # [B, T]
    penalty = torch.where(selected, ppo_kl_coef * log_ratio.abs(), 0.0)
    loss = agg(-advantages * ratio + inp.weigh(penalty), m)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl_abs": masked_mean(log_ratio.abs().detach(), m),
        "kl_cov_frac": masked_mean(selected.float(), m),
    }
