"""Collate experiences into padded tensors and split them into micro-batches.

Layout (B sequences, T = longest prompt+response, R = longest response):

    input_ids       [B, T]  right-padded prompt + response
    attention_mask  [B, T]
    response_pos    [B, R]  position in input_ids whose logits predict response token r
                            (= prompt_length + r - 1)
    response_ids    [B, R]
    response_mask   [B, R]  bool: r < response_length and action_mask[r] (trained tokens)
    valid_mask      [B, R]  bool: r < response_length (tokens that exist)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from trinity.common.experience import Experience


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_pos: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    valid_mask: torch.Tensor
    rollout_logprobs: torch.Tensor  # [B, R], 0 where unknown
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B] long
    run_ids: torch.Tensor  # [B] long: the episode within its group (EID.run)
    step_ids: torch.Tensor  # [B] long: the turn within its episode (EID.step)
    rollout_known: torch.Tensor  # [B] bool: the row came with engine logprobs
    expert_mask: torch.Tensor  # [B] bool: the row comes from an expert buffer (mix)
    # [B] bool: the row is a replay copy (trained before); None: no row is
    replayed: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None  # [B, R], a workflow's token-level rewards
    baselines: torch.Tensor | None = None  # [B] the explorer's reward baseline (ReMax)
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]
    old_logprobs: torch.Tensor | None = None  # [B, R]
    ref_logprobs: torch.Tensor | None = None  # [B, R]
    is_weights: torch.Tensor | None = None  # [B, R] off-policy correction weights
    values: torch.Tensor | None = None  # [B, R] the critic's V(s_t) the advantages used
    # [B, R] π_old's token statistics, for an advantage fn marked @needs_token_stats
    stats_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    nec: torch.Tensor | None = None

    def num_seqs(self, rows: torch.Tensor | None = None, unit: int = 1) -> int:
        """Sequences the aggregation counts (N_seqs): the rows (where `rows` [B] bool is True)
        with a trained token. A row with none (excluded by its workflow, built on a truncated
        prompt, rejected whole by the off-policy correction, which takes its tokens out of
        `response_mask`) trains nothing and leaves the seq-mean denominators. `unit`: rows
        that make one loss term (2: a DPO pair) count whole when any of them has a trained
        token, so a pair is never half a pair."""
        counted = self.response_mask.any(dim=-1)
        if unit > 1:
            counted = counted.view(-1, unit).any(dim=-1).repeat_interleave(unit)
        if rows is not None:
            counted = counted & rows.bool()
        return int(counted.sum())

    @property
    def has_rollout_logprobs(self) -> bool:
        """Every row came with the engine's logprobs (offline data has none)."""
        return bool(self.rollout_known.all())

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens, prompt included: what tokens/s counts."""
        return int(self.attention_mask.sum())

    def select(self, idx: torch.Tensor | slice) -> Batch:
        """Rows `idx`, trimmed to the longest sequence and response among them."""
        rows = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: (v[idx] if v is not None else None) for k, v in rows.items()}
        t = int(out["attention_mask"].sum(dim=1).max())
        r = int(out["valid_mask"].sum(dim=1).max())
        for k in ("input_ids", "attention_mask"):
            out[k] = out[k][:, :t]
        for k, v in out.items():
            if v is not None and v.dim() == 2 and k not in ("input_ids", "attention_mask"):
                out[k] = v[:, :r]
        return Batch(**out)


def collate(experiences: list[Experience], pad_id: int) -> Batch:
    """The padded batch of `experiences` (module docstring's layout), one tensor op per field."""
    b = len(experiences)
    prompts = torch.tensor([e.prompt_length for e in experiences], dtype=torch.long)  # [B]
    if int(prompts.min()) < 1:
        raise ValueError("an experience needs at least one prompt token to condition on")
    rows = [e.tokens for e in experiences]
    lengths = torch.tensor([len(x) for x in rows], dtype=torch.long)  # [B]
    resp = lengths - prompts  # [B]
    input_ids = pad_sequence(rows, batch_first=True, padding_value=pad_id)  # [B, T]
    t = input_ids.shape[1]
    r = max(int(resp.max()), 1)
    attention = (torch.arange(t)[None] < lengths[:, None]).long()
    offs = torch.arange(r)[None]  # [1, R]
    valid = offs < resp[:, None]  # [B, R]
    response_pos = torch.where(valid, prompts[:, None] - 1 + offs, 0)
    take = (prompts[:, None] + offs).clamp(max=t - 1)
    response_ids = torch.where(valid, input_ids.gather(1, take), pad_id)

    def padded(values: list[Any], dtype: torch.dtype) -> torch.Tensor:  # [B, R], 0 past each row
        out = torch.zeros((b, r), dtype=dtype)
        width = pad_sequence([torch.as_tensor(v, dtype=dtype) for v in values], True)
        out[:, : width.shape[1]] = width
        return out

    assert all(e.action_mask is not None for e in experiences)
    response_mask = padded([e.action_mask for e in experiences], torch.bool) & valid
    known = [e.logprobs is not None for e in experiences]
    given = [e.logprobs if e.logprobs is not None else [] for e in experiences]
    rollout_lp = padded(given, torch.float32)  # 0 where unknown
    rewards = torch.tensor([0.0 if e.reward is None else e.reward for e in experiences])
    group_index: dict[tuple, int] = {}
    group_ids = torch.tensor(
        [group_index.setdefault(e.eid.group, len(group_index)) for e in experiences],
        dtype=torch.long,
    )
    run_ids = torch.tensor([e.eid.run for e in experiences], dtype=torch.long)
    step_ids = torch.tensor([e.eid.step for e in experiences], dtype=torch.long)
    expert = [bool(e.info.get("is_expert", False)) for e in experiences]
    replayed = [int(e.info.get("use_count", 0)) > 0 for e in experiences]
    given_baselines = [e.info.get("reward_baseline") for e in experiences]
    baselines = (
        None if None in given_baselines else torch.tensor(given_baselines, dtype=torch.float32)
    )
    token_rewards = None
    if any(e.token_level_reward is not None for e in experiences):
        if any(e.token_level_reward is None for e in experiences):
            raise ValueError("a train batch mixes experiences with and without token_level_reward")
        token_rewards = padded([e.token_level_reward for e in experiences], torch.float32)
    advantages = None
    if all(e.advantages is not None for e in experiences):
        advantages = padded([e.advantages for e in experiences], torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        response_pos=response_pos,
        response_ids=response_ids,
        response_mask=response_mask,
        valid_mask=valid,
        rollout_logprobs=rollout_lp,
        rewards=rewards,
        group_ids=group_ids,
        run_ids=run_ids,
        step_ids=step_ids,
        rollout_known=torch.tensor(known, dtype=torch.bool),
        expert_mask=torch.tensor(expert, dtype=torch.bool),
        replayed=torch.tensor(replayed, dtype=torch.bool) if any(replayed) else None,
        token_rewards=token_rewards,
        baselines=baselines,
        advantages=advantages,
    )


def scatter_rows(
    batch: Batch, rows: torch.Tensor, *parts: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Each of `parts` ([n, R'], computed on `batch.select(rows)`) placed back at its rows of a
    zero [B, R] tensor."""
    out = []
    index = rows.nonzero().flatten()
    for part in parts:
        full = torch.zeros(batch.response_mask.shape, dtype=part.dtype)
        full[index, : part.shape[1]] = part
        out.append(full)
    return tuple(out)


def micro_batches(
    batch: Batch, micro_batch_size: int, max_tokens: int | None = None, unit: int = 1
) -> list[torch.Tensor]:
    """Row-index groups for gradient accumulation, never splitting a unit of `unit` adjacent
    rows (2: DPO's (chosen, rejected) pairs).

    With `max_tokens` (dynamic batch size), units are packed in order while
    rows × longest-row-length stays within the budget (a unit longer than the budget gets a
    micro-batch of its own); otherwise fixed groups of `micro_batch_size` rows, rounded up to
    whole units.
    """
    b = len(batch)
    if b % unit:
        raise ValueError(f"a batch of {b} rows cannot be split into units of {unit} rows")
    if max_tokens is None:
        size = -(-micro_batch_size // unit) * unit  # rounded up to whole units
        return [torch.arange(s, min(s + size, b)) for s in range(0, b, size)]
    lengths = batch.attention_mask.sum(dim=1).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for u in range(0, b, unit):
        rows = list(range(u, u + unit))
        n = max(lengths[i] for i in rows)
        if current and max(longest, n) * (len(current) + unit) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current += rows
        longest = max(longest, n)
    if current:
        groups.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in groups]
