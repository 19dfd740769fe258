"""Outcome-level advantage functions (`algorithm.advantage_fn`, args in `advantage_fn_args`).

One signature for every advantage fn (`trinity.algorithm.inputs`):

    fn(inp: AdvantageInput, **args) -> (advantages [N, T], returns [N, T])

`inp.group_ids` marks responses to the same prompt (any integers, not necessarily contiguous).
An outcome advantage's per-sequence scalar is broadcast over the masked response tokens and is 0
on unmasked ones. Every baseline (a group's mean, std, leave-one-out sum, the batch mean) is
taken over episodes, not rows: the rows of an episode split into parts (the ledger's drift
segments, a step-wise workflow's turns; they share (group, run)) count once, with one reward,
and each gets its episode's advantage (`trinity.algorithm.episodes`). All functions are
vectorised over groups (`torch.unique` + `index_add_`); the tests compare them with plain loop
oracles.

Group statistics are computed in float64 and a group whose rewards are all equal (max == min) is
zero-centred with zero spread exactly, so a flat group gives advantage 0 whatever rounding its mean
suffers (in float32, eight rewards of 0.1 have a mean 1 ulp off 0.1, and with std ~1e-8 below
epsilon GRPO turned that ulp into an advantage of ~0.007). Advantages come back in the rewards'
floating dtype (float32 for integer rewards).

Config: ``advantage_fn: grpo`` with ``advantage_fn_args: {epsilon: 1.0e-6, std_normalize: true}``.
Further advantages live in modules of their own (`trinity/algorithm/advantages/`), imported on
first use through the registry's `modules` map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm.episodes import per_episode
from trinity.algorithm.inputs import AdvantageInput
from trinity.common.lazy import lazy_module
from trinity.common.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")

ADVANTAGE_FN: Registry = Registry(
    "advantage_fn",
    modules={
        "step_wise_grpo": "trinity.algorithm.advantages.step_wise",
        "opmd": "trinity.algorithm.advantages.opmd",
        "asymre": "trinity.algorithm.advantages.opmd",
        "remax": "trinity.algorithm.advantages.remax",
        "gpg": "trinity.algorithm.advantages.gpg",
        "passk": "trinity.algorithm.advantages.passk",
        "grpo_passk": "trinity.algorithm.advantages.best_of_group",
        "opo": "trinity.algorithm.advantages.opo",
        "on_policy_distill": "trinity.algorithm.advantages.distill",
        "gae": "trinity.algorithm.advantages.gae",
        "ppo": "trinity.algorithm.advantages.gae",
        "clipb": "trinity.algorithm.advantages.entropy_clip",
        "clipv": "trinity.algorithm.advantages.entropy_clip",
        "rec": "trinity.algorithm.advantages.rec",
    },
)


def _broadcast(scores: Tensor, response_mask: Tensor) -> Tensor:
    """[N] per-sequence scalars → [N, T], 0 where the mask is False."""
    return scores.unsqueeze(-1) * response_mask.to(scores.dtype)


def _out_dtype(rewards: Tensor) -> torch.dtype:
    """The advantages' dtype: the rewards' own floating dtype, float32 for integer rewards."""
    return rewards.dtype if rewards.is_floating_point() else torch.float32


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample group size, group sum, group sum of squared deviations, and flatness, in float64.

    `flat` marks groups whose rewards are all equal (max == min): callers give them exactly 0
    instead of trusting `r - total / count` to cancel.

    Args:
        rewards: [N] numbers (any dtype; promoted to float64).
        group_ids: [N] integer group keys.
    Returns:
        (count [N], sum [N], sq_dev [N]) float64 and flat [N] bool, of each sample's own group,
        gathered back to [N].
    """
    r = rewards.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N] in 0..G-1
    g = int(inv.max()) + 1 if inv.numel() else 0
    zeros = torch.zeros(g, dtype=torch.float64, device=r.device)
    count = zeros.clone().index_add_(0, inv, torch.ones_like(r))  # [G]
    hi = zeros.clone().scatter_reduce_(0, inv, r, "amax", include_self=False)  # [G]
    lo = zeros.clone().scatter_reduce_(0, inv, r, "amin", include_self=False)  # [G]
    total = zeros.clone().index_add_(0, inv, r)  # [G]
    mean = total / count  # [G]
    sq_dev = zeros.clone().index_add_(0, inv, (r - mean[inv]) ** 2)  # [G]
    return count[inv], total[inv], sq_dev[inv], (hi == lo)[inv]


def grpo_scores(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = True,
    std_threshold: float | None = None,
    std_cal_level: str = "group",
) -> Tensor:
    """GRPO's per-sequence score (see `grpo_advantage`), float64 [N]."""
    if std_cal_level not in ("group", "batch"):
        raise ValueError(f"std_cal_level must be 'group' or 'batch', got {std_cal_level!r}")
    r = rewards.to(torch.float64)
    count, total, sq_dev, flat = group_stats(r, group_ids)  # [N] each, float64
    single = count == 1
    mean = torch.where(single, torch.zeros_like(total), total / count)
    std = torch.where(single, torch.ones_like(total), (sq_dev / (count - 1).clamp(min=1)).sqrt())
    scores = r - mean
    if std_normalize:
        if std_cal_level == "batch":
            batch_std = r.std() if r.numel() > 1 else r.new_tensor(1.0)
            scores = scores / (batch_std + epsilon)
        else:
            scores = scores / (std + epsilon)
    zero = flat & ~single
    if std_threshold is not None:  # skipped groups: a group of one, or too little spread
        zero = zero | single | (std <= std_threshold)
    return torch.where(zero, torch.zeros_like(scores), scores)


@ADVANTAGE_FN.register("grpo")
def grpo_advantage(
    inp: AdvantageInput,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = True,
    std_threshold: float | None = None,
    std_cal_level: str = "group",
) -> tuple[Tensor, Tensor]:
    """GRPO group-normalised outcome advantage.

        A_i = (r_i - mean_g) / (std_g + epsilon)      (std_normalize=True, GRPO)
        A_i =  r_i - mean_g                           (std_normalize=False, Dr. GRPO)
        A_i = (r_i - mean_g) / (std_B + epsilon)      (std_cal_level="batch": the std of every
                                                       reward of the batch, arXiv:2508.08221)

    r_i is row i's episode's reward and the group statistics run over the group's episodes (n =
    episodes, each counted once however many rows it was split into; module doc). std_g is the
    unbiased (n-1) standard deviation, as `torch.std` and verl. A group of size 1 gets
    mean 0 and std 1 (verl's convention), i.e. A = r / (1 + epsilon). A larger group whose rewards
    are all equal gets exactly A = 0 (statistics in float64, flat groups detected by max == min).
    With `std_threshold`, a group whose std_g ≤ threshold, and a group of one, gets A = 0.
    Trinity-RFT removes such groups from the batch instead; here their rows stay with no policy
    gradient (their KL and entropy terms still count), and the aggregation counts them. Returns =
    advantages.

    Papers: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
    (arXiv:2402.03300); Dr. GRPO: "Understanding R1-Zero-Like Training: A Critical Perspective"
    (arXiv:2503.20783).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
        epsilon: added to the std.
        std_normalize: divide by the std (False = mean-only, Dr. GRPO).
        std_threshold: groups with std_g at or below it get 0 (None = off).
        std_cal_level: "group" (std_g) or "batch" (std of the whole batch's episode rewards).
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    episode, rewards, groups = per_episode(inp)  # [N], [E], [E]
    scores = grpo_scores(
        rewards,
        groups,
        epsilon=epsilon,
        std_normalize=std_normalize,
        std_threshold=std_threshold,
        std_cal_level=std_cal_level,
    )[episode]  # [N]
    adv = _broadcast(scores.to(_out_dtype(inp.rewards)), inp.response_mask)
    return adv, adv.clone()


@ADVANTAGE_FN.register("rloo")
def rloo_advantage(inp: AdvantageInput) -> tuple[Tensor, Tensor]:
    """RLOO leave-one-out advantage.

        A_i = r_i - (1 / (n - 1)) · Σ_{j≠i in group} r_j = n/(n-1) · (r_i - mean_g)

    Over the group's episodes (n episodes; every row of one gets its advantage). A group of size 1
    has no other sample to form a baseline; we give it advantage 0 (no learning signal) rather
    than verl's raw reward. A group whose rewards are all equal gets exactly 0 (float64
    statistics, max == min test). Returns = advantages.

    Paper: "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
    Feedback in LLMs" (arXiv:2402.14740).

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    dtype = _out_dtype(inp.rewards)
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    count, total, _, flat = group_stats(r, groups)  # [E], float64
    others = (count - 1).clamp(min=1)
    baseline = (total - r) / others
    scores = torch.where((count > 1) & ~flat, r - baseline, torch.zeros_like(r))[episode]
    adv = _broadcast(scores.to(dtype), inp.response_mask)
    return adv, adv.clone()


@ADVANTAGE_FN.register("reinforce")
def reinforce_advantage(
    inp: AdvantageInput,
    *,
    baseline: str = "none",
) -> tuple[Tensor, Tensor]:
    """REINFORCE outcome advantage: returns G_i = r_i, advantages A_i = r_i - b.

        b = 0                    (baseline="none")
        b = mean_j r_j           (baseline="batch_mean", over the whole batch's episodes, groups
                                  ignored)

    The batch mean is taken in float64 over episodes (an episode split into parts counts once)
    and a batch of equal rewards gets exactly A = 0.

    Paper: Williams, "Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning" (Machine Learning 8, 1992; no arXiv id).

    Args:
        inp: rewards [N] and response_mask [N, T] are read (groups are ignored; with
            baseline="batch_mean" run_ids [N] and step_ids [N] too, for episodes).
        baseline: "none" | "batch_mean".
    Returns:
        (advantages [N, T], returns [N, T]).
    """
    dtype = _out_dtype(inp.rewards)
    r = inp.rewards.to(torch.float64)
    if baseline == "none":
        scores = r
    elif baseline == "batch_mean":
        flat = r.numel() == 0 or bool(r.max() == r.min())
        _, r_e, _ = per_episode(inp)
        scores = torch.zeros_like(r) if flat else r - r_e.mean()
    else:
        raise ValueError(f"unknown reinforce baseline {baseline!r}. Valid: none, batch_mean")
    m = inp.response_mask
    return _broadcast(scores.to(dtype), m), _broadcast(r.to(dtype), m)


def _masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(values - μ) / sqrt(σ² + eps) over the masked entries, σ² unbiased (verl's
    `masked_whiten`); float64 in and out. Fewer than two masked entries: σ² = 0."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1)
    var = (((values - mean) * m) ** 2).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps)


@ADVANTAGE_FN.register("reinforceplusplus")
def reinforce_plus_plus_advantage(
    inp: AdvantageInput,
    *,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns of the outcome reward, whitened over every token of the batch.

        G_it = r_it + γ·G_i,next(t)        next(t): the row's next TRAINED position; with an
                                          outcome reward only, G_it = r_i · γ^(trained tokens
                                          after t up to the last one)
        A_it = (G_it - μ) / sqrt(σ² + 1e-8)     μ, σ² (unbiased): over all masked tokens of the batch

    r_it are the token rewards (`inp.token_rewards`): the outcome reward on the row's last trained
    token, minus the per-token KL penalty when `kl_penalty_fn` is set (the paper's reward, and the
    `reinforceplusplus` record's). Untrained positions inside a row (a multi-turn row's tool,
    environment or user tokens) are skipped, the return carried through them undiscounted, as
    GAE does here. Departure from verl, which restarts the return at 0 behind a masked position:
    there every turn before the last of a multi-turn row would get return 0; rows whose trained
    tokens are one contiguous span (single-turn) get the same returns either way. With γ = 1
    and no penalty every token of a row gets r_i, so a
    longer response weighs more in μ and σ (token-level whitening, as verl). No group baseline:
    `reinforceplusplus_baseline` subtracts the group mean first. Returns = G.

    Paper: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (arXiv:2501.03262).

    Args:
        inp: token_rewards [N, T] and response_mask [N, T] are read.
        gamma: discount per token position.
    Returns:
        (advantages [N, T], returns [N, T]), 0 on unmasked tokens.
    """
    dtype = _out_dtype(inp.rewards)
    m = inp.response_mask.bool()
    token_rewards = inp.token_rewards.to(torch.float64) * m  # [N, T]
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(m.shape[0], dtype=torch.float64, device=m.device)
    for t in reversed(range(m.shape[-1])):
        # a trained position discounts and adds its reward; an untrained one carries it through
        running = torch.where(m[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    adv = _masked_whiten(returns, m) * m
    return adv.to(dtype), (returns * m).to(dtype)


@ADVANTAGE_FN.register("reinforceplusplus_baseline")
def reinforce_plus_plus_baseline_advantage(inp: AdvantageInput) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch.

        s_i  = r_i - mean_g              (over the group's episodes; a group of one: mean 0, as
                                          verl)
        A_it = (s_i - μ) / sqrt(σ² + 1e-8)    μ, σ² (unbiased): of s over all masked tokens

    verl's `reinforce_plus_plus_baseline`. Returns = advantages.

    Paper: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (arXiv:2501.03262), the variant with a group baseline for several samples per prompt.

    Args:
        inp: rewards [N], group_ids [N], run_ids [N], step_ids [N], response_mask [N, T] are
            read.
    Returns:
        (advantages [N, T], returns [N, T]), 0 on unmasked tokens.
    """
    dtype = _out_dtype(inp.rewards)
    episode, r, groups = per_episode(inp)  # [N], [E], [E]
    count, total, _, _ = group_stats(r, groups)
    scores = (r - torch.where(count == 1, torch.zeros_like(total), total / count))[episode]
    m = inp.response_mask.bool()
    tiled = scores.unsqueeze(-1) * m
    adv = _masked_whiten(tiled, m) * m
    return adv.to(dtype), adv.to(dtype)
