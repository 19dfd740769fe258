"""What the trainer hands an advantage fn and a policy loss: one record per kind.

Every piece of a kind is called the same way, so a piece that needs more than its neighbours (GAE
needs values, step-wise GRPO needs run ids, truncated importance sampling needs the engine's
logprobs) reads a field of the record instead of changing the call:

    advantage_fn(inp: AdvantageInput, **advantage_fn_args) -> (advantages [N, T], returns [N, T])
        or (advantages, returns, TokenFilter)   # a fn that also drops tokens from training
    policy_loss_fn(inp: PolicyLossInput, *, agg: Aggregator, **policy_loss_fn_args)
        -> (loss 0-dim tensor, metrics dict[str, float])

An advantage fn marked `@needs_token_stats` (Clip_B, Clip_V) reads the policy's per-token
entropy and NEC (`entropy`, `nec`), which the trainer computes from full logits only for such a
fn. A fn that drops tokens returns a third element, a `TokenFilter`: its `keep` mask is ANDed into
the batch's response mask (the dropped tokens leave every loss and its token counts) and its
`metrics` are reported under `train/advantage/`.

N rows (experiences) of T response positions; masks are bool, True on trained tokens. A field a
batch cannot provide is None (no critic: `values`; no engine logprobs: `rollout_logprob`); a piece
that needs it raises a ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")

F = TypeVar("F")


def last_token_rewards(rewards: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Each outcome reward on its row's last TRAINED token, 0 elsewhere.

        token_rewards[i, t] = rewards[i] if t = max{t' : response_mask[i, t']} else 0

    A reward must sit on a trained token: the last valid token may be masked out of training (a
    trailing token with action_mask 0) and a reward placed there would be lost when token rewards
    are summed back through the mask.

    Args:
        rewards: [N] outcome rewards.
        response_mask: [N, T] bool.
    Returns:
        (token_rewards [N, T] in the rewards' dtype, trained [N] bool: the row has a trained
        token; a row without one gets an all-zero row).
    """
    m = response_mask.bool()
    n, t = m.shape
    pos = torch.arange(t, device=m.device).expand(n, t)
    last = torch.where(m, pos, -1).amax(dim=1) if t else torch.full((n,), -1)  # [N]
    trained = last >= 0
    out = torch.zeros((n, t), dtype=rewards.dtype, device=rewards.device)
    rows = torch.arange(n, device=rewards.device)[trained]
    out[rows, last[trained]] = rewards[trained]
    return out, trained


# where a missing field comes from, for the error a piece that needs it raises
_SOURCES = {
    "values": "a critic's (algorithm_type ppo loads one)",
    "ref_logprob": "a reference model's (a kl_loss_fn or kl_penalty_fn, or a record that "
    "uses one, loads it)",
    "rollout_logprob": "the engine's (offline data has none)",
    "logprob": "the old policy's or the engine's",
    "expert_mask": "rows from an expert buffer (sample_strategy: mix)",
    "baselines": "the explorer's greedy answers (algorithm_type remax)",
    "entropy": "the trainer's token statistics (an advantage fn marked @needs_token_stats)",
    "nec": "the trainer's token statistics (an advantage fn marked @needs_token_stats)",
}


def needs_token_stats(fn: F) -> F:
    """Mark an advantage fn that reads `AdvantageInput.entropy` and `.nec`: the trainer computes
    them (one extra no-grad pass over the full vocabulary) only for a fn so marked."""
    fn.token_stats = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class TokenFilter:
    """What an advantage fn that drops tokens returns as its third element.

    Fields:
        keep: [N, T] bool, False on trained tokens the fn takes out of training.
        metrics: floats reported under `train/advantage/<name>`.
    """

    keep: Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)


def _require(record: object, name: str, piece: str) -> Tensor:
    value = getattr(record, name)
    if value is None:
        raise ValueError(
            f"{piece} needs {name}, {_SOURCES.get(name, 'a field')}, which this batch does not have"
        )
    return value


class _Fields:
    """`require`: a field that a piece needs, or an error saying where it would come from."""

    def require(self, name: str, piece: str) -> Tensor:
        """The field `name`, or a ValueError saying `piece` needs it and where it comes from."""
        return _require(self, name, piece)


@dataclass(frozen=True)
class AdvantageInput(_Fields):
    """One train batch as an advantage fn sees it.

    Fields:
        rewards: [N] float, each row's scalar reward: its outcome reward, or, when token rewards
            were shaped (a KL reward penalty, a workflow's token-level rewards), their sum over
            the row's trained tokens.
        group_ids: [N] long, equal for responses to the same task (GRPO's group).
        response_mask: [N, T] bool, True on trained response tokens.
        token_rewards: [N, T] float, per-token rewards (the outcome reward on the last trained
            token, minus any KL penalty); what token-level returns (GAE, REINFORCE++) discount.
        run_ids: [N] long, the episode of a row within its group: the rows of one multi-step
            episode (one row per turn, or the ledger's drift segments) share (group, run), and
            every baseline counts such an episode once (`trinity.algorithm.episodes`).
        step_ids: [N] long, the turn of a row within its episode (0 for single-turn rows).
        values: [N, T] float critic values V(s_t), or None without a critic.
        logprob: [N, T] float log π_old of the response tokens (the policy being trained, before
            this step's update), or None where unknown.
        ref_logprob: [N, T] float log π_ref (reference or teacher model), or None without one.
        baselines: [N] float, each row's reward baseline from the explorer (ReMax: the reward
            of its task's greedy answer), or None when rows carry none.
        entropy: [N, T] float, the entropy H_t = -Σ_v p_v log p_v of π_old's next-token
            distribution at each response position, or None unless the fn needs token stats.
        nec: [N, T] float, Σ_v p_v² · (H_t + log p_v) at each response position (Clip_V's
            "NEC" term), or None unless the fn needs token stats.
    """

    rewards: Tensor
    group_ids: Tensor
    response_mask: Tensor
    token_rewards: Tensor
    run_ids: Tensor
    step_ids: Tensor
    values: Tensor | None = None
    logprob: Tensor | None = None
    ref_logprob: Tensor | None = None
    baselines: Tensor | None = None
    entropy: Tensor | None = None
    nec: Tensor | None = None

    @classmethod
    def from_outcomes(
        cls,
        rewards: Tensor,
        group_ids: Tensor,
        response_mask: Tensor,
        *,
        run_ids: Tensor | None = None,
        step_ids: Tensor | None = None,
        values: Tensor | None = None,
        logprob: Tensor | None = None,
        ref_logprob: Tensor | None = None,
        baselines: Tensor | None = None,
        entropy: Tensor | None = None,
        nec: Tensor | None = None,
    ) -> AdvantageInput:
        """Outcome rewards only: token rewards put each on its row's last trained token; every
        row its own run (`run_ids` = row index) at step 0 unless given."""
        n = rewards.shape[0]
        token_rewards, _ = last_token_rewards(rewards, response_mask)
        arange = torch.arange(n, device=rewards.device)
        return cls(
            rewards=rewards,
            group_ids=group_ids,
            response_mask=response_mask.bool(),
            token_rewards=token_rewards,
            run_ids=arange if run_ids is None else run_ids,
            step_ids=torch.zeros_like(arange) if step_ids is None else step_ids,
            values=values,
            logprob=logprob,
            ref_logprob=ref_logprob,
            baselines=baselines,
            entropy=entropy,
            nec=nec,
        )


@dataclass(frozen=True)
class PolicyLossInput(_Fields):
    """One micro-batch as a policy loss sees it.

    Fields:
        logprob: [B, T] log π_θ of the taken tokens, with grad.
        old_logprob: [B, T] log π_old (the proximal policy of PPO's ratio), no grad.
        advantages: [B, T]. With an off-policy correction (`algorithm.rollout_correction`) they
            already carry its importance weight: A_t · w_t, w_t ≥ 0 detached, so every loss
            that is positively homogeneous in A (all built-in ones) is corrected unchanged.
        action_mask: [B, T] bool, True on trained tokens.
        rollout_logprob: [B, T] the engine's logprobs of the sampled tokens (the behaviour
            policy), or None where the batch has none (offline data).
        ref_logprob: [B, T] log π_ref, or None without a reference model.
        expert_mask: [B] bool, rows from an expert (SFT) buffer (`sample_strategy: mix`), or
            None when the batch has none.
        part_aggs: with `expert_mask`, aggregators of the "usual" and the "expert" rows alone,
            each with the whole (mini-)batch's counts of its part, so a loss that treats the
            parts apart stays exact under gradient accumulation.
        step: the train step (1-based), for losses with a schedule (CHORD's μ) or a seeded draw
            (Clip-Cov).
        is_weights: [B, T] the correction's weight w_t, already in `advantages`, or None without
            a correction. A loss with a term that does not scale with A (DRO's proximal
            penalty, KL-Cov's) multiplies that term by it, so that every loss weighs its whole
            per-token loss by w_t: ℓ(A·w, is_weights=w) = w·ℓ(A).
    """

    logprob: Tensor
    old_logprob: Tensor
    advantages: Tensor
    action_mask: Tensor
    rollout_logprob: Tensor | None = None
    ref_logprob: Tensor | None = None
    expert_mask: Tensor | None = None
    part_aggs: Mapping[str, Any] = field(default_factory=dict)
    step: int = 1
    is_weights: Tensor | None = None

    def weigh(self, term: Tensor) -> Tensor:
        """`term` [B, T] times the correction's weight (unchanged without a correction): for a
        loss term that does not scale with the advantage."""
        return term if self.is_weights is None else term * self.is_weights

    def core(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(logprob, old_logprob, advantages, action_mask): what every loss reads."""
        return self.logprob, self.old_logprob, self.advantages, self.action_mask
