"""AdamW whose two moments are stored in bfloat16: half the optimizer's memory.

    algorithm: {optimizer: {state_dtype: bfloat16}}     # default float32: torch's fused AdamW

The update is AdamW's (Loshchilov & Hutter 2019, decoupled weight decay) computed in float32;
only the stored moments are bf16. With g the gradient, t the update count, and m, v read back
from bf16 into float32:

    m ← β1·m + (1−β1)·g            v ← β2·v + (1−β2)·g²
    p ← p·(1 − lr·λ) − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)

then m is rounded to the nearest bf16 and v is rounded STOCHASTICALLY (up with probability equal
to the fraction of the way to the next bf16 value, so E[round(x)] = x). bf16 keeps 8 significant
bits: a relative step below 2^-9 is lost by round-to-nearest. m moves by (1−β1) = 10% of the way
to g per update and survives it; v moves by (1−β2) = 0.1%, so with round-to-nearest it stops
changing long before it reaches E[g²] (from v = 0 under a constant g = 1 it stalls near 0.2, where
fp32 reaches 0.95 after 3,000 updates) and every later update is too large. Stochastic rounding
makes each stored v an unbiased estimate of the fp32 one (Zamirai et al. 2020, "Revisiting
BFloat16 Training"; Gupta et al. 2015 for fixed point). The noise comes from the optimizer's own
generator, seeded from the run's seed and saved in its state dict, so a resumed run repeats an
uninterrupted one exactly.

Memory: moments 2 × 2 bytes per parameter instead of 2 × 4 (SmolLM2-135M: 1.08 → 0.54 GB), plus
float32 temporaries of at most `chunk` elements per tensor during the update (the embedding's 28M
elements are updated in pieces). Time: one Python-level pass per parameter chunk instead of
torch's fused kernel (measured in docs/real_model.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

CHUNK = 1 << 22  # elements updated at once: 16 MB per float32 temporary


def stochastic_round_to_bf16(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """float32 `x` → bfloat16, rounded up or down at random with E[result] = x, given `noise`:
    int32 values uniform in [0, 2^16), one per element of `x` (`NoisePool.draw`).

    A bf16 value is the top 16 bits of a float32. Adding a uniform integer in [0, 2^16) to the
    float32's bit pattern and dropping the low 16 bits rounds its magnitude up exactly when the
    noise exceeds 2^16 minus the dropped bits, i.e. with probability (dropped bits) / 2^16, the
    fraction of the way to the next bf16 magnitude (a carry into the exponent is the correct
    next value). The sign bit is untouched, so negative values round symmetrically. Non-finite
    inputs are not expected (AdamW's moments of finite gradients are finite)."""
    bits = x.contiguous().view(torch.int32)
    return (bits + noise).bitwise_right_shift_(16).to(torch.int16).view(torch.bfloat16)


class NoisePool:
    """Uniform integers in [0, 2^16) for stochastic rounding, drawn cheaply: `refresh()` draws
    2·`size` fresh values (once per optimizer update), and `draw(n)` returns a slice of them at a
    random offset. Each element's noise is then uniform and independent from one update to the
    next, which is all unbiased rounding needs (noise shared between elements of one update only
    correlates their rounding errors, it biases none of them). Drawing every element's noise
    afresh would put a random draw per parameter element on every update, about as costly as
    the rest of the update; the pool draws 2·`size` values once per update."""

    def __init__(self, size: int, generator: torch.Generator) -> None:
        self.size, self.generator = size, generator  # on the parameters' device
        self.pool = torch.empty(2 * size, dtype=torch.int32, device=generator.device)

    def refresh(self) -> None:
        self.pool.random_(0, 1 << 16, generator=self.generator)

    def draw(self, n: int) -> torch.Tensor:
        if n > self.size:
            raise ValueError(f"{n} noise values asked of a pool of {self.size}")
        start = torch.randint(
            0, self.size + 1, (), generator=self.generator, device=self.pool.device
        )
        start = int(start)
        return self.pool[start : start + n]


class BF16StateAdamW(torch.optim.Optimizer):
    """AdamW with bf16 moments (module docstring); float32 (or any float) parameters."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        seed: int = 0,
        chunk: int = CHUNK,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )
        self.chunk = chunk
        devices = {p.device for g in self.param_groups for p in g["params"]}
        if len(devices) != 1:
            raise ValueError(f"BF16StateAdamW needs its parameters on one device, got {devices}")
        self.generator = torch.Generator(device=devices.pop()).manual_seed(seed)
        largest = max(p.numel() for g in self.param_groups for p in g["params"])
        self.noise = NoisePool(min(chunk, largest), self.generator)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("BF16StateAdamW.step takes no closure")
        self.noise.refresh()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = state["step"].item()
                step_size = lr / (1 - b1**t)
                root_bias2 = math.sqrt(1 - b2**t)
                flat_p, flat_g = p.view(-1), p.grad.view(-1)
                flat_m, flat_v = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
                for i in range(0, flat_p.numel(), self.chunk):
                    sl = slice(i, i + self.chunk)
                    g = flat_g[sl].float()
                    m = flat_m[sl].float().lerp_(g, 1 - b1)  # [chunk] float32
                    v = flat_v[sl].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                    pc = flat_p[sl]
                    if wd:
                        pc.mul_(1 - lr * wd)
                    denom = v.sqrt().div_(root_bias2).add_(eps)
                    pc.addcdiv_(m.to(pc.dtype), denom.to(pc.dtype), value=-step_size)
                    flat_m[sl] = m.to(torch.bfloat16)
                    flat_v[sl] = stochastic_round_to_bf16(v, self.noise.draw(v.numel()))

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state plus the rounding generator's state (exact resume)."""
        return {**super().state_dict(), "rounding_rng": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        rng = state_dict.pop("rounding_rng", None)
        if rng is None:
            raise ValueError(
                "this optimizer state has no bf16 moments' rounding generator: it was saved with "
                "algorithm.optimizer.state_dtype float32 (resume with the same state_dtype)"
            )
        super().load_state_dict(state_dict)
        for s in self.state.values():  # torch casts loaded state to the parameter's dtype
            for k in ("exp_avg", "exp_avg_sq"):
                if k in s:
                    s[k] = s[k].to(torch.bfloat16)
        self.generator.set_state(rng)
