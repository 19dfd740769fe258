"""Step-wise GRPO: a multi-turn episode is one row per turn; the episode's last turn is scored.

algorithm: {algorithm_type: multi_step_grpo}      # or advantage_fn: step_wise_grpo
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, _broadcast, _out_dtype, grpo_scores
from trinity.algorithm.episodes import episode_index
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("step_wise_grpo")
def step_wise_grpo_advantage(
    inp: AdvantageInput,
    *,
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_threshold: float | None = None,
    std_cal_level: str = "group",
) -> tuple[Tensor, Tensor]:
    """GRPO over episodes, each scored by its last turn, broadcast to every turn of the episode.

        R_e  = reward of episode e's last turn (the row with the largest step id)
        s_e  = GRPO score of R_e among the episodes of its task (`grpo_advantage`'s options)
        A_it = s_e(i) · m_it          (÷ the episode's number of turns with enable_step_norm)

    Rows of one episode share (group id, run id); a turn's row is one step of it
    (`trinity.algorithm.episodes.episode_index`). Rewards of the
    earlier turns are ignored, as in Trinity-RFT's `step_wise_grpo` (after rLLM). Returns =
    advantages.

    Paper: GRPO, arXiv:2402.03300; the broadcast of the final outcome to every step follows rLLM
    (Agentica, "rLLM: a framework for post-training language agents", 2025).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are read.
        epsilon, std_threshold, std_cal_level: as `grpo_advantage` (normalised over episodes).
        enable_step_norm: divide each episode's advantage by its number of turns.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    ep, n_ep = episode_index(inp.group_ids, inp.run_ids, inp.step_ids)  # [N]
    steps = inp.step_ids.long()
    zeros_l = torch.zeros(n_ep, dtype=torch.long, device=steps.device)
    last_step = zeros_l.scatter_reduce(0, ep, steps, "amax", include_self=False)  # [E]
    is_last = (steps == last_step[ep]).to(torch.float64)  # [N]
    r = inp.rewards.to(torch.float64)
    zeros = torch.zeros(n_ep, dtype=torch.float64, device=r.device)
    ep_reward = zeros.index_add(0, ep, r * is_last) / zeros.index_add(0, ep, is_last)  # [E]
    ep_group = zeros_l.scatter_reduce(0, ep, inp.group_ids.long(), "amax", include_self=False)
    scores = grpo_scores(
        ep_reward,
        ep_group,
        epsilon=epsilon,
        std_threshold=std_threshold,
        std_cal_level=std_cal_level,
    )[ep]  # [N]
    if enable_step_norm:
        turns = zeros.index_add(0, ep, torch.ones_like(r))  # [E]
        scores = scores / turns[ep]
    adv = _broadcast(scores.to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()
