"""Mixed SFT + RL losses on a batch of rollouts and expert rows (`sample_strategy: mix`).

algorithm: {algorithm_type: mix}            # fixed μ
algorithm: {algorithm_type: mix_chord}      # CHORD's μ schedule and φ token weights
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, check_loss_agg_mode
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN, ppo_policy_loss


def mu_schedule(
    step: int, warmup_steps: int, decay_steps: int, mu_peak: float, mu_valley: float
) -> float:
    """CHORD's μ: linear warm-up to μ_peak, then cosine decay to μ_valley.

    μ(s) = s / W · μ_peak                                        s < W
         = μ_valley + (μ_peak - μ_valley)·½(1 + cos(π (s - W) / D))  W ≤ s < W + D
         = μ_valley                                               s ≥ W + D
    """
    if step < warmup_steps:
        return step / warmup_steps * mu_peak
    if step >= warmup_steps + decay_steps:
        return mu_valley
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / decay_steps))
    return mu_valley + (mu_peak - mu_valley) * cosine


DERIVED_ARGS = (
    "use_dynamic_bsz",
    "ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "ngpus_trainer",
    "train_batch_size_usual",
    "train_batch_size_expert",
)
"""Arguments Trinity-RFT fills in its mix losses' `policy_loss_fn_args` from the batch settings
(its example configs carry them). Here the trainer derives the usual / expert parts itself, so a
config's values are accepted, noted as derived here, and not read (`trinity.config`)."""


def _parts(
    inp: PolicyLossInput, agg: Aggregator, sft_mode: str | None
) -> tuple[Tensor, Aggregator, Aggregator]:
    """The expert rows [B], and the usual and expert parts' aggregators (each over its own
    counts); `sft_mode`: the expert part's aggregation mode (None: the algorithm's)."""
    expert = inp.require("expert_mask", "a mixed SFT + RL loss").bool()  # [B]
    usual_agg = inp.part_aggs.get("usual", agg)
    expert_agg = inp.part_aggs.get("expert", agg)
    if sft_mode is not None:
        expert_agg = dataclasses.replace(expert_agg, mode=sft_mode)
    return expert, usual_agg, expert_agg


def _mixed(
    inp: PolicyLossInput,
    agg: Aggregator,
    mu: float,
    phi: bool,
    ppo_args: dict,
    sft_mode: str | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """(1 - μ)·PPO(usual rows) + μ·SFT(expert rows), each part over its own counts."""
    expert, usual_agg, expert_agg = _parts(inp, agg, sft_mode)
    m = inp.action_mask.bool()
    usual_mask = m & ~expert[:, None]
    expert_mask = m & expert[:, None]
    # PPO on the usual rows: the expert rows are masked out of its loss and its counts
    usual_inp = PolicyLossInput(
        inp.logprob, inp.old_logprob, inp.advantages, usual_mask, inp.rollout_logprob
    )
    pg, pg_m = ppo_policy_loss(usual_inp, agg=usual_agg, **ppo_args)
    # SFT on the expert rows; CHORD's φ = p(1 - p) weighs each token (no gradient through it)
    weight = torch.ones_like(inp.logprob)
    if phi:
        p = torch.exp(inp.logprob.detach())
        weight = p * (1 - p)
    sft = expert_agg(-weight * inp.logprob, expert_mask)
    loss = (1 - mu) * pg + mu * sft
    metrics = {f"usual/{k}": v for k, v in pg_m.items()}
    metrics.update(
        {"expert/sft_loss": float(sft.detach()), "mu": mu, "pg_loss": float(loss.detach())}
    )
    return loss, metrics


@POLICY_LOSS_FN.register("mix")
def mix_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    mu: float = 0.1,
    clip_range: float = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    sft_loss_agg_mode: str | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Mixed-policy loss: PPO's clip on the rollouts and NLL on the expert rows, weighted by μ.

        loss = (1 - μ) · PPO(usual rows) + μ · agg_expert(-log π, expert tokens)

    Each part is aggregated over its own rows with the whole batch's counts of that part
    (`inp.part_aggs`), so the weights do not depend on how many rows of each a micro-batch
    holds. Trinity-RFT's `mix` (after LUFFY, arXiv:2504.14945).

    Args:
        inp: logprob, old_logprob, advantages, action_mask, expert_mask [B] are read.
        agg: the aggregator (used for a part the trainer gave no aggregator of its own).
        mu: μ in [0, 1], the expert part's weight.
        clip_range, clip_range_low, clip_range_high: PPO's clip (see `ppo_policy_loss`).
        sft_loss_agg_mode: how the expert part is aggregated (a `loss_agg_mode`, over the
            expert rows' counts); None = `algorithm.loss_agg_mode`, as Trinity-RFT.
    Returns:
        (loss, {usual/<ppo metrics>, expert/sft_loss, mu, pg_loss}).
    """
    if not 0 <= mu <= 1:
        raise ValueError(f"mu must be in [0, 1], got {mu}")
    ppo_args = {"clip_range": clip_range, "clip_range_low": clip_range_low,
                "clip_range_high": clip_range_high}  # fmt: skip
    return _mixed(inp, agg, mu, phi=False, ppo_args=ppo_args, sft_mode=_mode(sft_loss_agg_mode))


mix_policy_loss.derived_args = DERIVED_ARGS  # type: ignore[attr-defined]


@POLICY_LOSS_FN.register("mix_chord")
def mix_chord_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    mu_warmup_steps: int = 0,
    mu_decay_steps: int = 0,
    mu_peak: float = 0.1,
    mu_valley: float = 0.1,
    enable_phi_function: bool = True,
    clip_range: float = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    sft_loss_agg_mode: str | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CHORD: `mix` with μ on a schedule and the expert NLL weighted per token by φ = p(1 - p).

        μ = mu_schedule(step)        (warm-up to μ_peak, cosine decay to μ_valley)
        loss = (1 - μ) · PPO(usual rows) + μ · agg_expert(-sg[p(1-p)] · log p, expert tokens)

    φ down-weights expert tokens the policy already predicts (p → 1) and those it finds
    implausible (p → 0), so imitation does not overwrite what RL learned. With
    `enable_phi_function: false` the expert part is plain NLL (CHORD-μ).

    Paper: "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised Fine-Tuning and
    Reinforcement Learning via Dynamic Weighting" (arXiv:2508.11408).

    Args:
        inp: as `mix`, plus `step` for the schedule.
        mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley: the schedule (`mu_schedule`).
        enable_phi_function: weigh expert tokens by φ.
        clip_range, clip_range_low, clip_range_high: PPO's clip.
        sft_loss_agg_mode: the expert part's aggregation (as `mix`).
    Returns:
        (loss, {usual/<ppo metrics>, expert/sft_loss, mu, pg_loss}).
    """
    if (
        min(mu_warmup_steps, mu_decay_steps) < 0
        or not 0 <= min(mu_peak, mu_valley) <= max(mu_peak, mu_valley) <= 1
    ):
        raise ValueError("mix_chord: steps must be >= 0 and mu_peak, mu_valley in [0, 1]")
    mu = mu_schedule(inp.step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
    ppo_args = {"clip_range": clip_range, "clip_range_low": clip_range_low,
                "clip_range_high": clip_range_high}  # fmt: skip
    return _mixed(inp, agg, mu, enable_phi_function, ppo_args, sft_mode=_mode(sft_loss_agg_mode))


def _mode(sft_loss_agg_mode: str | None) -> str | None:
    """`sft_loss_agg_mode` checked (a `loss_agg_mode` name, or None)."""
    if sft_loss_agg_mode is not None:
        check_loss_agg_mode(sft_loss_agg_mode)
    return sft_loss_agg_mode


mix_chord_policy_loss.derived_args = DERIVED_ARGS  # type: ignore[attr-defined]
