"""Per-token logprobs (and entropy) of response tokens without materialising full logits.

A naive step on a 49k-vocabulary model holds B×T×V fp32 logits (0.8 GB for 32×128). Here the
backbone's hidden states are gathered at the response positions only and the LM head runs on
`chunk_size` tokens at a time. Under autograd the lean path (`lean=True`,
`trinity.models.lean_head`) keeps no logits for backward: it recomputes each chunk's there.
The default is still the plain autograd path (every chunk's logits kept until backward): with
the lean path the SFT memorisation test (tests/test_learning.py) ends at 52 of 100 sums right
instead of 60 or more, every time, although one step's gradients agree with the plain path's
to 7e-7 (relative). Until that is understood the lean head is opt-in (`trainer.lean_lm_head`;
docs/real_model.md).

With sequence parallelism (`sp`: `trinity.trainer.sequence_parallel`) the backbone runs on this
rank's slice of each sequence, the LM head on the response tokens whose state lies in it, and
the group's slices are summed into the whole rows: every rank of the group returns the same
[B, R] tensors, as one process would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trinity.models.forward import cache_kwarg, checkpointing
from trinity.models.lean_head import head_logprobs
from trinity.trainer.batch import Batch
from trinity.trainer.prefix import (
    attention_only_cache,
    shared_prefix_forward,
    split_prefixes,
    worth_sharing,
)
from trinity.trainer.sequence_parallel import gather_slices, slice_states

if TYPE_CHECKING:
    from trinity.trainer.parallel import Ranks


def response_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    chunk_size: int = 256,
    with_entropy: bool = True,
    lean: bool = False,
    share_prefix: bool = True,
    entropy_grad: bool = True,
    sp: Ranks | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (logprobs [B, R], entropy [B, R] or None); zeros where `valid_mask` is False.
    `lean`: keep no [chunk, V] logits for backward (module docstring). `share_prefix`: one
    backbone pass per distinct prompt where rows share one (`trinity.trainer.prefix`).
    `entropy_grad=False`: the entropy is a metric only (no autograd through it). `sp`: this
    rank's place in its sequence-parallel group (None: the whole sequence here)."""
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    head = model.get_output_embeddings()
    if not batch.valid_mask.any():
        raise ValueError("train batch has no response tokens: every experience is prompt-only")
    if sp is not None:  # this slice's states [N, H], of the response tokens (rows, cols)
        ids = batch.input_ids[:, :-1]  # [B, T - 1]: the last token predicts nothing
        hidden, (rows, cols), h = slice_states(
            backbone, ids, batch.response_pos, batch.valid_mask, sp
        )
    else:
        hidden, pos = response_states(backbone, batch, share_prefix)  # [B, T', H], [B, R]
        rows, cols = torch.nonzero(batch.valid_mask, as_tuple=True)  # N valid response tokens
        h = hidden[rows, pos[rows, cols]]  # [N, H]
    labels = batch.response_ids[rows, cols]  # [N]
    logprobs = torch.zeros(batch.valid_mask.shape, dtype=torch.float32, device=h.device)
    entropy = torch.zeros_like(logprobs) if with_entropy else None
    if rows.numel():  # a rank's slice may hold no response token
        lp, ent = head_logprobs(
            head, h, labels, chunk_size, with_entropy, lean=lean, entropy_grad=entropy_grad
        )
        logprobs = logprobs.to(lp.dtype).index_put((rows, cols), lp)
        if ent is not None:
            entropy = torch.zeros_like(logprobs).index_put((rows, cols), ent)
    if sp is not None:  # the group's slices summed: the whole rows on every rank
        logprobs, entropy = gather_slices(hidden, sp, logprobs, entropy)
    return logprobs, entropy


def response_states(
    backbone: torch.nn.Module, batch: Batch, share_prefix: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's last hidden states and, for each response token, the column [B, R] whose
    state predicts it: one pass over the batch but its last column (a sequence's last token
    predicts nothing, and no state attends to it), or the shared-prefix passes where they pay
    (not under gradient checkpointing, whose recomputing layers drop the KV cache)."""
    ids, attention = batch.input_ids[:, :-1], batch.attention_mask[:, :-1]  # [B, T - 1]
    if share_prefix and not (torch.is_grad_enabled() and checkpointing(backbone)):
        split = split_prefixes(batch.input_ids, batch.attention_mask, batch.valid_mask.sum(dim=1))
        cache = attention_only_cache(backbone) if worth_sharing(split, ids.numel()) else None
        if split is not None and cache is not None:
            hidden = shared_prefix_forward(backbone, split, cache, cache_kwarg(backbone))
            cols = torch.arange(batch.valid_mask.shape[1], device=hidden.device)
            return hidden, cols.expand_as(batch.response_pos)  # response token r at suffix r
    hidden = backbone(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    return hidden, batch.response_pos


def response_token_stats(
    model: torch.nn.Module, batch: Batch, chunk_size: int = 256, share_prefix: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, entropy, nec) [B, R] of the response tokens under `model`, no grad, zeros
    where `valid_mask` is False (`trinity.common.logits.token_stats_from_logits`): the token
    statistics an advantage fn marked `@needs_token_stats` reads (Clip_B, Clip_V). The LM head
    runs `chunk_size` tokens at a time, so no [B, R, V] logits are held."""
    from trinity.common.logits import token_stats_from_logits

    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    head = model.get_output_embeddings()
    with torch.no_grad():
        hidden, pos = response_states(backbone, batch, share_prefix)  # [B, T', H], [B, R]
        rows, cols = torch.nonzero(batch.valid_mask, as_tuple=True)  # N valid response tokens
        h = hidden[rows, pos[rows, cols]]  # [N, H]
        labels = batch.response_ids[rows, cols]  # [N]
        parts = [
            token_stats_from_logits(head(h[s : s + chunk_size]), labels[s : s + chunk_size])
            for s in range(0, h.shape[0], chunk_size)
        ]
        out = []
        for i in range(3):
            full = torch.zeros(batch.valid_mask.shape, dtype=torch.float32, device=h.device)
            if parts:
                full = full.index_put((rows, cols), torch.cat([p[i] for p in parts]))
            out.append(full)
    return out[0], out[1], out[2]
