"""The decode steps' weights, packed: each layer's projections as [in, out] blocks, fused.

    packs = packed_layers(model, version)   # per decoder layer, rebuilt when the weights change
    qkv = packs[l].qkv(x)                   # input_layernorm, then q, k and v in one matmul
    x = packs[l].o.add_to(x, attn)          # the residual added by the matmul itself

A decode step multiplies a few dozen rows by every weight matrix. At that size the matrix's
layout and the call count matter as much as the arithmetic: BLAS reads an [out, in] `nn.Linear`
weight transposed, which costs more per matmul than the same numbers stored [in, out], and q, k
and v (on a small model 320, 64 and 64 outputs) or gate and up as separate matmuls cost more
than one matmul over their concatenation (docs/benchmarks.md, "Packed decode weights").
So the lean decoder (`models.lean_decode`) multiplies by packed copies:

    qkv     [D, (H + 2·Hkv)·hd] = diag(w_in)·[W_q; W_k; W_v]ᵀ    (+ [b_q; b_k; b_v])
    o       [H·hd, D]          = W_oᵀ
    gate_up [D, 2·I]           = diag(w_post)·[W_gate; W_up]ᵀ
    down    [I, D]             = W_downᵀ
    head    [D, V]             = diag(w_final)·W_lm_headᵀ

Every op between two matmuls costs far more than its arithmetic: a matmul streams megabytes of
weights through the core's cache, and the small op that follows finds its code and data gone (an
RMSNorm takes several times as long right after a matmul as in a loop). So the packs take
ops out: each RMSNorm before a projection is folded into it. With s = 1 / sqrt(mean(x²) + eps)
per row, RMSNorm(x)·W = s ⊙ (x·diag(w)·W): the norm's weight w scales the packed rows once, and
the step scales each output row by s (`inv_rms`, computed on [rows, 1] but for x²'s mean), so
no normalised copy of x is made and the weight's multiply is gone. That is only the same
arithmetic to float rounding in fp32 (elsewhere the module rounds to its dtype before
scaling), so other dtypes keep the norm module in front of the matmul (`Packed.norm`).
An engine batch decodes faster from the packs than from the modules, a repack before each
batch included (docs/benchmarks.md, "Fewer ops between the decode step's matmuls").

The logits agree with the model's own modules to float rounding (tests/test_lean_decode.py). The
cost is a second copy of the linear weights (the embedding excepted) while the engine exists, and
a copy per weight update (a transposing copy, straight into each block's columns). Packing is for
CPU engines (a GPU's GEMMs do not care about the layout, and its memory is the scarcer) of at
most `MAX_PACKED_BYTES`; larger models decode from their own weights.

The packs are kept per model and rebuilt when any source weight changes: a stamp of each source
tensor's storage address and in-place version counter (the projections' and the norms'), plus the
engine's weights version (a sync that maps the same memory, where neither moves, still bumps it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

# pack only models whose packed copy stays under this: the copy is the memory price of the gain
MAX_PACKED_BYTES = 512 * 1024**2


def inv_rms(x: Tensor, eps: float) -> Tensor:
    """[rows, 1]: 1 / sqrt(mean(x²) + eps) of each row of x [rows, D] (RMSNorm's scale)."""
    return x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()


@dataclass(frozen=True)
class Packed:
    """y = N(x) @ weight (+ bias), weight [in, out] contiguous, where N is the RMSNorm in front
    of the projection: folded in when `eps` is set (`weight`'s rows already scaled by the
    norm's weight, so y = inv_rms(x) ⊙ (x @ weight) + bias), the `norm` module when set, else
    none."""

    weight: Tensor
    bias: Tensor | None
    eps: float | None = None
    norm: Any = None

    def __call__(self, x: Tensor) -> Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if self.eps is not None:
            y = flat @ self.weight
            scale = inv_rms(flat, self.eps)
            y = torch.addcmul(self.bias, y, scale) if self.bias is not None else y.mul_(scale)
        else:
            if self.norm is not None:
                flat = self.norm(flat)
            y = (
                torch.addmm(self.bias, flat, self.weight)
                if self.bias is not None
                else flat @ self.weight
            )
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])

    def add_to(self, base: Tensor, x: Tensor) -> Tensor:
        """base + self(x) for 2-D x and base, the addition done by the matmul (no norm)."""
        assert self.eps is None and self.norm is None, "add_to is for projections without a norm"
        y = torch.addmm(base, x, self.weight)
        return y.add_(self.bias) if self.bias is not None else y


@dataclass(frozen=True)
class PackedLayer:
    qkv: Packed  # columns: q, then k, then v
    o: Packed
    gate_up: Packed  # columns: gate, then up
    down: Packed
    qk_out: int  # q's and k's columns of qkv
    inner: int  # gate's columns of gate_up (the MLP's width)


@dataclass(frozen=True)
class PackedModel:
    stamp: tuple[Any, ...]
    layers: list[PackedLayer]
    head: Packed


_PACKS: weakref.WeakKeyDictionary[Any, PackedModel] = weakref.WeakKeyDictionary()


def pack(*linears: Any, norm: Any = None) -> Packed:
    """The [in, Σ out] weight (and bias) of `linears` applied side by side, after the RMSNorm
    module `norm` (the Llama layout's: `weight`, `variance_epsilon`) when given: folded into the
    weight in fp32, kept as a module otherwise."""
    first = linears[0].weight
    outs = [m.weight.shape[0] for m in linears]
    weight = first.new_empty(first.shape[1], sum(outs))
    start = 0
    for m, out in zip(linears, outs, strict=True):  # each block straight into its columns:
        weight[:, start : start + out].copy_(m.weight.t())  # no concatenated copy first
        start += out
    biases = [getattr(m, "bias", None) for m in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b if b is not None else m.weight.new_zeros(m.weight.shape[0])
                for b, m in zip(biases, linears, strict=True)
            ]
        )
    if norm is None:
        return Packed(weight, bias)
    if _foldable(norm, weight):
        weight.mul_(norm.weight[:, None])
        return Packed(weight, bias, eps=float(norm.variance_epsilon))
    return Packed(weight, bias, norm=norm)


def _foldable(norm: Any, weight: Tensor) -> bool:
    eps = getattr(norm, "variance_epsilon", None)
    w = getattr(norm, "weight", None)
    return (
        eps is not None
        and isinstance(w, Tensor)
        and w.shape == weight.shape[:1]
        and weight.dtype == w.dtype == torch.float32
    )


def _sources(model: Any) -> list[Any]:
    mods = [model.lm_head]
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        mods += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return mods


def _norms(model: Any) -> list[Any]:
    norms = [model.model.norm]
    for layer in model.model.layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    return norms


def _stamp(t: Tensor | None) -> tuple[int, int]:
    if t is None:
        return (0, 0)
    try:
        version = t._version
    except RuntimeError:  # an inference-mode tensor keeps no version counter
        version = -1
    return (t.data_ptr(), version)


def packable(model: Any) -> bool:
    """Whether `model` (a layout `LeanDecoder` serves) decodes from packed weights: on CPU, with
    plain `nn.Linear` projections of whole weights (not split over tensor-parallel ranks: their
    modules' hooks do the collectives), and a packed copy of at most `MAX_PACKED_BYTES`."""
    mods = _sources(model)
    if not all(isinstance(m, torch.nn.Linear) for m in mods):
        return False
    if any(isinstance(m.weight, DTensor) for m in mods):
        return False
    if mods[0].weight.device.type != "cpu":
        return False
    size = sum(m.weight.numel() * m.weight.element_size() for m in mods)
    return size <= MAX_PACKED_BYTES


def packed_layers(model: Any, version: int = 0) -> PackedModel:
    """`model`'s packed weights for weights `version`: the cached ones while no source weight
    changed, else packed anew (the old copy freed first)."""
    tensors = [
        t for m in _sources(model) + _norms(model) for t in (m.weight, getattr(m, "bias", None))
    ]
    stamp = (version, *(_stamp(t) for t in tensors))
    cached = _PACKS.get(model)
    if cached is not None and cached.stamp == stamp:
        return cached
    _PACKS.pop(model, None)
    with torch.no_grad():
        layers = [
            PackedLayer(
                qkv=pack(
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                    norm=layer.input_layernorm,
                ),
                o=pack(layer.self_attn.o_proj),
                gate_up=pack(
                    layer.mlp.gate_proj, layer.mlp.up_proj, norm=layer.post_attention_layernorm
                ),
                down=pack(layer.mlp.down_proj),
                qk_out=layer.self_attn.q_proj.out_features + layer.self_attn.k_proj.out_features,
                inner=layer.mlp.gate_proj.out_features,
            )
            for layer in model.model.layers
        ]
        packed = PackedModel(stamp, layers, pack(model.lm_head, norm=model.model.norm))
    _PACKS[model] = packed
    return packed
