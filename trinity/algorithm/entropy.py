"""Entropy of the policy and the entropy bonus (`algorithm.entropy_loss_fn`).

Entropy loss signature:

    fn(entropy [B, T], action_mask [B, T] bool, *, agg: Aggregator, **args)
        -> (loss 0-dim tensor, metrics dict[str, float])

Config: ``entropy_loss_fn: default`` with ``entropy_loss_fn_args: {entropy_coef: 0.001}``. A
positive coefficient rewards entropy (the loss is −coef·H), as in PPO's entropy bonus
("Proximal Policy Optimization Algorithms", arXiv:1707.06347, eq. 9).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from trinity.algorithm.aggregation import Aggregator
from trinity.common.lazy import lazy_module
from trinity.common.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")

ENTROPY_LOSS_FN: Registry = Registry("entropy_loss_fn")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim (`trinity.common.logits`, where the
    models' lean LM head computes it too); torch is imported on first use."""
    from trinity.common.logits import entropy_from_logits as entropy

    return entropy(logits)


@ENTROPY_LOSS_FN.register("default")
def entropy_loss(
    entropy: Tensor, action_mask: Tensor, *, agg: Aggregator, entropy_coef: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """Entropy bonus: loss = -entropy_coef · agg(entropy, action_mask).

    Args:
        entropy: [B, T] per-token entropy (with grad).
        action_mask: [B, T] bool.
        agg: the loss aggregator.
        entropy_coef: bonus weight (0 = only report the metric).
    Returns:
        (loss, {entropy: the aggregated entropy}).
    """
    ent = agg(entropy, action_mask)
    return -entropy_coef * ent, {"entropy": float(ent.detach())}


# Trinity-RFT's `mix`: the entropy bonus of the rollouts only; the trainer leaves expert rows
# out of every entropy term, so it is the default bonus
ENTROPY_LOSS_FN.register("mix")(entropy_loss)


@ENTROPY_LOSS_FN.register("none")
def no_entropy_loss(
    entropy: Tensor, action_mask: Tensor, *, agg: Aggregator
) -> tuple[Tensor, dict[str, float]]:
    """No entropy term: a 0-dim zero tensor (no grad) and no metrics."""
    del action_mask, agg
    return entropy.new_zeros(()), {}


def entropy_term_has_gradient(fn: Any, args: dict[str, Any]) -> bool:
    """Whether an entropy loss `fn` with `args` sends any gradient to the policy. Not
    `no_entropy_loss`, nor a fn whose `entropy_coef` (in `args`, else its default) is 0: its
    term only reports the entropy, so the trainer computes the entropy without autograd (the
    same values and gradients, without backpropagating 0 · H through every [N, V] logit)."""
    if fn is no_entropy_loss:
        return False
    coef = inspect.signature(fn).parameters.get("entropy_coef")
    if coef is None:  # a user's fn: its own rule
        return True
    value = args.get("entropy_coef", coef.default)
    return value is inspect.Parameter.empty or float(value) != 0.0
