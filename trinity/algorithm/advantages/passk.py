"""Pass@k advantage: each response's expected pass@k reward over the k-subsets it belongs to.

algorithm: {advantage_fn: passk, advantage_fn_args: {k: 4}}
"""

from __future__ import annotations

from math import comb, sqrt

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype
from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput


def passk_group_scores(correct: list[bool], k: int) -> list[float]:
    """Analytic pass@k advantages of one group of n responses (n ≥ k).

        R̄     = 1 - C(n_neg, k) / C(n, k)                      the group's pass@k
        σ      = sqrt(R̄ (1 - R̄))
        A_pos  = (1 - R̄) / σ                                   every k-subset with it passes
        A_neg  = (1 - R̄ - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / σ
                 (a k-subset with it fails iff its other k - 1 members are all wrong)
    σ = 0 (all right or all wrong): every advantage is 0. A group smaller than k (some of its
    rollouts failed) uses k = n.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    n, n_neg = len(correct), correct.count(False)
    k = min(k, n)
    mean = 1.0 - comb(n_neg, k) / comb(n, k)
    std = sqrt(mean * (1.0 - mean))
    if std == 0.0:
        return [0.0] * n
    a_pos = (1.0 - mean) / std
    a_neg = (1.0 - mean - comb(n_neg - 1, k - 1) / comb(n - 1, k - 1)) / std
    return [a_pos if c else a_neg for c in correct]


@ADVANTAGE_FN.register("passk")
def passk_advantage(
    inp: AdvantageInput, *, k: int = 4, threshold: float = 0.5
) -> tuple[Tensor, Tensor]:
    """Pass@k training's analytic advantage for binary rewards (`passk_group_scores`).

    A response is right when its reward exceeds `threshold`; a group's n responses are its
    episodes, each counted once (`trinity.algorithm.episodes`). Optimising pass@k instead of mean
    reward keeps a wrong answer's penalty small while the group still passes, which keeps
    exploring. With k = 1 it is GRPO on 0/1 rewards with the population std (σ = sqrt(p(1-p))).
    Returns = advantages.

    Paper: "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
    Reasoning Models" (arXiv:2508.10751).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        k: subset size >= 1 (a smaller group uses its own size).
        threshold: rewards above it count as right.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, rewards, groups = per_episode(inp)  # [N], [E], [E]
    scores = torch.zeros(rewards.shape[0], dtype=torch.float64)  # [E]
    right = (rewards > threshold).tolist()
    for g in torch.unique(groups).tolist():
        eps = (groups == g).nonzero().flatten().tolist()
        for e, a in zip(eps, passk_group_scores([right[i] for i in eps], k), strict=True):
            scores[e] = a
    adv = _broadcast(scores[episode].to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
