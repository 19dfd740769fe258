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


def token_stats_from_logits(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per position: the logprob of `labels`, the entropy, and NEC, in float32.

        log p_y,   H = -Σ_v p_v log p_v,   NEC = Σ_v p_v² (H + log p_v)

    NEC is Clip_V's "expected" entropy indicator: E_{y~p}[p_y (H + log p_y)]
    (`trinity.algorithm.advantages.entropy_clip`).

    Args:
        logits: [n, V].
        labels: [n] token ids.
    Returns:
        (logprob [n], entropy [n], nec [n]).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    p = logp.exp()
    entropy = -(p * logp).sum(dim=-1)
    nec = (p * p * (entropy[:, None] + logp)).sum(dim=-1)
    return logp.gather(-1, labels[:, None]).squeeze(-1), entropy, nec
