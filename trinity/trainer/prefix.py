"""Shared prompt prefixes: the backbone runs once per distinct prompt, not once per sample.

A GRPO train batch holds n samples of each prompt (DPO: a chosen and a rejected reply), and under
causal attention a token's hidden states depend only on the tokens before it, so the prompt part
of every sample of a group is the same computation. The trainer's logprob passes (the policy's
update, the reference and old logprobs) split each row i (prompt length p_i, response length m_i)
at its last prompt token:

    prefix_i = tokens[: p_i - 1]                shared: one row per distinct prefix
    suffix_i = tokens[p_i - 1 : p_i + m_i - 1]  per row: the last prompt token predicts response
                                                token 0, so every state the LM head reads is
                                                here; the last response token predicts nothing
                                                and, being last, feeds no other state: left out

1. distinct prefixes (`torch.unique` over the rows), left-padded into [U, Lp]: one pass fills a
   KV cache; positions count real tokens, so a prefix's positions are 0 .. p_i - 2 as in one pass
2. the cache's rows are gathered to the batch's B rows: under autograd the gather's backward sums
   each shared prefix's gradient over its rows, which is the gradient of the B separate prefixes
3. the suffixes, right-padded into [B, Ls] at positions p_i - 1 .., attend to their prefix's
   cache and themselves: hidden [B, Ls, H], response token r of row i read at [i, r]

The result equals one pass over [B, T - 1] (the last column, too, predicts nothing) up to float
rounding (other matmul shapes: 1e-6 relative on the tiny models, tests/test_prefix.py). It is how
the rollout engine prefills (one prefill per prompt, its cache fanned out to the samples); here
it also holds under gradients. The work falls from B·(T - 1) positions to U·Lp + B·Ls: for
GRPO's 16 prompts × 8 samples of `make bench` (16-token prompts, 32-token replies) from 6,016 to
4,336 positions. `trainer.share_prompt_prefix: false`
turns it off; it is also off under gradient checkpointing (a recomputing layer drops the cache)
and where a prompt is one token long (nothing to share, and an all-padding prefix row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# share only when the two passes cover at most this fraction of the one pass's positions. Time
# follows positions plus a small fixed cost (the second pass's launches, the cache's gather and
# its backward): 128 rows, 32-token replies, tiny 1m / 10m models on 2 CPU threads, medians of 7
# interleaved pairs, shared ÷ one pass for a forward + backward (no-grad forward):
#   positions 0.95: 0.98 / 0.89 (1.01 / 0.97)    0.88: 0.89 / 0.89 (0.96 / 0.93)
#   positions 0.78: 0.79 / 0.75 (0.87 / 0.81)    0.43: 0.48 / 0.39 (0.49 / 0.44)
MAX_SHARED_POSITIONS = 0.9


@dataclass(frozen=True)
class PrefixSplit:
    """Row i of the batch = distinct prefix `inverse[i]` + its own suffix."""

    inverse: Tensor  # [B] long: row -> distinct prefix
    prefix_ids: Tensor  # [U, Lp] left-padded
    prefix_mask: Tensor  # [U, Lp]
    suffix_ids: Tensor  # [B, Ls] right-padded
    suffix_mask: Tensor  # [B, Ls]
    suffix_start: Tensor  # [B]: position of the suffix's first token (p_i - 1)

    @property
    def positions(self) -> int:
        """Positions the two passes compute, padding included."""
        return self.prefix_ids.numel() + self.suffix_ids.numel()


def split_prefixes(
    input_ids: Tensor, attention_mask: Tensor, response_lengths: Tensor
) -> PrefixSplit | None:
    """The split of right-padded rows `input_ids` [B, T] (`attention_mask` [B, T]) whose last
    `response_lengths` [B] real tokens are the response; None where a prompt is one token long
    (an empty prefix: nothing to share, and a prefix row of padding only)."""
    t = input_ids.shape[1]
    lengths = attention_mask.sum(dim=1)  # [B]
    cut = lengths - response_lengths - 1  # [B] prefix lengths p_i - 1
    if int(cut.min()) < 1:
        return None
    col = torch.arange(t, device=input_ids.device)
    # rows of different prefix length must differ: -1 (no token id) past each prefix's end
    keyed = torch.where(col[None] < cut[:, None], input_ids, -1)[:, : int(cut.max())]  # [B, Lp]
    distinct, inverse = torch.unique(keyed, dim=0, return_inverse=True)  # [U, Lp], [B]
    width = distinct.shape[1]
    # 1. left-pad: token j of prefix u sits at column Lp - len_u + j
    plen = (distinct >= 0).sum(dim=1)  # [U]
    src = col[None, :width] - (width - plen[:, None])  # [U, Lp]: source column, < 0 on padding
    prefix_mask = (src >= 0).long()
    prefix_ids = distinct.gather(1, src.clamp(min=0)) * prefix_mask
    # 3. suffixes: tokens cut_i .. lengths_i - 2, right-padded
    slen = lengths - cut - 1  # [B] = m_i
    ls = int(slen.max())
    offs = torch.arange(ls, device=input_ids.device)
    suffix_mask = (offs[None] < slen[:, None]).long()  # [B, Ls]
    take = (cut[:, None] + offs[None]).clamp(max=t - 1)
    suffix_ids = input_ids.gather(1, take) * suffix_mask
    return PrefixSplit(inverse, prefix_ids, prefix_mask, suffix_ids, suffix_mask, cut)


def worth_sharing(split: PrefixSplit | None, batch_positions: int) -> bool:
    """Whether a split pays: its passes' positions at most `MAX_SHARED_POSITIONS` of one pass's
    (`batch_positions` = B·(T - 1))."""
    return split is not None and split.positions <= MAX_SHARED_POSITIONS * batch_positions


def attention_only_cache(backbone: torch.nn.Module) -> Any | None:
    """An empty KV cache for `backbone`, or None where a layer keeps another kind of state (a
    hybrid model's recurrent or convolution state, which left-padding would feed): such models
    take one pass."""
    import transformers
    from transformers.cache_utils import DynamicLayer

    cache = transformers.DynamicCache(config=backbone.config)
    layers = getattr(cache, "layers", None)
    if layers is None or not all(isinstance(layer, DynamicLayer) for layer in layers):
        return None
    return cache


def gather_rows(cache: Any, index: Tensor) -> None:
    """Each layer's keys and values [U, ...] -> [B, ...] by `index` [B]: `index_select`, whose
    backward (an index_add) is cheaper than that of the indexing `batch_select_indices` does."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


def shared_prefix_forward(
    backbone: torch.nn.Module, split: PrefixSplit, cache: Any, cache_kw: str
) -> Tensor:
    """Steps 1-3 of the module docstring, the KV in `cache` (`attention_only_cache`): the
    suffixes' last hidden states [B, Ls, H]."""
    # 1.  # [U, Lp]
    prefix_pos = (split.prefix_mask.cumsum(dim=1) - 1).clamp(min=0)
    backbone(
        input_ids=split.prefix_ids,
        attention_mask=split.prefix_mask,
        position_ids=prefix_pos,
        **{cache_kw: cache},
        use_cache=True,
    )
    # 2.  # [U, ...] -> [B, ...]
    gather_rows(cache, split.inverse)
    # 3.  # [B, Ls, H]
    ls = split.suffix_ids.shape[1]
    positions = split.suffix_start[:, None] + torch.arange(ls, device=split.suffix_ids.device)
    mask = torch.cat([split.prefix_mask[split.inverse], split.suffix_mask], dim=1)
    return backbone(
        input_ids=split.suffix_ids,
        attention_mask=mask,
        position_ids=positions,
        **{cache_kw: cache},
        use_cache=True,
    ).last_hidden_state
