"""REC's group advantage: the reward minus the group mean, with an optional balancing drop.

algorithm: {algorithm_type: rec}       # or advantage_fn: rec
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype
from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput


def rec_scores(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = False,
    drop: str | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """REC's per-episode score [E] float64 (see `rec_advantage`), one group at a time."""
    if drop not in (None, "balance"):
        raise ValueError(f"rec: drop must be None or 'balance', got {drop!r}")
    r = rewards.to(torch.float64)
    out = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero().flatten()  # [n] this group's episodes
        rg = r[idx]
        keep = torch.ones(len(idx), dtype=torch.bool)
        neg = (rg < rg.mean()).nonzero().flatten()  # below the mean: negative
        extra = len(neg) - (len(idx) - len(neg))
        if drop == "balance" and extra > 0:  # as many negatives as positives stay
            keep[neg[torch.randperm(len(neg), generator=generator)[:extra]]] = False
        if int(keep.sum()) <= 1:
            mean, std = rg.new_tensor(0.0), rg.new_tensor(1.0)
        else:
            mean, std = rg[keep].mean(), rg[keep].std(unbiased=False)
        score = (rg - mean) / (std + epsilon) if std_normalize else rg - mean
        out[idx] = torch.where(keep, score, torch.zeros_like(score))
    return out


@ADVANTAGE_FN.register("rec")
def rec_advantage(
    inp: AdvantageInput,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = False,
    drop: str | None = None,
) -> tuple[Tensor, Tensor]:
    """REC's group-relative advantage.

        A_i = r_i - mean_K                       (std_normalize=False, the default)
        A_i = (r_i - mean_K) / (std_K + epsilon) (std_normalize=True)

    K is the group's kept episodes: all of them, or with drop="balance", when the group has
    more negatives (r < the group mean) than positives, that many surplus negatives drawn at
    random (torch's global generator) are dropped: they get A = 0 and leave mean_K and std_K.
    std_K is the POPULATION std (n, not n-1), as Trinity-RFT's REC. When at most one episode is
    kept, mean_K = 0 and std_K = 1 (a group of one gets A = r). The statistics run over the
    group's episodes, each counted once (`trinity.algorithm.episodes`). Returns = advantages.

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some
    Myths About GRPO and Its Friends" (arXiv:2509.24203).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        epsilon: added to std_K.
        std_normalize: divide by std_K + epsilon.
        drop: None or "balance".
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    scores = rec_scores(r, groups, epsilon=epsilon, std_normalize=std_normalize, drop=drop)
    adv = _broadcast(scores[episode].to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
