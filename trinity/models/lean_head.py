"""Token logprobs and entropy through the LM head without keeping any [N, V] tensor for backward.

Under plain autograd every chunk of logits z = h Wᵀ (+ b) and its log_softmax stay alive until
backward: N × V × 4 bytes two or three times over (0.8 GB per copy for 4,096 tokens of a 49k
vocabulary). `LeanHeadFn` saves only the hidden states h [N, H], the labels y [N] and the per-token
log-sum-exp and entropy [N]; backward recomputes each chunk's logits and applies the closed forms

    lp = z_y − logsumexp(z)                  ∂lp/∂z = onehot(y) − p
    H  = logsumexp(z) − Σ_v p_v z_v          ∂H/∂z  = −p ⊙ (log p + H)

with p = softmax(z); then ∂/∂h = g_z W, ∂/∂W = g_zᵀ h, ∂/∂b = Σ g_z. At most a few [chunk, V]
tensors exist at any time, in forward and in backward (one extra head matmul per chunk is the
price). The softmax and its gradient run in fp32 whatever the weights' dtype, as the plain path
does. This is Liger-Kernel's fused linear cross-entropy idea, done per chunk in PyTorch and
extended to the entropy term; a chunk whose entropy gradient is all zero (entropy bonus off)
skips that term.

    logprobs, entropy = head_logprobs(model.get_output_embeddings(), h, labels, chunk_size=256)

`head_logprobs` takes any head module: an `nn.Linear` goes through `LeanHeadFn`; another module
(a head with its own scaling or soft-capping) through `torch.utils.checkpoint` per chunk, which
keeps the chunk's input only and reruns the head and softmax in backward. Without autograd both
are plain chunked loops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from trinity.common.logits import entropy_from_logits


def upcast(x: Tensor) -> Tensor:
    """fp16/bf16 to fp32 (the softmax's precision); fp32 and fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return upcast(F.linear(h, weight, bias))  # [n, V], at least fp32


class LeanHeadFn(torch.autograd.Function):
    """(h [N, H], labels [N], W [V, H], b [V] | None, chunk, with_entropy) -> (lp [N], H [N])."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h: Tensor,
        labels: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        n, dt = h.shape[0], upcast(h[:0]).dtype
        lp = torch.empty(n, dtype=dt, device=h.device)
        ent = torch.zeros(n, dtype=dt, device=h.device)
        lse = torch.empty(n, dtype=dt, device=h.device)
        for s in range(0, n, chunk):
            z = _logits(h[s : s + chunk], weight, bias)  # [n, V]
            c_lse = torch.logsumexp(z, dim=-1)  # [n]
            lse[s : s + chunk] = c_lse
            lp[s : s + chunk] = z.gather(-1, labels[s : s + chunk, None]).squeeze(-1) - c_lse
            if with_entropy:
                # Σ p z = Σ exp(z − lse) z, computed as (z − lse) → p in place, then p ⊙ z
                p = (z - c_lse[:, None]).exp_()  # [n, V]
                ent[s : s + chunk] = c_lse - (p.mul_(z)).sum(dim=-1)
                del p
            del z
        ctx.save_for_backward(h, labels, weight, bias, lse, ent)
        ctx.chunk = chunk
        ctx.with_entropy = with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        h, labels, weight, bias, lse, ent = ctx.saved_tensors
        n, chunk = h.shape[0], ctx.chunk
        need_h, _, need_w, need_b = ctx.needs_input_grad[:4]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = upcast(torch.zeros_like(weight)) if need_w else None
        grad_b = upcast(torch.zeros_like(bias)) if need_b and bias is not None else None
        if g_lp is None:
            g_lp = torch.zeros_like(lse)
        use_ent = ctx.with_entropy and g_ent is not None and bool(g_ent.any())
        for s in range(0, n, chunk):
            sl = slice(s, s + chunk)
            h_c = h[sl]
            logp = _logits(h_c, weight, bias).sub_(lse[sl, None])  # [n, V] log p
            p = logp.exp()  # [n, V]
            if use_ent:  # g_H · p ⊙ (log p + H), into log p's buffer
                assert g_ent is not None
                logp.add_(ent[sl, None]).mul_(p).mul_(g_ent[sl, None])
            g_z = p.mul_(-g_lp[sl, None])  # −g_lp · p, into p's buffer
            g_z.scatter_add_(-1, labels[sl, None], g_lp[sl, None])  # + g_lp · onehot(y)
            if use_ent:
                g_z.sub_(logp)
            del logp
            g_zw = g_z.to(weight.dtype)
            if grad_h is not None:
                grad_h[sl] = g_zw @ weight
            if grad_w is not None:
                grad_w.addmm_(g_z.t(), upcast(h_c))
            if grad_b is not None:
                grad_b += g_z.sum(dim=0)
            del g_z, g_zw
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, None, grad_w, grad_b, None, None


def lean_head_logprobs(
    h: Tensor,
    labels: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    chunk_size: int = 256,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Logprob of each label and (optionally) the entropy, under softmax(h Wᵀ + b).

    Args:
        h: [N, H] hidden states at the scored positions.
        labels: [N] token ids.
        weight: [V, H] the LM head's weight (tied embeddings included); bias: [V] or None.
        chunk_size: tokens whose logits exist at once (unit: tokens).
        with_entropy: also return the entropy (differentiable).
    Returns:
        (logprobs [N], entropy [N] or None), fp32 (fp64 for fp64 inputs).
    """
    lp, ent = LeanHeadFn.apply(h, labels, weight, bias, chunk_size, with_entropy)
    return lp, (ent if with_entropy else None)


def head_logprobs(
    head: torch.nn.Module,
    h: Tensor,
    labels: Tensor,
    chunk_size: int = 256,
    with_entropy: bool = True,
    lean: bool = True,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """`lean_head_logprobs` through any LM head module (module docstring); `lean=False`: plain
    autograd over the chunks (each chunk's logits kept for backward), the reference.
    `entropy_grad=False`: the entropy is a metric only, computed outside autograd."""
    if lean and isinstance(head, torch.nn.Linear):
        lp, ent = lean_head_logprobs(h, labels, head.weight, head.bias, chunk_size, with_entropy)
        return lp, (ent if ent is None or entropy_grad else ent.detach())
    lp_parts, ent_parts = [], []
    for s in range(0, h.shape[0], chunk_size):
        args = (head, h[s : s + chunk_size], labels[s : s + chunk_size], with_entropy, entropy_grad)
        if lean and torch.is_grad_enabled():
            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        lp_parts.append(lp)
        ent_parts.append(ent)
    return torch.cat(lp_parts), (torch.cat(ent_parts) if with_entropy else None)


def _head_chunk(
    head: torch.nn.Module, h: Tensor, labels: Tensor, with_entropy: bool, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    """Plain autograd: log_softmax and entropy of one chunk's logits (the entropy outside
    autograd unless `entropy_grad`)."""
    logits = upcast(head(h))  # [n, V]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).squeeze(-1)
    if not with_entropy:
        return lp, lp.new_zeros(lp.shape)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = entropy_from_logits(logits)
    return lp, ent
