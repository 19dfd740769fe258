"""Loss aggregation: a per-token loss matrix [B, T] and a mask [B, T] → one scalar.

`algorithm.loss_agg_mode` picks the reduction (verl's `agg_loss` modes):

- ``token-mean``:              Σ_{i,t} ℓ·m / N_tokens
- ``token-sum``:               Σ_{i,t} ℓ·m                       (no normalisation: the loss scale
  grows with the batch's token count)
- ``seq-mean-token-sum``:      Σ_i (Σ_t ℓ·m) / N_seqs
- ``seq-mean-token-mean``:     Σ_i (Σ_t ℓ·m / Σ_t m) / N_seqs
- ``seq-mean-token-sum-norm``: Σ_i (Σ_t ℓ·m) / (N_seqs · L)      (Dr. GRPO, "Understanding R1-Zero-Like
  Training: A Critical Perspective", arXiv:2503.20783; L = a fixed horizon)

N_seqs counts the sequences with at least one masked token: a row with none (kept out of training
by its workflow, built on a truncated prompt, rejected whole by the off-policy correction) adds
nothing to the sum and is no sequence of the mean either, as verl's "exclude fully masked
sequences" (a batch of 4 with one such row averages over the other 3, not 4).

Departure from verl: the counts N_tokens and N_seqs may be the GLOBAL counts of the whole train
(mini-)batch, so that aggregating each micro-batch with them and summing the results equals
aggregating the whole batch — gradient accumulation is then exact in every mode. verl's
``seq-mean-token-sum-norm`` does not divide by N_seqs; we do, so the loss scale does not grow with
the batch size. Masked-out entries never enter the sum (`torch.where`, so a NaN/inf in padding is
harmless).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")


LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def check_loss_agg_mode(mode: str) -> str:
    """Returns `mode`, or raises ValueError listing the valid modes."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {mode!r}. Valid modes: {', '.join(LOSS_AGG_MODES)}"
        )
    return mode


def _safe(n: float) -> float:
    """A zero count means an all-masked input whose masked sum is already 0: divide by 1."""
    return n if n > 0 else 1.0


@dataclass(frozen=True)
class Aggregator:
    """Reduces a masked loss matrix to a scalar.

    Args:
        mode: one of `LOSS_AGG_MODES`.
        num_tokens: masked tokens in the whole train batch (micro-batch invariance); None = this
            call's own `mask.sum()`.
        num_seqs: sequences with a masked token in the whole train batch (module doc); None =
            this call's own count, rows of `mask` with a True.
        norm_length: horizon L of ``seq-mean-token-sum-norm`` (the trainer passes
            `model.max_response_tokens`, fixed for the run); None = `loss_mat.shape[-1]`.

    Call with `loss_mat` [B, T] (float) and `mask` [B, T] (bool or 0/1); returns a 0-dim tensor.
    """

    mode: str
    num_tokens: float | None = None
    num_seqs: float | None = None
    norm_length: float | None = None

    def __post_init__(self) -> None:
        check_loss_agg_mode(self.mode)

    def __call__(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        m = mask.bool()
        masked = torch.where(
            m, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
        )
        num_seqs = float(m.any(dim=-1).sum()) if self.num_seqs is None else self.num_seqs
        if self.mode == "token-mean":
            n = float(m.sum()) if self.num_tokens is None else self.num_tokens
            return masked.sum() / _safe(n)
        if self.mode == "token-sum":
            return masked.sum()
        if self.mode == "seq-mean-token-sum":
            return masked.sum() / _safe(num_seqs)
        if self.mode == "seq-mean-token-mean":
            seq_len = m.sum(dim=-1).to(loss_mat.dtype)  # [B]
            seq_mean = masked.sum(dim=-1) / seq_len.clamp(min=1)  # [B]; 0 where seq_len == 0
            return seq_mean.sum() / _safe(num_seqs)
        # seq-mean-token-sum-norm
        length = float(loss_mat.shape[-1]) if self.norm_length is None else self.norm_length
        return masked.sum() / _safe(num_seqs * length)

    def seq_mean(self, seq_losses: Tensor, per: int = 1) -> Tensor:
        """Σ_i ℓ_i / (N_seqs / per): the mean of a sequence-level loss over the whole batch, for
        losses defined per sequence (GMPO) or per `per` sequences (DPO: per pair, `per=2`),
        whatever `mode` is. Micro-batch invariant like the modes (global N_seqs, which leaves
        out rows with no masked token: their sequence loss must be 0).

        Args:
            seq_losses: [B / per] one loss per sequence (or per group of `per` rows); without
                `num_seqs` every one counts.
        """
        n = float(seq_losses.shape[0] * per) if self.num_seqs is None else self.num_seqs
        return seq_losses.sum() / _safe(n / per)


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Plain masked mean of a detached tensor as a python float (for metrics); 0.0 if empty."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return 0.0
    return float(x.detach()[m].float().mean())
