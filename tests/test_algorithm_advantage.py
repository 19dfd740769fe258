"""Advantage fns: hand-derived numbers and loop oracles for the vectorised code."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.inputs import AdvantageInput

EPS = 1e-6


def advantage(name: str, rewards, groups, mask, **args):
    """Calls the advantage fn `name` on outcome rewards only."""
    return ADVANTAGE_FN.get(name)(AdvantageInput.from_outcomes(rewards, groups, mask), **args)


def close(actual: torch.Tensor, expected: torch.Tensor | list, atol: float = 1e-6) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# two groups, interleaved and with non-contiguous ids: group 7 = rewards [1, 0, 1], group 3 = [2, 4]
REWARDS = torch.tensor([1.0, 2.0, 0.0, 1.0, 4.0])
GROUPS = torch.tensor([7, 3, 7, 7, 3])
MASK = torch.tensor(
    [
        [True, True, False],
        [True, False, False],
        [True, True, True],
        [False, True, True],
        [True, True, False],
    ]
)


def test_grpo_two_groups_by_hand() -> None:
    # group 7: mean = (1+0+1)/3 = 2/3; unbiased var = ((1/3)² + (2/3)² + (1/3)²)/(3-1) = (6/9)/2 = 1/3
    #          std = 1/√3 ≈ 0.577350 → A = (1/3)/(1/√3+ε) ≈ 0.577349, (-2/3)/(1/√3+ε) ≈ -1.154698
    # group 3: mean = 3; var = (1 + 1)/(2-1) = 2; std = √2 → A = ∓1/(√2+ε) ≈ ∓0.707106
    s7, s3 = 1 / math.sqrt(3) + EPS, math.sqrt(2) + EPS
    per_seq = [(1 / 3) / s7, -1 / s3, (-2 / 3) / s7, (1 / 3) / s7, 1 / s3]
    adv, ret = advantage("grpo", REWARDS, GROUPS, MASK)
    expected = torch.tensor(per_seq).unsqueeze(-1) * MASK.float()
    close(adv, expected)
    close(ret, expected)
    assert adv.shape == MASK.shape
    assert (adv[~MASK] == 0).all()  # unmasked tokens get exactly 0


def test_grpo_mean_only_dr_grpo() -> None:
    # std_normalize=False: group 7 → 1-2/3 = 1/3, 0-2/3 = -2/3; group 3 → 2-3 = -1, 4-3 = 1
    adv, _ = advantage("grpo", REWARDS, GROUPS, MASK, std_normalize=False)
    close(adv[:, 0], [1 / 3, -1.0, -2 / 3, 0.0, 1.0])  # row 3's token 0 is masked
    close(adv[3, 1], 1 / 3)


def test_grpo_group_of_one_and_constant_group() -> None:
    # size-1 group: mean 0, std 1 (verl) → A = 5/(1+ε); constant group [2, 2]: std 0 → A = 0/(0+ε) = 0
    rewards = torch.tensor([5.0, 2.0, 2.0])
    adv, _ = advantage("grpo", rewards, torch.tensor([0, 1, 1]), torch.ones(3, 2, dtype=torch.bool))
    close(adv[:, 0], [5.0 / (1 + EPS), 0.0, 0.0])


@pytest.mark.parametrize("fn", ["grpo", "rloo"])
@pytest.mark.parametrize("value, n", [(0.1, 8), (2.2, 64)])
def test_flat_group_gives_exactly_zero(fn: str, value: float, n: int) -> None:
    # every reward equal → r_i - mean_g = 0 by definition, so A = 0 for GRPO (0/(0+ε)) and RLOO.
    # In float32 the group sum rounds: 8 x 0.1f summed is 0.80000001, mean 0.10000001 (1 ulp off),
    # std ~1e-8 < ε, so the unfixed GRPO gave (-1.5e-9)/(1e-8+1e-6) ≈ 0.0074; 64 x 2.2f gave ~0.59.
    rewards = torch.full((n,), value, dtype=torch.float32)
    groups = torch.zeros(n, dtype=torch.long)
    adv, ret = advantage(fn, rewards, groups, torch.ones(n, 3, dtype=torch.bool))
    assert adv.dtype == torch.float32
    assert (adv == 0).all(), adv[:, 0].abs().max()
    assert (ret == 0).all()


def test_flat_group_next_to_a_varied_one() -> None:
    # group 0: eight 0.1f (flat → exactly 0); group 1: [0, 1] → mean 0.5, std √0.5 → ∓0.5/(√0.5+ε)
    rewards = torch.tensor([0.1] * 8 + [0.0, 1.0])
    groups = torch.tensor([0] * 8 + [1, 1])
    adv, _ = advantage("grpo", rewards, groups, torch.ones(10, 1, dtype=torch.bool))
    assert (adv[:8] == 0).all()
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(adv[8:, 0], [-a, a])


def test_reinforce_batch_mean_of_equal_rewards_is_exactly_zero() -> None:
    # batch_mean baseline: eight 0.1f → r - mean = 0 by definition (float32 mean is 1 ulp off)
    rewards = torch.full((8,), 0.1)
    adv, ret = advantage("reinforce",
        rewards, torch.zeros(8, dtype=torch.long), torch.ones(8, 2, dtype=torch.bool),
        baseline="batch_mean",
    )  # fmt: skip
    assert (adv == 0).all()
    close(ret, torch.full((8, 2), 0.1))


def test_rloo_by_hand() -> None:
    # group 7 [1, 0, 1]: baselines (0+1)/2 = 0.5, (1+1)/2 = 1, (1+0)/2 = 0.5 → A = 0.5, -1, 0.5
    # group 3 [2, 4]: baselines 4, 2 → A = -2, 2; singleton group 9 [3] → no baseline → A = 0
    rewards = torch.cat([REWARDS, torch.tensor([3.0])])
    groups = torch.cat([GROUPS, torch.tensor([9])])
    mask = torch.ones(6, 2, dtype=torch.bool)
    mask[2, 1] = False
    adv, ret = advantage("rloo", rewards, groups, mask)
    close(adv[:, 0], [0.5, -2.0, -1.0, 0.5, 2.0, 0.0])
    assert adv[2, 1] == 0
    close(ret, adv)


def test_reinforce_baselines() -> None:
    # rewards [1, 3]: returns = rewards; "none" → A = rewards; "batch_mean" → mean 2 → A = -1, 1
    rewards, groups, mask = (
        torch.tensor([1.0, 3.0]),
        torch.tensor([0, 0]),
        torch.tensor([[True, False], [True, True]]),
    )
    adv, ret = advantage("reinforce", rewards, groups, mask)
    close(adv, [[1.0, 0.0], [3.0, 3.0]])
    close(ret, [[1.0, 0.0], [3.0, 3.0]])
    adv, ret = advantage("reinforce", rewards, groups, mask, baseline="batch_mean")
    close(adv, [[-1.0, 0.0], [1.0, 1.0]])
    close(ret, [[1.0, 0.0], [3.0, 3.0]])
    with pytest.raises(ValueError, match="batch_mean"):
        advantage("reinforce", rewards, groups, mask, baseline="ema")


# -- loop oracles -----------------------------------------------------------------------------


def grpo_oracle(rewards: list[float], groups: list[int], std_normalize: bool) -> list[float]:
    out = []
    for i, g in enumerate(groups):
        members = [rewards[j] for j in range(len(groups)) if groups[j] == g]
        n = len(members)
        if n > 1 and max(members) == min(members):
            out.append(0.0)  # a flat group: r - mean = 0 exactly
            continue
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / n
            std = math.sqrt(sum((r - mean) ** 2 for r in members) / (n - 1))
        score = rewards[i] - mean
        out.append(score / (std + EPS) if std_normalize else score)
    return out


def rloo_oracle(rewards: list[float], groups: list[int]) -> list[float]:
    out = []
    for i, g in enumerate(groups):
        others = [rewards[j] for j in range(len(groups)) if groups[j] == g and j != i]
        out.append(rewards[i] - sum(others) / len(others) if others else 0.0)
    return out


def random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 6, (8,), generator=gen).tolist()
    ids = torch.randperm(100, generator=gen)[: len(sizes)]
    groups = torch.cat([ids[k].repeat(s) for k, s in enumerate(sizes)])
    groups = groups[torch.randperm(len(groups), generator=gen)]  # shuffled, interleaved
    rewards = torch.randn(len(groups), generator=gen, dtype=torch.float64)
    rewards[groups == ids[0]] = 0.1  # one flat group (of 1 to 5 samples) in every batch
    mask = torch.rand(len(groups), 7, generator=gen) > 0.3
    return rewards, groups, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_matches_loop_oracle(seed: int, std_normalize: bool) -> None:
    rewards, groups, mask = random_batch(seed)
    adv, _ = advantage("grpo", rewards, groups, mask, std_normalize=std_normalize)
    expected = grpo_oracle(rewards.tolist(), groups.tolist(), std_normalize)
    close(adv, torch.tensor(expected, dtype=torch.float64).unsqueeze(-1) * mask, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_rloo_matches_loop_oracle(seed: int) -> None:
    rewards, groups, mask = random_batch(seed)
    adv, _ = advantage("rloo", rewards, groups, mask)
    expected = rloo_oracle(rewards.tolist(), groups.tolist())
    close(adv, torch.tensor(expected, dtype=torch.float64).unsqueeze(-1) * mask, atol=1e-9)


def test_integer_rewards_are_promoted() -> None:
    adv, _ = advantage(
        "grpo", torch.tensor([1, 0]), torch.tensor([0, 0]), torch.ones(2, 1, dtype=torch.bool)
    )
    assert adv.is_floating_point()


# REINFORCE++ (verl's conventions). Rows: mask [1,1,0] / [1,1,1] / [1,0,0], rewards 1, 0, 2.
# γ = 1: every masked token of a row carries its reward: 1,1 | 0,0,0 | 2 → n = 6, μ = 4/6 = 2/3,
#   Σ(x-μ)² = 2·(1/3)² + 3·(2/3)² + (4/3)² = 2/9 + 12/9 + 16/9 = 30/9, σ² = (30/9)/5 = 2/3
#   A = (x - μ)/√(2/3): row 0 (1/3)/0.8164965809 = 0.4082482905, row 1 -0.8164965809,
#   row 2 (4/3)/0.8164965809 = 1.6329931619
# γ = 0.5: row 0's first token gets 0.5·1: values 0.5,1 | 0,0,0 | 2 → μ = 3.5/6 = 0.5833333333,
#   σ² = 3.2083333333/5 = 0.6416666667, σ = 0.8010409894:
#   row 0 → -0.1040312973, 0.5201564866; row 1 → -0.7282190813; row 2 → 1.7685320545
RPP_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
RPP_REWARDS = torch.tensor([1.0, 0.0, 2.0])


def test_reinforce_plus_plus_by_hand() -> None:
    adv, ret = advantage("reinforceplusplus", RPP_REWARDS, torch.tensor([0, 0, 1]), RPP_MASK)
    a, b, c = 0.4082482905, -0.8164965809, 1.6329931619
    close(adv, [[a, a, 0.0], [b, b, b], [c, 0.0, 0.0]])
    close(ret, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    adv, ret = advantage(
        "reinforceplusplus", RPP_REWARDS, torch.tensor([0, 0, 1]), RPP_MASK, gamma=0.5
    )
    d = -0.7282190813
    close(adv, [[-0.1040312973, 0.5201564866, 0.0], [d, d, d], [1.7685320545, 0.0, 0.0]])
    close(ret, [[0.5, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])


def test_reinforce_plus_plus_carries_the_return_through_a_masked_token() -> None:
    # one row [1, 0, 1] (a multi-turn row: t = 1 is a tool token), reward 3, γ = 0.5: the reward
    # sits on t = 2; t = 1 is skipped (not trained, not a discount step), so t = 0 gets
    # 0 + 0.5·3 = 1.5 (verl's reset would give 0: every earlier turn would learn nothing)
    _, ret = advantage(
        "reinforceplusplus",
        torch.tensor([3.0]),
        torch.tensor([0]),
        torch.tensor([[True, False, True]]),
        gamma=0.5,
    )
    close(ret, [[1.5, 0.0, 3.0]])


def test_reinforce_plus_plus_matches_a_loop_oracle() -> None:
    g = torch.Generator().manual_seed(5)
    n, t, gamma = 6, 5, 0.9
    rewards = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, t, generator=g) > 0.25
    adv, _ = advantage("reinforceplusplus", rewards, torch.arange(n), mask, gamma=gamma)
    returns = [[0.0] * t for _ in range(n)]
    for i in range(n):
        trained = [k for k in range(t) if mask[i, k]]  # the return runs over trained tokens only
        running = 0.0
        for k in reversed(trained):
            running = (float(rewards[i]) if k == trained[-1] else 0.0) + gamma * running
            returns[i][k] = running
    vals = [returns[i][k] for i in range(n) for k in range(t) if mask[i, k]]
    mu = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1) + 1e-8)
    want = [[(returns[i][k] - mu) / sd if mask[i, k] else 0.0 for k in range(t)] for i in range(n)]
    close(adv, want, atol=1e-12)


# With a group baseline: groups {0, 1} and {2}; s = 1 - 0.5, 0 - 0.5, 2 - 0 (a group of one keeps
# its reward) → tiled 0.5,0.5 | -0.5,-0.5,-0.5 | 2: μ = 1.5/6 = 0.25,
#   Σ(x-μ)² = 2·0.0625 + 3·0.5625 + 3.0625 = 4.875, σ² = 0.975, σ = 0.9874208829
#   A: row 0 0.25/σ = 0.2531848418, row 1 -0.75/σ = -0.7595545253, row 2 1.75/σ = 1.7722938924
def test_reinforce_plus_plus_baseline_by_hand() -> None:
    adv, ret = advantage(
        "reinforceplusplus_baseline", RPP_REWARDS, torch.tensor([7, 7, 3]), RPP_MASK
    )
    a, b, c = 0.2531848418, -0.7595545253, 1.7722938924
    close(adv, [[a, a, 0.0], [b, b, b], [c, 0.0, 0.0]])
    close(ret, adv.tolist())
