"""GPG's advantage: the group-centred reward, rescaled for the rows that carry no signal.

algorithm: {algorithm_type: gpg}      # or advantage_fn: gpg
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype, group_stats
from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("gpg")
def gpg_advantage(inp: AdvantageInput, *, f_norm: float = 1.0) -> tuple[Tensor, Tensor]:
    """Group Policy Gradient's advantage (no std normalisation, no ratio in its loss).

        A_i = α · (r_i - mean_g) / F_norm,      α = N / M
        M   = number of episodes with r_i ≠ mean_g (those of flat groups and groups of one carry
              no gradient; α restores the batch's gradient scale, the paper's α = B / (B - M_0))

    Counted over episodes (N of them; an episode split into rows counts once, and each of its
    rows gets its advantage: `trinity.algorithm.episodes`).

    A group of one gets mean 0 (verl's convention), so its row keeps A = α·r/F_norm and counts
    in M when r ≠ 0. Deliberate difference from verl's `gpg`: verl sets M to the number of
    nonzero raw rewards; we count nonzero centred scores, the paper's definition (for 0/1
    rewards verl's M counts the correct answers, not the informative rows). Returns = advantages.

    Paper: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
    (arXiv:2504.02546); its loss is REINFORCE's (`policy_loss_fn: reinforce`).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        f_norm: F_norm > 0, a constant divisor.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    if f_norm <= 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    count, total, _, flat = group_stats(r, groups)
    single = count == 1
    centred = torch.where(single, r, r - total / count)
    centred = torch.where(flat & ~single, torch.zeros_like(centred), centred)
    informative = int((centred != 0).sum())
    alpha = r.numel() / max(informative, 1)
    scores = (alpha * centred / f_norm)[episode]
    adv = _broadcast(scores.to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
