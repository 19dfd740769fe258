"""Policy losses (`algorithm.policy_loss_fn`, args in `policy_loss_fn_args`).

One signature for every policy loss (`trinity.algorithm.inputs`):

    fn(inp: PolicyLossInput, *, agg: Aggregator, **args) -> (loss 0-dim tensor, metrics dict[str, float])

`inp` holds logprob (with grad), old_logprob, advantages and action_mask [B, T], plus the
engine's rollout logprobs and the reference logprobs where the batch has them.

The loss is reduced with `agg` (see `aggregation.py`); metrics are plain masked means of detached
tensors, as python floats.

Config: ``policy_loss_fn: ppo`` with ``policy_loss_fn_args: {clip_range_low: 0.2,
clip_range_high: 0.28}`` (DAPO's decoupled clip).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.common.lazy import lazy_module
from trinity.common.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")

# losses in modules of their own (`trinity/algorithm/losses/`), imported on first use
POLICY_LOSS_FN: Registry = Registry(
    "policy_loss_fn",
    modules={
        "gspo": "trinity.algorithm.losses.gspo",
        "cispo": "trinity.algorithm.losses.cispo",
        "sapo": "trinity.algorithm.losses.sapo",
        "importance_sampling": "trinity.algorithm.losses.importance",
        "reinforce": "trinity.algorithm.losses.importance",
        "topr": "trinity.algorithm.losses.topr",
        "opmd": "trinity.algorithm.losses.opmd",
        "sppo": "trinity.algorithm.losses.opmd",
        "geo_mean": "trinity.algorithm.losses.gmpo",
        "gmpo": "trinity.algorithm.losses.gmpo",
        "dpo": "trinity.algorithm.losses.dpo",
        "mix": "trinity.algorithm.losses.mix",
        "mix_chord": "trinity.algorithm.losses.mix",
        "dro": "trinity.algorithm.losses.dro",
        "dppo_tv": "trinity.algorithm.losses.dppo",
        "dppo_kl": "trinity.algorithm.losses.dppo",
        "clip_cov": "trinity.algorithm.losses.cov",
        "kl_cov": "trinity.algorithm.losses.cov",
        "rec": "trinity.algorithm.losses.rec",
    },
)


@POLICY_LOSS_FN.register("ppo")
def ppo_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    clip_range: float = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, with DAPO's decoupled clip and optional dual clip.

        ρ_t = exp(logprob_t - old_logprob_t)            (log-ratio clamped to [-20, 20], as verl)
        ℓ_t = max(-A_t·ρ_t, -A_t·clip(ρ_t, 1 - ε_low, 1 + ε_high))
        dual clip (A_t < 0 only): ℓ_t = min(ℓ_t, -A_t·c)
        loss = agg(ℓ, action_mask)

    Papers: "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); decoupled clip from
    "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv:2503.14476); dual clip
    from "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"
    (arXiv:1912.09729).

    Args:
        inp.logprob: [B, T] log π_θ of the taken tokens (with grad).
        inp.old_logprob: [B, T] log π_old of the same tokens (no grad).
        inp.advantages: [B, T].
        inp.action_mask: [B, T] bool, True on trained tokens.
        agg: the loss aggregator.
        clip_range: ε, used for whichever of ε_low / ε_high is None.
        clip_range_low: ε_low (DAPO); None = clip_range.
        clip_range_high: ε_high (DAPO, e.g. 0.28); None = clip_range.
        clip_ratio_c: dual-clip constant c > 1; 3.0 by default, as in verl and Trinity-RFT
            (it bounds the loss of a negative-advantage token whose ratio exploded); None = off.
    Returns:
        (loss, {pg_loss, pg_clipfrac, ppo_kl, ratio_mean[, pg_clipfrac_lower with the dual clip]}).
        pg_clipfrac: fraction of masked tokens where the clipped branch is the active (larger) one;
        pg_clipfrac_lower: fraction where the dual clip is active.
    """
    logprob, old_logprob, advantages, action_mask = inp.core()
    eps_low = clip_range if clip_range_low is None else clip_range_low
    eps_high = clip_range if clip_range_high is None else clip_range_high
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}")
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss_mat = torch.maximum(loss_unclipped, loss_clipped)  # [B, T]
    metrics: dict[str, float] = {}
    if clip_ratio_c is not None:
        loss_dual = -advantages * clip_ratio_c
        dual_active = (advantages < 0) & (loss_mat > loss_dual)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, loss_dual), loss_mat)
        metrics["pg_clipfrac_lower"] = masked_mean(dual_active.float(), action_mask)
    loss = agg(loss_mat, action_mask)
    metrics.update(
        {
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), action_mask),
            "ppo_kl": masked_mean(old_logprob - logprob.detach(), action_mask),
            "ratio_mean": masked_mean(ratio.detach(), action_mask),
        }
    )
    return loss, metrics


@POLICY_LOSS_FN.register("sft")
def sft_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning: negative log-likelihood of the masked tokens.

        loss = agg(-logprob, action_mask)

    Args:
        inp.logprob: [B, T] log π_θ of the target tokens (with grad).
        inp.action_mask: [B, T] bool, True on target tokens.
        agg: the loss aggregator.
    Returns:
        (loss, {sft_loss}).
    """
    loss = agg(-inp.logprob, inp.action_mask)
    return loss, {"sft_loss": float(loss.detach())}
