"""The critic's loss: PPO's clipped value loss.

trainer: {critic: {cliprange_value: 0.5}}       # algorithm_type: ppo
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    agg: Aggregator,
    cliprange_value: float = 0.5,
) -> tuple[Tensor, dict[str, float]]:
    """½·max((V - G)², (clip(V, V_old - ε, V_old + ε) - G)²), aggregated over the masked tokens.

    The clip keeps one update from moving a value estimate more than ε from the one the
    advantages were computed with; taking the larger loss makes it pessimistic, as PPO's policy
    clip (verl's `compute_value_loss`).

    Paper: "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); the value clip is from
    OpenAI baselines' PPO2, used by verl and OpenRLHF.

    Args:
        values: [B, T] V_φ(s_t) of the critic being trained (with grad).
        old_values: [B, T] the values the advantages were computed with (no grad).
        returns: [B, T] targets G_t (GAE's returns).
        mask: [B, T] bool, trained tokens.
        agg: the aggregator (`algorithm.loss_agg_mode`, the whole batch's counts).
        cliprange_value: ε > 0.
    Returns:
        (loss, {vf_loss, vf_clipfrac, vpred_mean}).
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    clipped = torch.maximum(
        torch.minimum(values, old_values + cliprange_value), old_values - cliprange_value
    )
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss = 0.5 * agg(torch.maximum(loss_unclipped, loss_clipped), mask)
    return loss, {
        "vf_loss": float(loss.detach()),
        "vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask),
        "vpred_mean": masked_mean(values, mask),
    }
