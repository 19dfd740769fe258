"""DPO and IPO on pairs of rows: row 2i is the chosen response, row 2i + 1 the rejected one.

algorithm: {algorithm_type: dpo, policy_loss_fn_args: {beta: 0.1}}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from trinity.algorithm.aggregation import Aggregator
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


def pair_log_ratios(inp: PolicyLossInput, average: bool) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) log π_θ/π_ref of each pair's sequences, summed over the masked tokens
    (averaged with `average`, IPO). -> ([P], [P])."""
    if inp.logprob.shape[0] % 2:
        raise ValueError("a DPO batch needs rows in (chosen, rejected) pairs: an even row count")
    ref = inp.require("ref_logprob", "dpo")
    m = inp.action_mask.to(inp.logprob.dtype)
    diff = torch.where(inp.action_mask.bool(), inp.logprob - ref, torch.zeros_like(inp.logprob))
    seq = diff.sum(dim=-1)  # [B]
    if average:
        seq = seq / m.sum(dim=-1).clamp(min=1)
    return seq[0::2], seq[1::2]


@POLICY_LOSS_FN.register("dpo")
def dpo_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
) -> tuple[Tensor, dict[str, float]]:
    """Direct preference optimisation from a frozen reference, per (chosen, rejected) pair.

        h_p = (log π_θ(y_w) - log π_ref(y_w)) - (log π_θ(y_l) - log π_ref(y_l))
              (sequence log-probs: sums over the masked tokens)
        sigmoid: ℓ_p = -(1 - ε)·log σ(β·h_p) - ε·log σ(-β·h_p)   (ε = label_smoothing,
                 conservative DPO; ε = 0 is DPO)
        ipo:     ℓ_p = (h_p - 1/(2β))², with per-token MEAN log-probs in h_p (IPO's length
                 normalisation, as TRL)
        loss = Σ_p ℓ_p / P   (P: pairs in the whole batch, `Aggregator.seq_mean(per=2)`)

    Implicit rewards β·(log π_θ - log π_ref) of the chosen and rejected responses are reported;
    `reward_accuracy` is the fraction of pairs whose chosen reward is higher. Like the loss, these
    are means over the whole batch's pairs (micro-batch values add up). `loss_agg_mode` does not
    apply: the loss is a mean over pairs.

    Papers: "Direct Preference Optimization: Your Language Model is Secretly a Reward Model"
    (arXiv:2305.18290); IPO: "A General Theoretical Paradigm to Understand Learning from Human
    Preferences" (arXiv:2310.12036); label smoothing: Mitchell, "A note on DPO with noisy
    preferences" (cDPO, 2023).

    Args:
        inp: logprob, ref_logprob, action_mask are read; rows alternate chosen, rejected.
        agg: the aggregator (its global sequence count).
        beta: β > 0.
        label_smoothing: ε in [0, 0.5), the assumed rate of flipped labels (sigmoid only).
        loss_type: "sigmoid" (DPO) | "ipo".
    Returns:
        (loss, {dpo_loss, chosen_reward, rejected_reward, reward_margin, reward_accuracy}).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if loss_type not in ("sigmoid", "ipo"):
        raise ValueError(f"loss_type must be 'sigmoid' or 'ipo', got {loss_type!r}")
    chosen, rejected = pair_log_ratios(inp, average=loss_type == "ipo")
    h = chosen - rejected  # [P]
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h)
        losses = losses - label_smoothing * F.logsigmoid(-beta * h)
    else:
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    # a pair with no trained token (both prompts truncated) trains nothing and is no pair
    trained = inp.action_mask.bool().any(dim=-1).view(-1, 2).any(dim=-1)  # [P]
    losses = torch.where(trained, losses, torch.zeros_like(losses))
    loss = agg.seq_mean(losses, per=2)
    cw, cl = (beta * chosen.detach()), (beta * rejected.detach())

    def pair_mean(x: Tensor) -> float:  # over the whole batch's pairs: micro-batches add up
        return float(agg.seq_mean(x, per=2))

    return loss, {
        "dpo_loss": float(loss.detach()),
        "chosen_reward": pair_mean(cw),
        "rejected_reward": pair_mean(cl),
        "reward_margin": pair_mean(cw - cl),
        "reward_accuracy": pair_mean((cw > cl).to(cw.dtype)),
    }
