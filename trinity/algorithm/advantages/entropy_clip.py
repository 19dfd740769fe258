"""Clip_B and Clip_V: GRPO advantages plus a token filter that steers the policy's entropy.

algorithm: {algorithm_type: grpo, advantage_fn: clipb, advantage_fn_args: {mu: 2.5}}
algorithm: {algorithm_type: grpo, advantage_fn: clipv, advantage_fn_args: {mu: 8.5}}

Both read the per-token statistics of π_old that the trainer computes for a fn marked
`@needs_token_stats` (`trinity.algorithm.inputs`): the logprob of the sampled token, the entropy
H of the next-token distribution and (Clip_V) NEC = Σ_v p_v² (H + log p_v). A first-order
expansion of the entropy change under a policy-gradient step puts each token's contribution at
A_t · S_t with

    S_t = p_t · (H_t + log p_t)          p_t = π_old(sampled token)

Negative-advantage tokens with an outlying S push the entropy down the most; dropping them from
training (their tokens leave the response mask, so every loss and its token counts skip them)
keeps the entropy from collapsing.

Departures from Trinity-RFT (arXiv:2602.03392's code): Clip_B's S reads the trainer's logprob of
π_old (Trinity-RFT's reads the engine's, although its comment says "recomputed"; they agree up to
engine numerics, and p_t then belongs to the same distribution as H_t); Clip_V drops only
negative-advantage tokens, as its docstring and README say (Trinity-RFT's code also drops
zero-advantage tokens past the threshold, which carry no policy gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN, grpo_advantage
from trinity.algorithm.inputs import AdvantageInput, TokenFilter, needs_token_stats


def entropy_indicator(inp: AdvantageInput, piece: str) -> Tensor:
    """S_t = p_t · (H_t + log p_t) [N, T] in float32, from π_old's logprob and entropy."""
    lp = inp.require("logprob", piece).float()
    h = inp.require("entropy", piece).float()
    return lp.exp() * (h + lp)


def _masked_moments(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, population std) of `x` over the True entries of `m` (n ≥ 1 assumed safe)."""
    w = m.float()
    n = w.sum().clamp_min(1.0)
    mean = (x * w).sum() / n
    var = ((x - mean) ** 2 * w).sum() / n
    return mean, var.sqrt()


def _clip_metrics(adv: Tensor, mask: Tensor, keep: Tensor) -> dict[str, float]:
    """The fraction of trained tokens dropped: all, and among positive / negative advantages
    (0.0 where there are none; Trinity-RFT reports 1.0 for an empty set)."""

    def frac(sel: Tensor) -> float:
        total = int(sel.sum())
        return float((sel & ~keep).sum() / total) if total else 0.0

    return {
        "frac_clipped": frac(mask),
        "frac_clipped_pos": frac(mask & (adv > 0)),
        "frac_clipped_neg": frac(mask & (adv < 0)),
    }


@ADVANTAGE_FN.register("clipb")
@needs_token_stats
def clipb_advantage(
    inp: AdvantageInput, *, epsilon: float = 1e-6, mu: float = 2.5
) -> tuple[Tensor, Tensor, TokenFilter]:
    """Clip_B: GRPO's advantage; negative-advantage tokens with an outlying low S are dropped.

        A_t = (r_i - mean_g) / (std_g + epsilon)            (`grpo_advantage`)
        S_t = p_t · (H_t + log p_t);  μ_S, σ_S = mean, population std of S over trained tokens
        keep_t = not (A_t < 0 and S_t - μ_S < -mu · σ_S)     (every token when σ_S < 1e-12)

    Paper: "On the Entropy Dynamics in Reinforcement Fine-Tuning of Large Language Models"
    (arXiv:2602.03392).

    Args:
        inp: rewards, group_ids, run_ids, step_ids [N]; response_mask [N, T]; logprob [N, T]
            (π_old's) and entropy [N, T] are read.
        epsilon: added to GRPO's group std.
        mu: how many σ_S below the mean S a negative-advantage token must lie to be dropped.
    Returns:
        (advantages [N, T], returns [N, T], TokenFilter(keep [N, T], {frac_clipped,
        frac_clipped_pos, frac_clipped_neg, ES, varS})).
    """
    adv, ret = grpo_advantage(inp, epsilon=epsilon)
    mask = inp.response_mask
    s = entropy_indicator(inp, "clipb")
    mean_s, std_s = _masked_moments(s, mask)
    keep = torch.ones_like(mask)
    if float(std_s) >= 1e-12:
        keep = ~((adv < 0) & (s - mean_s < -mu * std_s))
    metrics = {**_clip_metrics(adv, mask, keep), "ES": float(mean_s), "varS": float(std_s**2)}
    return adv, ret, TokenFilter(keep=keep, metrics=metrics)


@ADVANTAGE_FN.register("clipv")
@needs_token_stats
def clipv_advantage(
    inp: AdvantageInput, *, epsilon: float = 1e-6, mu: float = 8.5, max_frac: float = 1e-4
) -> tuple[Tensor, Tensor, TokenFilter]:
    """Clip_V: GRPO's advantage; negative-advantage tokens whose D = NEC - S is too large are
    dropped, at most a `max_frac` share of the trained tokens (the largest D first).

        A_t = (r_i - mean_g) / (std_g + epsilon)            (`grpo_advantage`)
        D_t = NEC_t - S_t,  NEC_t = Σ_v p_v² (H_t + log p_v),  S_t = p_t · (H_t + log p_t)
        σ_D = population std of D over trained tokens (D is not centred: E_{t~π}[S_t] = NEC_t)
        drop = {t : A_t < 0 and D_t > mu · σ_D}              (none when σ_D < 1e-12)
        if |drop| > max_frac · n_trained: keep only the max(⌊max_frac · n_trained⌋, 1) tokens
            of `drop` with the largest D dropped

    Trinity-RFT's function default is mu = 2.0 and its `default_args` mu = 8.5 (what a config
    without `advantage_fn_args` gets, and its example's value); the default here is 8.5.

    Paper: "On the Entropy Dynamics in Reinforcement Fine-Tuning of Large Language Models"
    (arXiv:2602.03392).

    Args:
        inp: rewards, group_ids, run_ids, step_ids [N]; response_mask [N, T]; logprob, entropy
            and nec [N, T] (π_old's) are read.
        epsilon: added to GRPO's group std.
        mu: the threshold on D in units of σ_D.
        max_frac: the largest share of trained tokens dropped.
    Returns:
        (advantages [N, T], returns [N, T], TokenFilter(keep [N, T], {frac_clipped,
        frac_clipped_pos, frac_clipped_neg, stdD})).
    """
    if max_frac < 0:
        raise ValueError(f"clipv: max_frac must be >= 0, got {max_frac}")
    adv, ret = grpo_advantage(inp, epsilon=epsilon)
    mask = inp.response_mask
    d = inp.require("nec", "clipv").float() - entropy_indicator(inp, "clipv")  # [N, T]
    _, std_d = _masked_moments(d, mask)
    keep = torch.ones_like(mask)
    if float(std_d) >= 1e-12:
        drop = mask & (adv < 0) & (d > mu * std_d)  # [N, T]
        n_trained = int(mask.sum())
        cap = max(int(max_frac * n_trained), 1)
        if int(drop.sum()) > cap:  # the `cap` largest D of `drop` only
            scores = d.masked_fill(~drop, float("-inf")).flatten()
            top = torch.topk(scores, cap).indices
            drop = torch.zeros_like(scores, dtype=torch.bool).index_fill(0, top, True)
            drop = drop.view_as(mask)
        keep = ~drop
    metrics = {**_clip_metrics(adv, mask, keep), "stdD": float(std_d)}
    return adv, ret, TokenFilter(keep=keep, metrics=metrics)
