"""OPO's advantage: the reward minus the group's length-weighted mean reward.

algorithm: {advantage_fn: opo}       # with an exactly on-policy loss, e.g. policy_loss_fn: reinforce
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype, group_stats
from trinity.algorithm.episodes import episode_sums, per_episode
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("opo")
def opo_advantage(inp: AdvantageInput) -> tuple[Tensor, Tensor]:
    """On-Policy RL with Optimal reward baseline (OPO).

        L_j = trained tokens of episode j (over all its rows; the baseline runs over the
              group's episodes, each counted once: `trinity.algorithm.episodes`)
        b_g = Σ_{j in g} L_j · r_j / Σ_{j in g} L_j          (length-weighted group mean)
        A_i = r_i - b_g

    The baseline that minimises the gradient's variance weighs each reward by the squared norm
    of its sequence's score function; under the paper's assumption that this norm grows with
    the length, it is the length-weighted mean. A group of one gets b = 0 (verl's convention,
    as `grpo`'s mean); a group whose rewards are all equal gets exactly A = 0 (float64, max ==
    min); a group without a trained token takes b = 0 (its advantages are masked out anyway).
    Returns = advantages. verl's `opo` estimator.

    Paper: "On-Policy RL with Optimal Reward Baseline" (Hao et al., arXiv:2505.23585); the paper
    pairs it with exactly on-policy updates (one update per batch) and no KL term.

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    lengths = episode_sums(inp.response_mask.sum(dim=-1), episode, r.numel())  # [E]
    count, _, _, flat = group_stats(r, groups)
    _, inv = torch.unique(groups, return_inverse=True)  # [E] in 0..G-1
    g = int(inv.max()) + 1 if inv.numel() else 0
    zeros = torch.zeros(g, dtype=torch.float64, device=r.device)
    weighted = zeros.clone().index_add_(0, inv, lengths * r)[inv]  # [E] Σ L·r of the group
    total_len = zeros.clone().index_add_(0, inv, lengths)[inv]  # [E] Σ L of the group
    baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1), 0.0)
    baseline = torch.where(count == 1, 0.0, baseline)
    scores = torch.where(flat & (count > 1), 0.0, r - baseline)[episode]
    adv = _broadcast(scores.to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
