"""DeepSpeed-Ulysses sequence parallelism for the sharded trainer: one sequence split over ranks.

    trainer: {trainer_strategy: fsdp2, world_size: 4, ulysses_sequence_parallel_size: 2}

The world's ranks form `dp = world / sp` data-parallel groups of `sp` consecutive ranks (ranks
0..sp-1 are the first group). Within a group every rank takes the same rows (its group's share
of the batch, `parallel.Ranks.rows`) but only a contiguous 1/sp slice of their sequence: the
sequence is right-padded to a multiple of sp (the padding is after every real token, so under
the causal mask no real token attends to it, and no padding state is read). Each decoder layer
runs on the slice, except attention, which needs the whole sequence (Jacobs et al. 2023,
"DeepSpeed Ulysses", arXiv:2309.14509):

1. an all-to-all turns q, k, v from [seq/sp, all heads] into [whole seq, heads/sp] (the rotary
   embedding was already applied with the slice's global positions);
2. the model's own attention function (sdpa or eager) runs on the whole sequence with a causal
   mask over its global positions;
3. an all-to-all turns the output back into [seq/sp, all heads].

The attention is registered the transformers-5 way: `AttentionInterface.register` of a function
that wraps the real one, selected by the model's `config._attn_implementation`
(`use_sequence_parallel`). Each all-to-all is an autograd Function whose backward is the inverse
all-to-all (an all-to-all only moves data, so its adjoint is the inverse move).

After the backbone, each rank computes the logprobs (or values) of the response tokens whose
predicting state lies in its slice, and `gather_slices` sums the group's [B, R] tensors: the
slices are disjoint, so the sum is the whole rows exactly (x + 0 = x). Every rank of the group
then holds the same whole rows and computes the same loss from them; the gather's backward
hands each rank the gradient of its own entries unchanged (no sum over the group: that would
count each token sp times). So every term of every loss is differentiated once, on the rank
that computed it, and the gradients of all the world's ranks SUM to the one-process gradient,
as without sequence parallelism (`trinity.trainer.parallel`).

How it departs from DeepSpeed-Ulysses and verl:
- padded rows, not packed sequences without padding (verl's `ulysses_pad_and_slice_inputs` with
  flash-attention's varlen kernels): the trainer's batches are padded, and sdpa and eager
  attention run anywhere, CPUs included. A causal mask alone is exact for right-padded rows: a
  real token's keys all precede it, so it never meets a pad; so no [T, T] padding mask is built
  (sdpa's causal kernel; eager gets one [T, T] causal mask, as transformers builds for it).
- FSDP2 still shards the parameters over all the world's ranks (a 1-D mesh), not over the
  data-parallel groups only: the simplest layout, and every rank's gradient is summed anyway.
- gloo (torch 2.13) implements `all_to_all_single`, so CPUs run the same collectives as GPUs.

Not built: models with sliding-window attention layers (the mask is causal only), attention
implementations other than sdpa and eager (flash-attention's varlen path), the shared-prefix
pass (off under FSDP2 anyway).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from trinity.trainer.parallel import Ranks

KEY = "trainer.ulysses_sequence_parallel_size"
INNER = ("sdpa", "eager")  # the attention implementations the Ulysses wrapper can run


# -- what a model must satisfy --------------------------------------------------------------


def heads_problem(heads: int, kv_heads: int | None, sp: int) -> str | None:
    """Why a model of `heads` attention heads and `kv_heads` key/value heads cannot be split
    over `sp` ranks (each rank attends with a whole block of heads), or None."""
    kv = kv_heads or heads
    if heads % sp or kv % sp:
        return (
            f"{KEY} {sp} must divide the model's attention heads ({heads}) and key/value heads "
            f"({kv}): each rank attends with heads/{sp} of them"
        )
    return None


def model_problem(config: Any, sp: int) -> str | None:
    """Why the model of transformers `config` cannot run Ulysses attention over `sp` ranks."""
    if found := heads_problem(config.num_attention_heads, config.num_key_value_heads, sp):
        return found
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return f"{KEY} {sp}: not built for models with sliding-window attention layers"
    inner = config._attn_implementation
    if inner not in INNER and not str(inner).startswith("trinity_ulysses_"):
        return f"{KEY} {sp}: not built for attention implementation {inner!r} (only {INNER})"
    return None


# -- the all-to-all ---------------------------------------------------------------------------


def all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """`x` cut into group-size parts along `scatter_dim`, part j sent to the group's rank j, and
    the parts received joined along `gather_dim` in rank order (no autograd)."""
    n = dist.get_world_size(group)
    send = torch.stack(x.chunk(n, dim=scatter_dim))  # [n, ...]: part j is rank j's
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[j]: what rank j sent here
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """`all_to_all` under autograd: its backward is the inverse all-to-all (scatter along
    `gather_dim`, gather along `scatter_dim`), the adjoint of a pure data move."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> Any:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def seq_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[B, heads, T/sp, D] slices -> [B, heads/sp, T, D], the whole sequence of a block of heads."""
    return _AllToAll.apply(x, group, 1, 2)


def heads_to_seq(x: torch.Tensor, group: Any) -> torch.Tensor:
    """[B, T, heads/sp, D] (an attention output) -> [B, T/sp, heads, D], this rank's slice."""
    return _AllToAll.apply(x, group, 1, 2)


# -- the attention wrapper --------------------------------------------------------------------


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    inner: str,
    group: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function over a sequence split between `group`'s ranks: q, k, v
    [B, heads, T/sp, D] of this rank's slice (rotary applied) -> output [B, T/sp, heads, D]
    (module docstring, steps 1-3). `inner`: the attention implementation it wraps; its mask is
    causal over the whole sequence (the model's own mask function is not called: no padding
    mask is needed for right-padded rows)."""
    if attention_mask is not None:
        raise ValueError("Ulysses attention builds its own causal mask; pass no attention mask")
    q, k, v = (seq_to_heads(t, group) for t in (query, key, value))  # [B, h/sp, T, D]
    own = sys.modules[type(module).__module__]
    fn = _inner_function(inner, getattr(own, "eager_attention_forward", None))
    mask = None  # sdpa: its causal kernel
    if inner == "eager":  # an additive [1, 1, T, T] causal mask, as transformers' eager_mask
        t = q.shape[2]
        above = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        mask = torch.zeros(t, t, dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(above, torch.finfo(q.dtype).min)[None, None]
    out, _ = fn(module, q, k, v, mask, **kwargs)  # [B, T, h/sp, D]
    return heads_to_seq(out, group), None


def _inner_function(inner: str, model_eager: Any) -> Any:
    """The attention function `inner` names (eager: the model's own module function)."""
    from transformers import AttentionInterface

    if inner == "eager":
        if model_eager is None:
            raise ValueError(f"{KEY}: the model's module defines no eager_attention_forward")
        return model_eager
    return AttentionInterface._global_mapping[inner]


def use_sequence_parallel(model: Any, ranks: Ranks) -> None:
    """Route every attention of transformers `model` through `ulysses_attention` over `ranks`'
    sequence-parallel group: registered as `trinity_ulysses_<inner>` and selected by the
    model's `config._attn_implementation` (one group per process, so one registration each).
    Raises ValueError naming the key when the model cannot be split (`model_problem`)."""
    from transformers import AttentionInterface

    if why := model_problem(model.config, ranks.sp):
        raise ValueError(why)
    inner = model.config._attn_implementation.removeprefix("trinity_ulysses_")
    name = f"trinity_ulysses_{inner}"
    fn = functools.partial(ulysses_attention, inner=inner, group=ranks.sp_group)
    AttentionInterface.register(name, fn)
    model.set_attn_implementation(name)


# -- the sequence slice -----------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceSlice:
    """This rank's columns [start, start + length) of a sequence padded to `padded` columns."""

    start: int
    length: int
    padded: int

    @classmethod
    def of(cls, columns: int, ranks: Ranks) -> SequenceSlice:
        """The slice of `ranks` in a sequence of `columns` (padded to a multiple of sp)."""
        length = -(-columns // ranks.sp)
        return cls(ranks.sp_rank * length, length, length * ranks.sp)


def slice_states(
    backbone: torch.nn.Module,
    ids: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ranks: Ranks,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The backbone over this rank's slice of right-padded `ids` [B, T]: (hidden [B, L, H] of
    the slice; (rows, cols) [N] of the tokens of `valid` [B, R] whose state, at column
    `positions` [B, R], lies in the slice; their states [N, H])."""
    cut = SequenceSlice.of(ids.shape[1], ranks)
    ids = torch.nn.functional.pad(ids, (0, cut.padded - ids.shape[1]))  # pad id 0: untrained
    ids = ids[:, cut.start : cut.start + cut.length]  # [B, L]
    cols = torch.arange(cut.start, cut.start + cut.length, device=ids.device)
    pos = cols.expand(ids.shape[0], -1)  # [B, L]: global positions, for the rotary embedding
    hidden = backbone(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
    mine = valid & (positions >= cut.start) & (positions < cut.start + cut.length)  # [B, R]
    rows, resp = torch.nonzero(mine, as_tuple=True)
    return hidden, (rows, resp), hidden[rows, positions[rows, resp] - cut.start]


class _SumSlices(torch.autograd.Function):
    """Forward: the group's sum of each rank's `values` (module docstring: disjoint slices, so
    the whole rows). Backward: the gradient unchanged to this rank's `values` (every rank
    computes the same loss from the same sum), and zeros to `anchor`, this rank's hidden
    states: so a rank whose slice holds no response token still runs its backward through
    every layer, whose all-to-alls the group's other ranks wait on."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, anchor: torch.Tensor, group: Any) -> Any:
        ctx.anchor = (anchor.shape, anchor.dtype, anchor.device)
        out = values.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        shape, dtype, device = ctx.anchor
        return grad, torch.zeros(shape, dtype=dtype, device=device), None


def gather_slices(
    anchor: torch.Tensor, ranks: Ranks, *parts: torch.Tensor | None
) -> list[torch.Tensor | None]:
    """Each of `parts` ([B, R], this rank's tokens filled, 0 elsewhere) summed over the
    sequence-parallel group into the whole rows (`_SumSlices`; `anchor`: the slice's hidden
    states). None stays None. One collective for all parts."""
    given = [p for p in parts if p is not None]
    whole = _SumSlices.apply(torch.stack(given), anchor, ranks.sp_group).unbind(0)
    it = iter(whole)
    return [None if p is None else next(it) for p in parts]
