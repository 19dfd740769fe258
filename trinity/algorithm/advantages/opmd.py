"""OPMD's group baseline: the group mean, or τ·log-mean-exp(r/τ).

algorithm: {algorithm_type: opmd}      # or advantage_fn: opmd
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype, group_stats
from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("opmd")
def opmd_advantage(
    inp: AdvantageInput, *, opmd_baseline: str = "mean", tau: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Online policy mirror descent's advantage: the reward minus a group baseline.

        A_i = r_i - b_g
        b_g = mean_j r_j                                   (opmd_baseline="mean")
        b_g = τ · log( (1/n) Σ_j exp(r_j / τ) )            (opmd_baseline="logavgexp")

    log-avg-exp is the soft maximum the KL-regularised optimum π* ∝ π·exp(r/τ) implies for the
    group's value; it lies between the mean (τ → ∞) and the max (τ → 0). The baseline runs over
    the group's episodes, each counted once (`trinity.algorithm.episodes`). A group of one gets
    b = 0 (Trinity-RFT's convention). Returns = advantages.

    Papers: "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv:2501.12599, online policy
    mirror descent, whose optimal baseline is τ·log E[exp(r/τ)]); Trinity-RFT's OPMD
    (arXiv:2505.17826).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        opmd_baseline: "mean" | "logavgexp".
        tau: τ > 0, the temperature of logavgexp.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    if opmd_baseline not in ("mean", "logavgexp"):
        raise ValueError(f"opmd_baseline must be 'mean' or 'logavgexp', got {opmd_baseline!r}")
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    count, total, _, _ = group_stats(r, groups)  # [E]
    if opmd_baseline == "mean":
        baseline = total / count
    else:  # log-mean-exp, stabilised by the group max
        _, inv = torch.unique(groups, return_inverse=True)
        g = int(inv.max()) + 1 if inv.numel() else 0
        z = r / tau
        zmax = torch.full((g,), -math.inf, dtype=torch.float64).scatter_reduce(
            0, inv, z, "amax", include_self=True
        )  # [G]
        sum_exp = torch.zeros(g, dtype=torch.float64).index_add(0, inv, torch.exp(z - zmax[inv]))
        baseline = (tau * (zmax + torch.log(sum_exp)))[inv] - tau * torch.log(count)
    scores = torch.where(count == 1, r, r - baseline)[episode]
    adv = _broadcast(scores.to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()


@ADVANTAGE_FN.register("asymre")
def asymre_advantage(inp: AdvantageInput, *, baseline_shift: float = -0.1) -> tuple[Tensor, Tensor]:
    """Asymmetric REINFORCE's advantage: the group mean shifted by δ as the baseline.

        A_i = r_i - (mean_g + δ)         (mean over the group's episodes; a group of one:
                                          baseline 0, as Trinity-RFT)

    δ < 0 (the default -0.1) lowers the baseline, so more samples count as positive: off-policy,
    the paper shows this tilt toward positive rewards keeps REINFORCE stable. Returns =
    advantages.

    Paper: "Asymmetric REINFORCE for off-Policy Reinforcement Learning: Balancing positive and
    negative rewards" (arXiv:2506.20520).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        baseline_shift: δ.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    count, total, _, _ = group_stats(r, groups)
    baseline = torch.where(count == 1, torch.zeros_like(r), total / count + baseline_shift)
    adv = _broadcast((r - baseline)[episode].to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
