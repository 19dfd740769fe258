"""Replayed experiences keep the trust region of the policy that sampled them.

A replay copy (`info["use_count"]` > 0: trinity/buffer/replay.py) was already trained on, so the
policy being trained has moved since its engine μ sampled it. Recomputing π_old with the current
weights, as a fresh experience's is, would start each reuse at ratio 1: PPO's clip would bound a
step from where the policy IS, not from where the data came from, and every reuse could push the
same tokens another ε further. PPO's several epochs over one batch clip against the policy that
collected it (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", §5), so a copy's
π_old is its rollout logprobs μ: the ratio π_θ/μ of a token already moved past 1 ± ε by an
earlier use gets no more gradient in that direction. Fresh experiences are unchanged.
"""

from __future__ import annotations

import torch

from trinity.algorithm.correction import mismatch_metrics
from trinity.trainer.batch import Batch


def clip_copies_to_behaviour(batch: Batch, trained: torch.Tensor) -> dict[str, float]:
    """Set the replayed rows' `old_logprobs` (recomputed with the current weights) to their
    rollout logprobs; return how far the current policy had drifted from μ on those rows'
    trained tokens before (`replay/behaviour_*`, `mismatch_metrics`' keys)."""
    assert batch.old_logprobs is not None and batch.replayed is not None
    rows = batch.replayed & batch.rollout_known  # a copy without engine logprobs keeps π_old
    if not bool(rows.any()):
        return {}
    mask = trained & rows[:, None]
    drift = mismatch_metrics(batch.old_logprobs, batch.rollout_logprobs, mask)
    batch.old_logprobs[rows] = batch.rollout_logprobs[rows]
    return {f"replay/behaviour_{k}": v for k, v in drift.items() if not k.startswith("is_")}
