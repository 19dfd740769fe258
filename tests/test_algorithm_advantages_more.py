"""Advantages of their own modules (step-wise GRPO, OPMD, GPG, pass@k, on-policy distillation,
GAE) and GRPO's options: hand-derived values, and brute-force or loop oracles."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.inputs import AdvantageInput

EPS = 1e-6


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


def first_col(name: str, rewards: list[float], groups: list[int], **args) -> torch.Tensor:
    """The advantage of each row (column 0 of a one-token mask)."""
    n = len(rewards)
    inp = AdvantageInput.from_outcomes(
        torch.tensor(rewards), torch.tensor(groups), torch.ones(n, 1, dtype=torch.bool)
    )
    adv, ret = ADVANTAGE_FN.get(name)(inp, **args)
    torch.testing.assert_close(adv, ret)
    return adv[:, 0]


# -- GRPO options ---------------------------------------------------------------------------------


def test_grpo_std_threshold_zeroes_low_spread_groups_and_groups_of_one() -> None:
    # group 0: [1, 0] std = √0.5 = 0.7071 > 0.5 kept; group 1: [1, 1.2] std = √0.02 = 0.1414 ≤ 0.5
    # group 2: a group of one (kept without the threshold as r/(1+ε))
    rewards, groups = [1.0, 0.0, 1.0, 1.2, 3.0], [0, 0, 1, 1, 2]
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(first_col("grpo", rewards, groups, std_threshold=0.5), [a, -a, 0, 0, 0])
    b = 0.1 / (math.sqrt(0.02) + EPS)
    close(first_col("grpo", rewards, groups), [a, -a, -b, b, 3.0 / (1 + EPS)])


def test_grpo_batch_level_std() -> None:
    # mean per group, std over the whole batch [1, 0, 3, 5]: mean 2.25,
    # Σ(x-μ)² = 1.5625 + 5.0625 + 0.5625 + 7.5625 = 14.75, unbiased var 14.75/3, std 2.2173558
    std = math.sqrt(14.75 / 3) + EPS
    out = first_col("grpo", [1.0, 0.0, 3.0, 5.0], [0, 0, 1, 1], std_cal_level="batch")
    close(out, [0.5 / std, -0.5 / std, -1 / std, 1 / std])
    with pytest.raises(ValueError, match="std_cal_level"):
        first_col("grpo", [1.0], [0], std_cal_level="task")


# -- step-wise GRPO -------------------------------------------------------------------------------


def test_step_wise_grpo_scores_the_last_turn_and_broadcasts() -> None:
    # task 0: run 0 = turns (0: r 0.3, 1: r 1.0), run 1 = turns (0: 5, 1: 5, 2: 0.0); task 1: run 0
    # one turn r 2. Last turns: run 0 → 1.0, run 1 → 0.0; GRPO on [1, 0]: ±0.5/(√0.5 + ε);
    # task 1 is a group of one: 2/(1 + ε). Rows are given shuffled.
    rows = [  # (group, run, step, reward)
        (0, 1, 2, 0.0), (0, 0, 0, 0.3), (1, 0, 0, 2.0), (0, 1, 0, 5.0), (0, 0, 1, 1.0),
        (0, 1, 1, 5.0),
    ]  # fmt: skip
    g, run, step, r = (torch.tensor(c) for c in zip(*rows, strict=True))
    mask = torch.ones(len(rows), 2, dtype=torch.bool)
    inp = AdvantageInput.from_outcomes(r.float(), g, mask, run_ids=run, step_ids=step)
    fn = ADVANTAGE_FN.get("step_wise_grpo")
    adv, _ = fn(inp)
    a, single = 0.5 / (math.sqrt(0.5) + EPS), 2.0 / (1 + EPS)
    close(adv[:, 0], [-a, a, single, -a, a, -a])
    close(adv[:, 1], adv[:, 0])  # the score covers every token of the turn
    normed, _ = fn(inp, enable_step_norm=True)  # run 0 has 2 turns, run 1 has 3
    close(normed[:, 0], [-a / 3, a / 2, single, -a / 3, a / 2, -a / 3])


def test_step_wise_grpo_on_single_turn_rows_is_grpo() -> None:
    rewards, groups = [1.0, 2.0, 0.0, 1.0, 4.0], [7, 3, 7, 7, 3]
    close(first_col("step_wise_grpo", rewards, groups), first_col("grpo", rewards, groups))


# -- OPMD -----------------------------------------------------------------------------------------


def test_opmd_mean_and_logavgexp_baselines_by_hand() -> None:
    # group [0, 1]: mean baseline 0.5; logavgexp τ = 1: log((1 + e)/2) = 0.6201145
    # τ = 0.5: 0.5·log((1 + e²)/2) = 0.7168806; a group of one keeps its reward
    close(first_col("opmd", [0.0, 1.0, 3.0], [0, 0, 1]), [-0.5, 0.5, 3.0])
    b1 = math.log((1 + math.e) / 2)
    out = first_col("opmd", [0.0, 1.0, 3.0], [0, 0, 1], opmd_baseline="logavgexp")
    close(out, [-b1, 1 - b1, 3.0])
    b2 = 0.5 * math.log((1 + math.e**2) / 2)
    out = first_col("opmd", [0.0, 1.0], [0, 0], opmd_baseline="logavgexp", tau=0.5)
    close(out, [-b2, 1 - b2])
    # the baseline lies between mean and max, and is stable for large r/τ
    out = first_col("opmd", [1000.0, 0.0], [0, 0], opmd_baseline="logavgexp", tau=1.0)
    close(out, [math.log(2), -1000 + math.log(2)], atol=1e-3)
    with pytest.raises(ValueError, match="opmd_baseline"):
        first_col("opmd", [1.0], [0], opmd_baseline="max")


# -- GPG ------------------------------------------------------------------------------------------


def test_gpg_rescales_by_the_informative_rows() -> None:
    # group 0 = [1, 0, 1, 0]: centred ±0.5; group 1 = [1, 1]: flat, 0. N = 6 rows, M = 4 carry a
    # signal → α = 6/4 = 1.5 → A = ±0.75, and 0 for the flat group
    out = first_col("gpg", [1.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0, 1, 1])
    close(out, [0.75, -0.75, 0.75, -0.75, 0.0, 0.0])
    # F_norm divides; a group of one keeps r (mean 0) and is informative: α = 3/3
    close(first_col("gpg", [1.0, 0.0, 2.0], [0, 0, 1], f_norm=2.0), [0.25, -0.25, 1.0])


# -- pass@k ---------------------------------------------------------------------------------------


def test_passk_by_hand() -> None:
    # n = 4, one right, k = 2: R̄ = 1 - C(3,2)/C(4,2) = 1/2, σ = 1/2; A_pos = (1/2)/(1/2) = 1;
    # A_neg = (1 - 1/2 - C(2,1)/C(3,1))/(1/2) = (1/2 - 2/3)·2 = -1/3
    close(first_col("passk", [1.0, 0.0, 0.0, 0.0], [0] * 4, k=2), [1.0, -1 / 3, -1 / 3, -1 / 3])
    # all right or all wrong: σ = 0, no signal
    close(first_col("passk", [1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1], k=2), [0.0] * 4)
    # a group smaller than k uses k = n: n = 2, k = 2: R̄ = 1 - 0 = 1 ... with one right,
    # C(1, 2) = 0 → R̄ = 1, σ = 0: no signal (every pair passes)
    close(first_col("passk", [1.0, 0.0], [0, 0], k=3), [0.0, 0.0])
    with pytest.raises(ValueError, match="k >= 1"):
        first_col("passk", [1.0, 0.0], [0, 0], k=0)


def test_passk_with_k_1_is_grpo_with_the_population_std() -> None:
    r = [1.0, 0.0, 0.0, 0.0]  # p = 1/4, σ = √(3/16)
    s = math.sqrt(3 / 16)
    close(first_col("passk", r, [0] * 4, k=1), [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s])


@pytest.mark.parametrize("n, right, k", [(5, 2, 2), (6, 1, 3), (6, 2, 4), (8, 3, 5)])
def test_passk_matches_a_brute_force_over_every_k_subset(n: int, right: int, k: int) -> None:
    correct = [i < right for i in range(n)]
    subsets = list(itertools.combinations(range(n), k))
    group_reward = {s: float(any(correct[i] for i in s)) for s in subsets}
    mean = sum(group_reward.values()) / len(subsets)
    std = math.sqrt(mean * (1 - mean))
    want = []
    for i in range(n):  # a response's expected pass@k over the subsets that contain it
        mine = [group_reward[s] for s in subsets if i in s]
        want.append((sum(mine) / len(mine) - mean) / std)
    out = first_col("passk", [float(c) for c in correct], [0] * n, k=k)
    close(out, want)  # float32 rewards: the advantages come back in float32


# -- on-policy distillation -----------------------------------------------------------------------


def test_on_policy_distill_is_teacher_minus_student() -> None:
    mask = torch.tensor([[True, True, False]])
    student, teacher = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-0.5, -2.5, 0.0]])
    inp = AdvantageInput.from_outcomes(
        torch.tensor([9.0]), torch.tensor([0]), mask, logprob=student, ref_logprob=teacher
    )
    adv, _ = ADVANTAGE_FN.get("on_policy_distill")(inp, kl_coef=2.0)
    close(adv, [[1.0, -1.0, 0.0]])  # 2·(-0.5 + 1), 2·(-2.5 + 2), masked
    with pytest.raises(ValueError, match="needs ref_logprob"):
        ADVANTAGE_FN.get("on_policy_distill")(AdvantageInput.from_outcomes(*inp_args()))


def inp_args():
    return torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 2, dtype=torch.bool)


# -- GAE ------------------------------------------------------------------------------------------


def test_gae_by_hand() -> None:
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], γ = λ = 1: δ = [0.1, 0.1, 0.3], A = [0.5, 0.4, 0.3],
    # returns A + V = [1, 1, 1] (the Monte-Carlo return). Whitened: mean 0.4, unbiased var 0.01
    values = torch.tensor([[0.5, 0.6, 0.7]])
    inp = AdvantageInput.from_outcomes(
        torch.tensor([1.0]), torch.tensor([0]), torch.ones(1, 3, dtype=torch.bool), values=values
    )
    adv, ret = ADVANTAGE_FN.get("gae")(inp)
    close(ret, [[1.0, 1.0, 1.0]])
    s = 0.1 / math.sqrt(0.01 + 1e-8)
    close(adv, [[s, 0.0, -s]])
    # γ = 0.5, λ = 0.5: δ = [0 + 0.3 - 0.5, 0 + 0.35 - 0.6, 1 - 0.7] = [-0.2, -0.25, 0.3];
    # A_2 = 0.3, A_1 = -0.25 + 0.25·0.3 = -0.175, A_0 = -0.2 + 0.25·(-0.175) = -0.24375
    _, ret = ADVANTAGE_FN.get("gae")(inp, gamma=0.5, lam=0.5)
    close(ret, [[-0.24375 + 0.5, -0.175 + 0.6, 0.3 + 0.7]])
    with pytest.raises(ValueError, match="needs values"):
        ADVANTAGE_FN.get("gae")(AdvantageInput.from_outcomes(*inp_args()))


def test_gae_matches_a_loop_over_the_trained_positions() -> None:
    g = torch.Generator().manual_seed(11)
    n, t, gamma, lam = 5, 6, 0.9, 0.8
    mask = torch.rand(n, t, generator=g) > 0.3
    values = torch.randn(n, t, generator=g, dtype=torch.float64)
    token_rewards = torch.randn(n, t, generator=g, dtype=torch.float64)
    inp = AdvantageInput(
        rewards=torch.zeros(n, dtype=torch.float64), group_ids=torch.arange(n),
        response_mask=mask, token_rewards=token_rewards, run_ids=torch.arange(n),
        step_ids=torch.zeros(n, dtype=torch.long), values=values,
    )  # fmt: skip
    adv, ret = ADVANTAGE_FN.get("gae")(inp, gamma=gamma, lam=lam)
    raw = [[0.0] * t for _ in range(n)]
    for i in range(n):
        pos = [k for k in range(t) if mask[i, k]]  # the trained positions, in order
        running = 0.0
        for j in reversed(range(len(pos))):
            v_next = float(values[i, pos[j + 1]]) if j + 1 < len(pos) else 0.0
            delta = float(token_rewards[i, pos[j]]) + gamma * v_next - float(values[i, pos[j]])
            running = delta + gamma * lam * running
            raw[i][pos[j]] = running
    flat = [raw[i][k] for i in range(n) for k in range(t) if mask[i, k]]
    mu = sum(flat) / len(flat)
    sd = math.sqrt(sum((x - mu) ** 2 for x in flat) / (len(flat) - 1) + 1e-8)
    want = [[(raw[i][k] - mu) / sd if mask[i, k] else 0.0 for k in range(t)] for i in range(n)]
    want_ret = [
        [raw[i][k] + float(values[i, k]) if mask[i, k] else 0.0 for k in range(t)] for i in range(n)
    ]
    close(adv, want, atol=1e-12)
    close(ret, want_ret, atol=1e-12)


def test_asymre_shifts_the_group_baseline() -> None:
    # group [0, 1]: baseline 0.5 - 0.1 = 0.4 → A = [-0.4, 0.6]; a group of one keeps r
    close(first_col("asymre", [0.0, 1.0, 2.0], [0, 0, 1]), [-0.4, 0.6, 2.0])
    close(first_col("asymre", [0.0, 1.0], [0, 0], baseline_shift=0.0), [-0.5, 0.5])


def test_remax_subtracts_the_greedy_reward_from_the_return() -> None:
    # token rewards [[-0.1, -0.1, 0.9], [0, 1, 0 (masked)]]: returns G = reverse cumsum over
    # the trained tokens = [[0.7, 0.8, 0.9], [1, 1, 0]]; baselines 0.4 and 1.0
    mask = torch.tensor([[True, True, True], [True, True, False]])
    inp = AdvantageInput(
        rewards=torch.tensor([0.7, 1.0]), group_ids=torch.tensor([0, 1]), response_mask=mask,
        token_rewards=torch.tensor([[-0.1, -0.1, 0.9], [0.0, 1.0, 5.0]]),
        run_ids=torch.tensor([0, 0]), step_ids=torch.tensor([0, 0]),
        baselines=torch.tensor([0.4, 1.0]),
    )  # fmt: skip
    adv, ret = ADVANTAGE_FN.get("remax")(inp)
    close(ret, [[0.7, 0.8, 0.9], [1.0, 1.0, 0.0]])
    close(adv, [[0.3, 0.4, 0.5], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="needs baselines"):
        ADVANTAGE_FN.get("remax")(AdvantageInput.from_outcomes(*inp_args()))
