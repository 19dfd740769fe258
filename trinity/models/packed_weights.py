"""The decode steps' weights, packed: each layer's projections as [in, out] blocks, fused.

    packs = packed_layers(model, version)   # per decoder layer, rebuilt when the weights change
    qkv = packs[l].qkv(h)                   # one matmul for q, k and v: [.., (H + 2·Hkv)·hd]

A decode step multiplies a few dozen rows by every weight matrix. At that size the matrix's
layout and the call count matter as much as the arithmetic: on the 10M-parameter benchmark model
(32 rows, fp32, 2 CPU threads) BLAS reads an [out, in] `nn.Linear` weight transposed, which
cost 8-34% per matmul against the same numbers stored [in, out], and q, k and v (320, 64 and 64
outputs) or gate and up as separate matmuls cost more than one matmul over their concatenation:
an engine batch took 0.74 s from the modules and 0.66 s from packed weights, a repack included.
So the lean decoder (`models.lean_decode`) multiplies by packed copies:

    qkv     [D, (H + 2·Hkv)·hd] = [W_q; W_k; W_v]ᵀ    (+ [b_q; b_k; b_v])
    o       [H·hd, D]          = W_oᵀ
    gate_up [D, 2·I]           = [W_gate; W_up]ᵀ
    down    [I, D]             = W_downᵀ
    head    [D, V]             = W_lm_headᵀ

The arithmetic is the same dot products, so logits agree with the model's own modules to float
rounding (tests/test_lean_decode.py). The cost is a second copy of the linear weights (the
embedding excepted) while the engine exists, and a copy per weight update: 39 MB and about 20 ms
on that model. Packing is for CPU engines (a GPU's GEMMs do not care about the layout, and its
memory is the scarcer) of at most `MAX_PACKED_BYTES`; larger models decode from their own
weights.

The packs are kept per model and rebuilt when any source weight changes: a stamp of each source
tensor's storage address and in-place version counter, plus the engine's weights version (a sync
that maps the same memory, where neither moves, still bumps it).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

# pack only models whose packed copy stays under this: the copy is the memory price of the gain
MAX_PACKED_BYTES = 512 * 1024**2


@dataclass(frozen=True)
class Packed:
    """y = x @ weight (+ bias): weight [in, out], contiguous."""

    weight: Tensor
    bias: Tensor | None

    def __call__(self, x: Tensor) -> Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        y = (
            torch.addmm(self.bias, flat, self.weight)
            if self.bias is not None
            else flat @ self.weight
        )
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


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


def pack(*linears: Any) -> Packed:
    """The [in, Σ out] weight (and bias) of `linears` applied side by side."""
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
    return Packed(weight, bias)


def _sources(model: Any) -> list[Any]:
    mods = [model.lm_head]
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        mods += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return mods


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
    plain `nn.Linear` projections, and a packed copy of at most `MAX_PACKED_BYTES`."""
    mods = _sources(model)
    if not all(isinstance(m, torch.nn.Linear) for m in mods):
        return False
    if mods[0].weight.device.type != "cpu":
        return False
    size = sum(m.weight.numel() * m.weight.element_size() for m in mods)
    return size <= MAX_PACKED_BYTES


def packed_layers(model: Any, version: int = 0) -> PackedModel:
    """`model`'s packed weights for weights `version`: the cached ones while no source weight
    changed, else packed anew (the old copy freed first)."""
    mods = _sources(model)
    stamp = (version, *(s for m in mods for s in (_stamp(m.weight), _stamp(m.bias))))
    cached = _PACKS.get(model)
    if cached is not None and cached.stamp == stamp:
        return cached
    _PACKS.pop(model, None)
    with torch.no_grad():
        layers = [
            PackedLayer(
                qkv=pack(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                o=pack(layer.self_attn.o_proj),
                gate_up=pack(layer.mlp.gate_proj, layer.mlp.up_proj),
                down=pack(layer.mlp.down_proj),
                qk_out=layer.self_attn.q_proj.out_features + layer.self_attn.k_proj.out_features,
                inner=layer.mlp.gate_proj.out_features,
            )
            for layer in model.model.layers
        ]
        packed = PackedModel(stamp, layers, pack(model.lm_head))
    _PACKS[model] = packed
    return packed


def rms_norm(norm: Any, x: Tensor) -> Tensor:
    """`norm(x)` for the Llama layout's RMSNorm, as one call in fp32 (`F.rms_norm`: the same
    weight · x / sqrt(mean(x²) + eps)); the module itself for other dtypes, whose rounding
    order (upcast, normalise, downcast, then scale) `F.rms_norm` does not promise."""
    eps = getattr(norm, "variance_epsilon", None)
    if x.dtype != torch.float32 or eps is None:
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
