"""verl's `grpo_passk` advantage: only each group's best response learns, by its margin over the
runner-up (the leave-one-out gradient of pass@n / max@n).

algorithm: {advantage_fn: grpo_passk, advantage_fn_args: {std_normalize: true}}

Distinct from `passk` (`advantages/passk.py`, arXiv:2508.10751), which gives every response of a
group the analytic pass@k advantage of 0/1 rewards for any k ≤ n.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype, group_stats
from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("grpo_passk")
def grpo_passk_advantage(
    inp: AdvantageInput, *, epsilon: float = 1e-6, std_normalize: bool = True
) -> tuple[Tensor, Tensor]:
    """Best-of-group advantage for the pass@n (max-reward) objective.

        i* = argmax_{j in g} r_j
        A_i* = (r_(1) - r_(2)) / (std_g + ε)       r_(1) ≥ r_(2) the group's two largest rewards,
                                                    std_g unbiased (n-1); without std_normalize
                                                    A_i* = r_(1) - r_(2)
        A_i = 0 for every other response of the group

    The objective E[max_j r_j] over the n samples of a prompt has the leave-one-out gradient
    Σ_i (max_j r_j - max_{j≠i} r_j) ∇log π(y_i), which is nonzero only for the best sample, by
    its margin over the second best. The samples are the group's episodes, each counted once
    (every row of the best one gets the margin: `trinity.algorithm.episodes`). A tie for the
    best gives 0 to the whole group, whichever
    row holds the max. A group of one gets 0 (verl raises: a failed rollout that shrinks a
    group should not end the run). Returns = advantages. verl's `grpo_passk`.

    Paper: "Optimizing Language Models for Inference Time Objectives using Reinforcement
    Learning" (Tang et al., arXiv:2503.19595), the k = n pass@k case, as verl cites it.

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        epsilon: added to the std.
        std_normalize: divide the margin by std_g + ε (verl's `norm_adv_by_std_in_grpo`).
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    n = r.numel()
    count, _, sq_dev, _ = group_stats(r, groups)  # [E] each
    _, inv = torch.unique(groups, return_inverse=True)  # [E] in 0..G-1
    g = int(inv.max()) + 1 if n else 0
    # sort by (group, reward descending, episode): each group's first episode is its best
    order = torch.argsort(r, descending=True, stable=True)
    order = order[torch.argsort(inv[order], stable=True)]  # [E]
    starts = torch.zeros(g, dtype=torch.long, device=r.device)
    starts[1:] = torch.bincount(inv, minlength=g).cumsum(0)[:-1]
    best = order[starts]  # [G] episode of each group's best
    second = order[(starts + 1).clamp(max=max(n - 1, 0))]  # [G] (meaningless for a group of one)
    margin = r[best] - r[second]  # [G]
    std = (sq_dev[best] / (count[best] - 1).clamp(min=1)).sqrt()  # [G]
    if std_normalize:
        margin = margin / (std + epsilon)
    margin = torch.where(count[best] > 1, margin, 0.0)
    scores = torch.zeros_like(r)
    scores[best] = margin
    adv = _broadcast(scores[episode].to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
