"""Quantities of a model's logits that both the models (the lean LM head) and the algorithm pieces
(entropy bonus, metrics) compute: kept here, below both, so neither imports the other."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, numerically stable.

        H = -Σ_v p_v log p_v = logsumexp(z) - Σ_v p_v z_v,   p = softmax(z)

    Args:
        logits: [..., V].
    Returns:
        [...] entropy in nats.
    """
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(dim=-1)
