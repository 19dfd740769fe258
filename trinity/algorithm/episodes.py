"""Episodes of a train batch: what a group or batch baseline counts once.

An episode may be several rows: the exact-token ledger splits an episode into parts when a
call could not continue its conversation's tokens (drift segments, `EID.step` 0, 1, ...), and a
step-wise workflow returns one row per turn. Its rows share (group, run) (`EID.run` is the
episode). A baseline over rows would count such an episode once per part, so GRPO's mean and std
(and every other group statistic) would weigh a long, drifting episode k times. Baselines are
therefore taken over episodes, each with one reward, and every row of an episode gets its
episode's advantage on its own trained tokens:

    ep, rewards_e, groups_e = per_episode(inp)       # [N], [E], [E]
    scores = grpo_scores(rewards_e, groups_e)[ep]    # [N]: the episode's score on each part

With one row per episode (single-turn data) `ep` is the identity and every statistic is
computed exactly as over rows, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from trinity.algorithm.inputs import AdvantageInput
else:  # `validate` reads the registries that import this without torch (`common.lazy`)
    torch = lazy_module("torch")


def _first_appearance(inv: Tensor) -> tuple[Tensor, int]:
    """Renumber the classes of `inv` [N] 0..K-1 in the order their first row appears."""
    n = inv.shape[0]
    k = int(inv.max()) + 1 if n else 0
    rows = torch.arange(n, device=inv.device)
    first = torch.full((k,), n, dtype=torch.long, device=inv.device)
    first = first.scatter_reduce(0, inv, rows, "amin")  # [K] each class's first row
    rank = torch.empty(k, dtype=torch.long, device=inv.device)
    rank[torch.argsort(first)] = torch.arange(k, device=inv.device)
    return rank[inv], k


def episode_index(group_ids: Tensor, run_ids: Tensor, step_ids: Tensor) -> tuple[Tensor, int]:
    """Each row's episode, numbered 0..E-1 in the order episodes first appear, and E.

    Rows sharing (group, run) are one episode's parts. An episode has one row per part, so rows
    that repeat a (group, run, step) are episodes of their own, told apart in row order (the
    k-th such row joins the k-th episode of its (group, run)): a workflow that leaves every row
    at run 0, step 0 keeps one episode per row, as a baseline over rows had it.

    Args:
        group_ids, run_ids, step_ids: [N] integers.
    Returns:
        (episode [N] long, E).
    """
    n = group_ids.shape[0]
    g, r = group_ids.long(), run_ids.long()
    _, key = torch.unique(torch.stack([g, r, step_ids.long()], -1), dim=0, return_inverse=True)
    # each row's occurrence among the rows of its (group, run, step), in row order
    order = torch.argsort(key, stable=True)  # [N] rows of one key adjacent, in row order
    counts = torch.bincount(key, minlength=1)
    starts = counts.cumsum(0) - counts  # [K] where each key's rows begin in `order`
    occurrence = torch.empty_like(key)
    occurrence[order] = torch.arange(n, device=key.device) - starts[key[order]]
    _, inv = torch.unique(torch.stack([g, r, occurrence], -1), dim=0, return_inverse=True)
    return _first_appearance(inv.reshape(n))


def episode_rewards(rewards: Tensor, episode: Tensor, n_episodes: int) -> Tensor:
    """Each episode's reward, float64 [E]: the reward its rows share (the ledger and serve mode
    give every part its episode's), else their mean (parts whose rewards a KL reward penalty
    shaped, each by its own tokens)."""
    r = rewards.to(torch.float64)
    zeros = torch.zeros(n_episodes, dtype=torch.float64, device=r.device)
    hi = zeros.scatter_reduce(0, episode, r, "amax", include_self=False)
    lo = zeros.scatter_reduce(0, episode, r, "amin", include_self=False)
    total = zeros.index_add(0, episode, r)
    count = zeros.index_add(0, episode, torch.ones_like(r))
    return torch.where(hi == lo, hi, total / count.clamp(min=1))


def per_episode(inp: AdvantageInput) -> tuple[Tensor, Tensor, Tensor]:
    """(each row's episode [N], each episode's reward [E] float64, each episode's group [E]):
    what a baseline advantage computes over (module doc)."""
    episode, e = episode_index(inp.group_ids, inp.run_ids, inp.step_ids)
    rewards = episode_rewards(inp.rewards, episode, e)
    groups = torch.zeros(e, dtype=torch.long, device=episode.device)
    groups = groups.scatter_reduce(0, episode, inp.group_ids.long(), "amax", include_self=False)
    return episode, rewards, groups


def episode_sums(values: Tensor, episode: Tensor, n_episodes: int) -> Tensor:
    """Σ over each episode's rows of `values` [N], float64 [E] (e.g. its trained tokens)."""
    zeros = torch.zeros(n_episodes, dtype=torch.float64, device=values.device)
    return zeros.index_add(0, episode, values.to(torch.float64))
