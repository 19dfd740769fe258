"""`collate` (one tensor op per field) against a row-by-row oracle, and its refusals."""

import pytest
import torch

from trinity.common.experience import EID, Experience
from trinity.trainer.batch import collate


def oracle(experiences: list[Experience], pad_id: int) -> dict[str, torch.Tensor | None]:
    """The batch layout of trinity/trainer/batch.py, filled one row at a time."""
    b = len(experiences)
    t = max(len(e.tokens) for e in experiences)
    r = max(max(e.response_length for e in experiences), 1)
    out = {
        "input_ids": torch.full((b, t), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((b, t), dtype=torch.long),
        "response_pos": torch.zeros((b, r), dtype=torch.long),
        "response_ids": torch.full((b, r), pad_id, dtype=torch.long),
        "response_mask": torch.zeros((b, r), dtype=torch.bool),
        "valid_mask": torch.zeros((b, r), dtype=torch.bool),
        "rollout_logprobs": torch.zeros((b, r)),
        "rewards": torch.zeros(b),
        "group_ids": torch.zeros(b, dtype=torch.long),
        "token_rewards": torch.zeros((b, r)),
        "advantages": torch.zeros((b, r)),
    }
    groups: dict[tuple, int] = {}
    for i, e in enumerate(experiences):
        n, p, m = len(e.tokens), e.prompt_length, e.response_length
        out["input_ids"][i, :n] = e.tokens
        out["attention_mask"][i, :n] = 1
        for k in range(m):
            out["response_pos"][i, k] = p - 1 + k
            out["response_ids"][i, k] = e.tokens[p + k]
            out["response_mask"][i, k] = bool(e.action_mask[k])
            out["valid_mask"][i, k] = True
            if e.logprobs is not None:
                out["rollout_logprobs"][i, k] = e.logprobs[k]
            out["token_rewards"][i, k] = e.token_level_reward[k]
            out["advantages"][i, k] = e.advantages[k]
        out["rewards"][i] = 0.0 if e.reward is None else e.reward
        out["group_ids"][i] = groups.setdefault(e.eid.group, len(groups))
    return out


def rows(seed: int = 0) -> list[Experience]:
    """Groups of 1-3 rows, prompts of 1-6 tokens, responses of 0-5 (one of them empty), holes in
    the action masks, a row without engine logprobs, a row without a reward."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for task in range(4):
        for run in range(1 + task % 3):
            p = int(torch.randint(1, 7, (1,), generator=g))
            m = 0 if (task, run) == (2, 1) else int(torch.randint(1, 6, (1,), generator=g))
            out.append(
                Experience(
                    tokens=torch.randint(3, 50, (p + m,), generator=g),
                    prompt_length=p,
                    logprobs=None if (task, run) == (1, 0) else -torch.rand(m, generator=g),
                    action_mask=torch.rand(m, generator=g) > 0.3,
                    reward=None if (task, run) == (3, 2) else float(run),
                    token_level_reward=torch.randn(m, generator=g),
                    advantages=torch.randn(m, generator=g),
                    eid=EID(batch=1, task=task, run=run),
                )
            )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_collate_matches_the_row_by_row_oracle(seed):
    exps = rows(seed)
    batch, want = collate(exps, pad_id=1), oracle(exps, pad_id=1)
    for name, expected in want.items():
        torch.testing.assert_close(getattr(batch, name), expected, rtol=0, atol=0, msg=name)
    assert batch.rollout_known.tolist() == [e.logprobs is not None for e in exps]


def test_collate_refusals():
    with pytest.raises(ValueError, match="at least one prompt token"):
        collate([Experience(tokens=torch.tensor([4, 5]), prompt_length=0)], pad_id=0)
    mixed = [
        Experience(tokens=torch.tensor([4, 5]), prompt_length=1, token_level_reward=[1.0]),
        Experience(tokens=torch.tensor([4, 6]), prompt_length=1),
    ]
    with pytest.raises(ValueError, match="with and without token_level_reward"):
        collate(mixed, pad_id=0)


def test_rows_without_a_trained_token_are_no_sequences_of_the_batch() -> None:
    # 4 rows, one excluded by its workflow (action mask zeroed): N_seqs of the seq-mean modes
    # is 3, for the batch and for any subset of its rows
    from trinity.workflows.base import exclude_from_training

    exps = [
        Experience(tokens=torch.tensor([5, 6, 7, 8]), prompt_length=2, eid=EID(run=i))
        for i in range(4)
    ]
    exclude_from_training(exps[2:3], "judge_inconsistent")
    batch = collate(exps, pad_id=0)
    assert batch.num_seqs() == 3
    assert batch.num_seqs(torch.tensor([False, True, True, False])) == 1
