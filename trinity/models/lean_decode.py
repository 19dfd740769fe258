"""The rollout engine's forward passes: prefill a batch of prompts, then one token per row a step.

Two implementations of one small interface (`Decoder`):

    dec = decoder_for(model, cache_kw, room=max_new)   # LeanDecoder where the layout allows
    logits = dec.prefill(input_ids, attention, positions, n)   # [B*n, V]: each prompt's n rows
    logits = dec.step(tokens)                                   # [b, V]: one token per live row
    dec.keep(rows)                                              # drop the rows that stopped

- `HFDecoder`: the model's own `forward` with a `DynamicCache`, for any causal LM transformers
  loads (the portable path).
- `LeanDecoder`: the same arithmetic for the Llama layout (Llama, Qwen2, Qwen3: pre-norm decoder
  layers of rotary attention, grouped KV heads and a gated MLP), called module by module on the
  model's own submodules, weights and rotary embedding, with a KV cache that grows in blocks.
  A decode step of a small model is mostly per-call overhead: transformers builds a 4-D mask,
  concatenates every layer's cache (`DynamicCache` copies the whole cache each step) and walks its
  output dataclasses and kwargs for every token; the lean loop skips all three and decodes the
  same greedy tokens (its speed-up: docs/benchmarks.md, "Lean decode, reports as they come, lent
  cores"). What it calls is what transformers' layers call (their projections,
  norms, MLP, rotary module and `apply_rotary_pos_emb`), so logits agree to float rounding
  (`tests/test_lean_decode.py` checks logits, greedy tokens and sampled logprobs against
  `HFDecoder`, with left padding, fan-out and rows leaving the batch).

On CPU the decode steps of a model of up to `packed_weights.MAX_PACKED_BYTES` run from packed
copies of its weights (`models.packed_weights`: q, k and v as one [in, out] matrix, gate and up
as another, each RMSNorm folded into the projection after it), in [rows, features] tensors with
as few ops as possible between the matmuls (the rotary embedding applied to q and k at once, the
residuals added by the matmuls), which is faster than the modules even with the copy's
refresh after each weight update (docs/benchmarks.md, "Fewer ops between the decode step's
matmuls"). The prefill always runs through the model's own modules.

A model split over tensor-parallel ranks (`models.tensor_parallel`) takes the same path through
its modules, whose hooks do the all-reduces: the cache holds this rank's KV heads, and the decode
steps never use packed weights (a pack of split weights would skip the hooks).

`lean_support(model)` says why a model must take the portable path (None when it need not): an
unknown family, a sliding window, a missing submodule, or hooks that move weights at call time.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.nn import functional as F

from trinity.models import packed_weights
from trinity.models.packed_weights import PackedModel
from trinity.models.tensor_parallel import local_rows

LEAN_FAMILIES = frozenset({"llama", "qwen2", "qwen3"})  # `config.model_type` of the Llama layout
GROW = 128  # tokens the lean KV cache grows by when a step needs room past its capacity
_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa


class Decoder(Protocol):
    def prefill(self, input_ids: Tensor, attention: Tensor, positions: Tensor, n: int) -> Tensor:
        """Forward left-padded prompts [B, P] (`attention` 1 on real tokens, `positions`
        counting real tokens only); keep the cache for each prompt's `n` rows (row r is prompt
        r // n). Returns the next-token logits of every row, [B*n, V]."""
        ...

    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per live row [b]; the next-token logits [b, V]."""
        ...

    def keep(self, rows: Tensor) -> None:
        """Keep only these live rows (indices into the current rows), in this order."""
        ...


def lean_support(model: Any) -> str | None:
    """Why `model` cannot take `LeanDecoder`, or None when it can."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in LEAN_FAMILIES:
        return f"model_type {family!r} is not one of {sorted(LEAN_FAMILIES)}"
    backbone = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(backbone, name):
            return f"the backbone has no `{name}` (an older transformers release?)"
    if not hasattr(model, "lm_head"):
        return "no `lm_head`"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    for layer in backbone.layers:
        attn = getattr(layer, "self_attn", None)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"):
            if not hasattr(attn, name):
                return f"an attention layer without `{name}`"
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        for name in ("mlp", "input_layernorm", "post_attention_layernorm"):
            if not hasattr(layer, name):
                return f"a decoder layer without `{name}`"
    if any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "accelerate hooks (offloaded or dispatched weights)"
    return None


def decoder_for(
    model: Any, cache_kw: str, room: int, lean: bool = True, version: int = 0
) -> Decoder:
    """`LeanDecoder` when `lean` and the model's layout allows (`lean_support`), else
    `HFDecoder`. `room`: new tokens a row may get (the lean cache's first block holds them all
    when under `GROW`). `version`: the weights' version, for the packed weights' cache
    (`models.packed_weights`, used where `packable`)."""
    if lean and lean_support(model) is None:
        packs = None
        if packed_weights.packable(model):
            packs = packed_weights.packed_layers(model, version)
        return LeanDecoder(model, room, packs)
    return HFDecoder(model, cache_kw)


class HFDecoder:
    """The model's own forward and a `DynamicCache`: any causal LM transformers loads."""

    def __init__(self, model: Any, cache_kw: str) -> None:
        import transformers

        self.model = model
        self.cache_kw = cache_kw
        self.cache = transformers.DynamicCache(config=model.config)
        self.attention = self.next_pos = torch.empty(0)

    def _forward(self, **kw: Any) -> Tensor:
        return self.model(**kw, **{self.cache_kw: self.cache}, use_cache=True, logits_to_keep=1)

    def prefill(self, input_ids: Tensor, attention: Tensor, positions: Tensor, n: int) -> Tensor:
        logits = self._forward(
            input_ids=input_ids, attention_mask=attention, position_ids=positions
        ).logits[:, -1]
        if n > 1:
            self.cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention = attention.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        self.attention, self.next_pos = attention, positions[:, -1:] + 1
        return logits

    def step(self, tokens: Tensor) -> Tensor:
        self.attention = torch.cat(
            [self.attention, self.attention.new_ones((len(tokens), 1))], dim=-1
        )
        logits = self._forward(
            input_ids=tokens[:, None], attention_mask=self.attention, position_ids=self.next_pos
        ).logits[:, -1]
        self.next_pos = self.next_pos + 1
        return logits

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention, self.next_pos = self.attention[rows], self.next_pos[rows]


class LeanDecoder:
    """The Llama layout's forward, module by module, over a block-grown KV cache.

    Per layer l and row: h = x + o_proj(attn(rope(q), K_l, V_l)) with q, k, v the projections
    of input_layernorm(x) (Qwen3: each head through q_norm / k_norm first), k and v appended to
    the cache; x' = h + mlp(post_attention_layernorm(h)); logits = lm_head(norm(x_last)). The
    cache K_l, V_l is [rows, kv_heads, capacity, head_dim] and `mask` [rows, capacity] marks the
    filled columns a row attends to (its prompt's real tokens, then every decoded one); every row
    has the same column count (`length`), left padding being masked out.
    """

    def __init__(self, model: Any, room: int, packs: PackedModel | None = None) -> None:
        """`packs`: the model's weights packed for the decode steps' small matmuls
        (`models.packed_weights`), or None to step through its own modules."""
        self.model = model
        self.backbone = model.model
        self.layers = list(self.backbone.layers)
        self.packs = packs
        attn = self.layers[0].self_attn
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.room = room
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.mask = torch.empty(0, dtype=torch.bool)
        self.padded = True  # whether a row has padding columns to mask out
        self.length = 0
        self.next_pos = torch.empty(0)

    # -- the cache --------------------------------------------------------------------------------

    def _grow(self, need: int) -> None:
        """Room for `need` columns: capacity grows in blocks of `GROW` (amortized copies)."""
        cap = self.mask.shape[1]
        if need <= cap:
            return
        extra = max(need - cap, min(GROW, self.room))
        pad = (0, 0, 0, extra)  # the capacity axis of [rows, heads, capacity, head_dim]
        self.keys = [F.pad(k, pad) for k in self.keys]
        self.values = [F.pad(v, pad) for v in self.values]
        self.mask = F.pad(self.mask, (0, extra), value=False)

    def keep(self, rows: Tensor) -> None:
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]

    # -- the forward ------------------------------------------------------------------------------

    def _attend(
        self, attn: Any, h: Tensor, cos: Tensor, sin: Tensor, layer: int, mask: Tensor
    ) -> Tensor:
        """Self-attention of h [b, t, D] at columns length-t..length, the cache updated."""
        b, t, _ = h.shape
        shape = (b, t, -1, attn.head_dim)
        q, k = attn.q_proj(h).view(shape), attn.k_proj(h).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = self.rope(q, k, cos, sin)
        start = self.length - t
        self.keys[layer][:, :, start : self.length] = k
        self.values[layer][:, :, start : self.length] = v
        out = self._sdpa(attn, q, layer, mask)  # [b, heads, t, head_dim]
        return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _sdpa(self, attn: Any, q: Tensor, layer: int, mask: Tensor) -> Tensor:
        """Attention of q [b, heads, t, head_dim] over the first `length` columns of the
        cache of `layer`; `mask` [b, 1, t, length]."""
        keys = self.keys[layer][:, :, : self.length]
        values = self.values[layer][:, :, : self.length]
        heads, kv_heads = q.shape[1], keys.shape[1]
        kw: dict[str, Any] = {}
        if heads != kv_heads:
            if _GQA:
                kw["enable_gqa"] = True
            else:
                keys = keys.repeat_interleave(heads // kv_heads, dim=1)
                values = values.repeat_interleave(heads // kv_heads, dim=1)
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=attn.scaling, **kw
        )

    def _forward(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """Hidden states of the last position [b, D] for ids [b, t] at `positions` [b, t];
        `mask` [b, 1, t, length] says which cache columns each query sees."""
        x = self.backbone.embed_tokens(ids)
        cos, sin = self.backbone.rotary_emb(x, positions)
        for i, layer in enumerate(self.layers):
            x = x + self._attend(layer.self_attn, layer.input_layernorm(x), cos, sin, i, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.backbone.norm(x[:, -1:])

    def _packed_step(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """`_forward` of one token per row [b] from the packed weights, on [b, features]
        tensors: the last hidden states [b, D], before the final norm (the head's pack holds
        it). Few ops between the matmuls, each of which costs more than its arithmetic here
        (`models.packed_weights`): the norms folded into the projections, the residuals added
        by the matmuls, the rotary embedding applied to q and k at once as
        v·cos + roll(v, hd/2)·sin' (rotate_half(v) = roll(v, hd/2) with the first half negated,
        so sin' is sin with its first half negated, once per step), and each KV head's group of
        query heads attending as that head's queries."""
        assert self.packs is not None
        b, col = len(tokens), self.length - 1
        x = self.backbone.embed_tokens(tokens)  # [b, D]
        cos, sin = self.backbone.rotary_emb(x, self.next_pos)  # [b, 1, hd]: one for all heads
        half = cos.shape[-1] // 2
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        for i, (layer, packed) in enumerate(zip(self.layers, self.packs.layers, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp
            hd = attn.head_dim
            heads, qk_out = attn.q_proj.out_features // hd, packed.qk_out
            qkv = packed.qkv(x)  # [b, (H + 2·Hkv)·hd]
            qk = qkv[:, :qk_out].view(b, -1, hd)  # [b, H + Hkv, hd]
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head
                qk = torch.cat([attn.q_norm(qk[:, :heads]), attn.k_norm(qk[:, heads:])], dim=1)
            qk = torch.addcmul(qk * cos, qk.roll(half, -1), sin)
            self.keys[i][:, :, col] = qk[:, heads:]
            self.values[i][:, :, col] = qkv[:, qk_out:].view(b, -1, hd)
            kv_heads = self.keys[i].shape[1]
            q = qk[:, :heads].view(b, kv_heads, heads // kv_heads, hd)  # [b, Hkv, H/Hkv, hd]
            out = F.scaled_dot_product_attention(
                q,
                self.keys[i][:, :, : self.length],
                self.values[i][:, :, : self.length],
                attn_mask=mask,
                scale=attn.scaling,
            )
            x = packed.o.add_to(x, out.reshape(b, -1))  # heads in order: Hkv, then group
            gate_up = packed.gate_up(x)  # [b, 2·I]
            act = mlp.act_fn(gate_up[:, : packed.inner]).mul_(gate_up[:, packed.inner :])
            x = packed.down.add_to(x, act)
        return x

    def prefill(self, input_ids: Tensor, attention: Tensor, positions: Tensor, n: int) -> Tensor:
        rows, width = input_ids.shape
        dtype, device = self.backbone.embed_tokens.weight.dtype, input_ids.device
        attn = self.layers[0].self_attn
        head_dim = attn.head_dim
        kv_heads = local_rows(attn.k_proj) // head_dim  # this rank's, under tensor parallelism
        cap = width + min(self.room, GROW)
        self.keys = [
            torch.zeros(rows, kv_heads, cap, head_dim, dtype=dtype, device=device)
            for _ in self.layers
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.mask = torch.zeros(rows, cap, dtype=torch.bool, device=device)
        self.mask[:, :width] = attention.bool()
        self.padded = not bool(self.mask[:, :width].all())  # else every row sees every column
        self.length = width
        # causal over the real tokens; a padding query sees itself only (a query that sees
        # nothing would give NaN, and NaN values leak through a zero attention weight)
        cols = torch.arange(width, device=device)
        causal = cols[None, :] <= cols[:, None]  # [P, P]: query i sees keys j <= i
        sees = causal[None] & self.mask[:, None, :width]  # [B, P, P]
        sees |= torch.eye(width, dtype=torch.bool, device=device)[None]
        hidden = self._forward(input_ids, positions, sees[:, None])
        logits = self.model.lm_head(hidden)[:, -1]
        self.next_pos = positions[:, -1:] + 1
        if n > 1:
            self.keep(torch.arange(rows, device=device).repeat_interleave(n))
            logits = logits.repeat_interleave(n, dim=0)
        return logits

    def step(self, tokens: Tensor) -> Tensor:
        self._grow(self.length + 1)
        self.mask[:, self.length] = True
        self.length += 1
        mask = self.mask[:, None, None, : self.length]  # [b, 1, 1, length]
        if self.packs is not None:
            logits = self.packs.head(self._packed_step(tokens, mask if self.padded else None))
        else:
            logits = self.model.lm_head(self._forward(tokens[:, None], self.next_pos, mask))[:, -1]
        self.next_pos = self.next_pos + 1
        return logits
