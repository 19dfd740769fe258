"""Next-token sampling for the rollout engine: temperature, top-k, top-p, greedy.

Pure tensor functions, applied in the order vLLM and transformers use: divide the logits by the
temperature, keep the `top_k` largest, then keep the smallest set of tokens, most likely first,
whose probability reaches `top_p` (nucleus sampling, Holtzman et al. 2020, "The Curious Case of
Neural Text Degeneration"). A token is kept when the probability of the tokens ranked strictly
above it is below `top_p`, so the most likely token is always kept.

The logprob an RL trainer needs is that of the *raw* policy (temperature 1, nothing filtered);
the engine computes it separately from the unfiltered logits.

Keyed draws. A request may carry a 64-bit key; the uniform behind token t of its sample j is then
a hash of (key, j, t) (`keyed_uniforms`), not the next number of a generator shared by the batch.
Which tokens a request samples then depends on its key and the logits alone, not on which other
requests share its batch, which engine serves it, or when it arrived, so request batching may
follow timing (reward code in threads, environments that wait) and a seed still repeats a run.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
    generators"), elementwise on uint64: a bijection whose outputs pass BigCrush as a counter
    sequence."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def request_seeds(key: int, n: int) -> list[int]:
    """The seeds of a keyed prompt's `n` samples for an engine that seeds each sample's own
    generator (vLLM): sample j's is splitmix64(splitmix64(key) + j), the row key our engine
    hashes its draws from, keeping 63 bits (a seed vLLM may hold in an int64 tensor)."""
    base = splitmix64(np.asarray([key], dtype=np.uint64))
    with np.errstate(over="ignore"):
        rows = splitmix64(base + np.arange(n, dtype=np.uint64))
    return [int(r) & ((1 << 63) - 1) for r in rows]


def keyed_uniforms(keys: np.ndarray, t: int) -> torch.Tensor:
    """U[0, 1) float32 per key for decode step `t`: the top 24 bits of
    splitmix64(key ^ splitmix64(t)) / 2^24 (exact in float32, so never 1.0). keys: [B] uint64
    -> [B, 1]."""
    step = splitmix64(np.asarray([t & _MASK64], dtype=np.uint64))
    bits = splitmix64(keys ^ step) >> np.uint64(40)
    return torch.from_numpy((bits.astype(np.float64) / float(1 << 24)).astype(np.float32))[:, None]


def filter_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0
) -> torch.Tensor:
    """Scaled logits with filtered-out tokens set to -inf.

    logits: [B, V]. temperature > 0; top_k <= 0 or >= V keeps all; top_p >= 1 keeps all.
    Returns [B, V] float32 whose softmax is the sampling distribution.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to sample, got {temperature} (0 means greedy)")
    out = logits.float() / temperature
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[:, -1:]  # [B, 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs  # probability ranked strictly above
        drop_sorted = mass_above >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row of logits [B, V]: argmax when temperature == 0, else a draw. -> [B]

    The draw inverts the CDF: with c_k = p_0 + ... + p_k and u ~ U[0, c_last), token k is the
    first with c_k > u, so P(k) = c_k - c_(k-1) = p_k and a filtered-out token (p_k = 0) is never
    drawn. One uniform per row instead of one random number per vocabulary entry: several times
    cheaper than torch.multinomial on CPU. `uniforms` [B, 1] in [0, 1) (`keyed_uniforms`) are
    used instead of drawing from `generator`.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)  # [B, V]
    cdf = torch.cumsum(probs, dim=-1)  # [B, V]
    if uniforms is None:
        u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device)  # [B, 1]
    else:
        u = uniforms.to(probs.device)
    total = cdf[:, -1:].contiguous()  # [B, 1], 1 up to rounding
    picked = torch.searchsorted(cdf, u * total, right=True)  # [B, 1]
    # if u * total rounds up to total, fall back to the last token with probability > 0
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(picked, last).squeeze(-1)
