"""Group baselines count each episode once (issue 37, finding 10, "ledger credit").

An episode split over several rows (the ledger's drift segments; a step-wise workflow's turns)
shares (group, run) and differs in step. Every group or batch baseline must see it as one
episode with one reward, and every row of it gets the episode's advantage: hand-derived numbers,
and an invariance over every baseline advantage (splitting an episode into parts changes no
token's advantage).
"""

from __future__ import annotations

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


# one group of 3 episodes, rewards 1, 0, 0; episode 0 is 3 segments (steps 0, 1, 2)
REWARDS = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
RUNS = torch.tensor([0, 0, 0, 1, 2])
STEPS = torch.tensor([0, 1, 2, 0, 0])


def row_scores(name: str, **args) -> torch.Tensor:
    n = len(REWARDS)
    inp = AdvantageInput.from_outcomes(
        REWARDS, torch.zeros(n, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool),
        run_ids=RUNS, step_ids=STEPS,
    )  # fmt: skip
    adv, _ = ADVANTAGE_FN.get(name)(inp, **args)
    return adv[:, 0]


def test_grpo_counts_a_segmented_episode_once() -> None:
    # per row (the old count): mean 3/5 = 0.6. Per episode: rewards [1, 0, 0],
    # mean = 1/3, unbiased var = ((2/3)² + 2·(1/3)²)/2 = (6/9)/2 = 1/3, std = 1/√3
    # A_0 = (2/3)/(1/√3 + ε) ≈ 1.154699 on each of its 3 segments; A_1 = A_2 = (-1/3)/(1/√3 + ε)
    s = 1 / math.sqrt(3) + EPS
    a0, a1 = (2 / 3) / s, (-1 / 3) / s
    close(row_scores("grpo"), [a0, a0, a0, a1, a1])
    # Dr. GRPO (mean only): 1 - 1/3 = 2/3 and 0 - 1/3 = -1/3
    close(row_scores("grpo", std_normalize=False), [2 / 3] * 3 + [-1 / 3] * 2)


def test_leave_one_out_and_mean_baselines_count_a_segmented_episode_once() -> None:
    # RLOO: episode 0 → 1 - (0 + 0)/2 = 1; episode 1 → 0 - (1 + 0)/2 = -0.5
    close(row_scores("rloo"), [1.0, 1.0, 1.0, -0.5, -0.5])
    # OPMD (mean): b = 1/3 → 2/3, -1/3; REINFORCE with the batch mean: the same baseline
    close(row_scores("opmd"), [2 / 3] * 3 + [-1 / 3] * 2)
    close(row_scores("reinforce", baseline="batch_mean"), [2 / 3] * 3 + [-1 / 3] * 2)


def test_rows_repeating_group_run_and_step_stay_episodes_of_their_own() -> None:
    # a workflow that leaves every row at EID run 0 step 0: each row is its own episode, as before
    n = 3
    inp = AdvantageInput.from_outcomes(
        torch.tensor([1.0, 0.0, 0.0]), torch.zeros(n, dtype=torch.long),
        torch.ones(n, 1, dtype=torch.bool), run_ids=torch.zeros(n, dtype=torch.long),
    )  # fmt: skip
    adv, _ = ADVANTAGE_FN.get("grpo")(inp)
    s = 1 / math.sqrt(3) + EPS  # rewards [1, 0, 0]: mean 1/3, std 1/√3
    close(adv[:, 0], [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s])


# -- every baseline advantage: splitting an episode into parts changes no token's advantage -------

BASELINES = [
    ("grpo", {}),
    ("grpo", {"std_normalize": False}),
    ("grpo", {"std_cal_level": "batch"}),
    ("grpo", {"std_threshold": 0.3}),
    ("rloo", {}),
    ("reinforce", {"baseline": "batch_mean"}),
    ("reinforceplusplus_baseline", {}),
    ("opmd", {}),
    ("opmd", {"opmd_baseline": "logavgexp"}),
    ("asymre", {}),
    ("gpg", {}),
    ("opo", {}),
    ("passk", {"k": 2}),
    ("grpo_passk", {}),
    ("step_wise_grpo", {}),
]


def episodes_and_their_parts(seed: int) -> tuple[AdvantageInput, AdvantageInput, torch.Tensor]:
    """(one row per episode, the same episodes with some split into parts, each part row's
    episode). A split episode's trained tokens are divided among its parts (so lengths and
    token sets are kept), every part carries the episode's reward."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 14, 9
    groups = torch.randint(0, 4, (n,), generator=gen)
    rewards = torch.randint(0, 2, (n,), generator=gen).double()
    rewards[groups == 3] = 1.0  # a flat group
    mask = torch.rand(n, t, generator=gen) > 0.3
    mask[:, 0] = True  # every episode trains a token
    whole = AdvantageInput.from_outcomes(rewards, groups, mask)
    rows, part_masks, steps = [], [], []
    for i in range(n):
        k = int(torch.randint(1, 4, (1,), generator=gen))  # 1 to 3 parts
        cuts = torch.arange(t) * k // t  # token t goes to part cuts[t]
        for j in range(k):
            rows.append(i)
            part_masks.append(mask[i] & (cuts == j))
            steps.append(j)
    idx = torch.tensor(rows)
    order = torch.randperm(len(rows), generator=gen)  # parts of an episode need not be adjacent
    idx, steps_t = idx[order], torch.tensor(steps)[order]
    parts = AdvantageInput.from_outcomes(
        rewards[idx], groups[idx], torch.stack(part_masks)[order],
        run_ids=idx, step_ids=steps_t,
    )  # fmt: skip
    return whole, parts, idx


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("name", "args"), BASELINES, ids=lambda x: str(x))
def test_splitting_an_episode_into_parts_changes_no_advantage(name: str, args, seed: int) -> None:
    whole, parts, episode = episodes_and_their_parts(seed)
    fn = ADVANTAGE_FN.get(name)
    adv_whole, _ = fn(whole, **args)  # [E, T]
    adv_parts, _ = fn(parts, **args)  # [N, T]
    # each part's tokens carry its episode's advantage there, and 0 elsewhere
    expected = adv_whole[episode] * parts.response_mask
    close(adv_parts, expected, atol=1e-9)
