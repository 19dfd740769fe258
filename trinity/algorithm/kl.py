"""KL estimators, the KL loss (`algorithm.kl_loss_fn`) and the KL reward penalty
(`algorithm.kl_penalty_fn`).

Estimators of KL(π_θ ‖ π_ref) from samples of π_θ, per token, with d = logprob - ref_logprob
(John Schulman, "Approximating KL Divergence", blog post, 2020, http://joschu.net/blog/kl-approx.html):

- ``k1`` / ``kl``:         d                    (``kl`` is verl's name for k1)
- ``k2``:                ½·d²
- ``k3`` / ``low_var_kl``: exp(-d) + d - 1   (unbiased, ≥ 0, low variance; GRPO's estimator)
- ``abs``:               |d|
- ``mse``:               ½·d², verl's other name for ``k2``
- ``k1+``, ``k2+``, ``k3+``, ``low_var_kl+``, ``abs+``: straight-through (verl's ``+`` variants):
  the estimator's value with k2's gradient, ½d² - sg[½d²] + sg[value] (so ``k2+`` is ``k2``
  in value and gradient; verl accepts the name). As a loss, k1 and k3 have the
  right expected value but not the right expected gradient of KL(π_θ ‖ π_ref); k2's gradient
  d·∇log π is the one that is (Schulman's post; verl's `kl_penalty`). As a reward penalty (no
  gradient) a ``+`` variant equals its estimator.

As in verl, `k3` clamps -d to [-20, 20] before `exp` and the result to [-10, 10].

KL loss signature:   fn(logprob [B,T], ref_logprob [B,T], action_mask [B,T], *, agg, **args)
                         -> (loss, metrics)
KL penalty signature: fn(token_rewards [B,T], logprob [B,T], ref_logprob [B,T], action_mask [B,T],
                         **args) -> (shaped token_rewards [B,T], metrics)

Config: ``kl_loss_fn: k3`` with ``kl_loss_fn_args: {kl_coef: 0.001}``; ``kl_penalty_fn: k1`` (the
estimator name) with ``kl_penalty_fn_args: {kl_coef: 0.001}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.common.lazy import lazy_module
from trinity.common.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:  # `validate` reads these registries without importing torch (`common.lazy`)
    torch = lazy_module("torch")

KL_TYPES = (
    "k1",
    "k2",
    "k3",
    "low_var_kl",
    "abs",
    "mse",
    "kl",
    "k1+",
    "k2+",
    "k3+",
    "low_var_kl+",
    "abs+",
)

KL_LOSS_FN: Registry = Registry("kl_loss_fn")
KL_PENALTY_FN: Registry = Registry("kl_penalty_fn")


def kl_estimate(logprob: Tensor, ref_logprob: Tensor, kl_type: str) -> Tensor:
    """Per-token KL estimate (see the module docstring for the formulas).

    Args:
        logprob: [B, T] log π_θ of the sampled tokens.
        ref_logprob: [B, T] log π_ref of the same tokens.
        kl_type: one of `KL_TYPES`.
    Returns:
        [B, T] estimate (not masked).
    """
    if kl_type in KL_TYPES and kl_type.endswith("+"):  # straight-through: k2's gradient
        value = kl_estimate(logprob, ref_logprob, kl_type[:-1])
        k2 = kl_estimate(logprob, ref_logprob, "k2")
        return k2 - k2.detach() + value.detach()
    d = logprob - ref_logprob
    if kl_type in ("k1", "kl"):
        return d
    if kl_type in ("k2", "mse"):
        return 0.5 * d.square()
    if kl_type in ("k3", "low_var_kl"):
        neg = (-d).clamp(-20.0, 20.0)  # ref - logprob
        return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)
    if kl_type == "abs":
        return d.abs()
    raise ValueError(f"unknown kl_type {kl_type!r}. Valid types: {', '.join(KL_TYPES)}")


def kl_loss(
    logprob: Tensor,
    ref_logprob: Tensor,
    action_mask: Tensor,
    *,
    agg: Aggregator,
    kl_coef: float = 0.001,
    kl_type: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """KL loss added to the policy loss: loss = kl_coef · agg(kl_estimate(logprob, ref), mask).

    Registered once per estimator name (`KL_TYPES`), which fixes `kl_type`.

    Args:
        logprob: [B, T] log π_θ (with grad).
        ref_logprob: [B, T] log π_ref (no grad).
        action_mask: [B, T] bool.
        agg: the loss aggregator.
        kl_coef: β.
        kl_type: one of `KL_TYPES`.
    Returns:
        (loss, {kl_loss: the aggregated estimate before β, kl_coef}).
    """
    kl = agg(kl_estimate(logprob, ref_logprob, kl_type), action_mask)
    return kl_coef * kl, {"kl_loss": float(kl.detach()), "kl_coef": float(kl_coef)}


def _register_kl_loss(kl_type: str) -> None:
    def fn(
        logprob: Tensor,
        ref_logprob: Tensor,
        action_mask: Tensor,
        *,
        agg: Aggregator,
        kl_coef: float = 0.001,
    ) -> tuple[Tensor, dict[str, float]]:
        return kl_loss(logprob, ref_logprob, action_mask, agg=agg, kl_coef=kl_coef, kl_type=kl_type)

    fn.__name__ = fn.__qualname__ = f"{kl_type}_kl_loss"
    fn.__doc__ = f"`kl_loss` with kl_type={kl_type!r}.\n\n{kl_loss.__doc__}"
    KL_LOSS_FN.register(kl_type)(fn)


def _register_kl_penalty(kl_type: str) -> None:
    def fn(
        token_rewards: Tensor,
        logprob: Tensor,
        ref_logprob: Tensor,
        action_mask: Tensor,
        *,
        kl_coef: float = 0.001,
    ) -> tuple[Tensor, dict[str, float]]:
        return kl_penalty(
            token_rewards, logprob, ref_logprob, action_mask, kl_coef=kl_coef, kl_type=kl_type
        )

    fn.__name__ = fn.__qualname__ = f"{kl_type}_kl_penalty"
    fn.__doc__ = f"`kl_penalty` with kl_type={kl_type!r}.\n\n{kl_penalty.__doc__}"
    KL_PENALTY_FN.register(kl_type)(fn)


@KL_LOSS_FN.register("none")
def no_kl_loss(
    logprob: Tensor, ref_logprob: Tensor, action_mask: Tensor, *, agg: Aggregator
) -> tuple[Tensor, dict[str, float]]:
    """No KL loss: a 0-dim zero tensor (no grad) and no metrics. Shapes as the other KL losses."""
    del ref_logprob, action_mask, agg
    return logprob.new_zeros(()), {}


def kl_penalty(
    token_rewards: Tensor,
    logprob: Tensor,
    ref_logprob: Tensor,
    action_mask: Tensor,
    *,
    kl_coef: float = 0.001,
    kl_type: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """KL reward shaping (InstructGPT-style, "Training language models to follow instructions with
    human feedback", arXiv:2203.02155):

        r'_t = r_t - β · kl_t · m_t       (unmasked tokens keep their reward)

    Registered once per estimator name (`KL_TYPES`), which fixes `kl_type`.

    Args:
        token_rewards: [B, T] per-token rewards (an outcome reward usually sits on the last token).
        logprob: [B, T] log π of the sampled tokens (rollout or old policy; no grad needed).
        ref_logprob: [B, T] log π_ref.
        action_mask: [B, T] bool.
        kl_coef: β.
        kl_type: one of `KL_TYPES`.
    Returns:
        (shaped token rewards [B, T], {kl_penalty: masked mean kl, kl_coef}).
    """
    kl = kl_estimate(logprob, ref_logprob, kl_type)
    kl = torch.where(action_mask.bool(), kl, torch.zeros_like(kl))
    shaped = token_rewards - kl_coef * kl
    return shaped, {"kl_penalty": masked_mean(kl, action_mask), "kl_coef": float(kl_coef)}


for _name in KL_TYPES:
    _register_kl_loss(_name)
    _register_kl_penalty(_name)


@KL_PENALTY_FN.register("none")
def no_kl_penalty(
    token_rewards: Tensor, logprob: Tensor, ref_logprob: Tensor, action_mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """Identity: returns `token_rewards` [B, T] unchanged and no metrics."""
    del logprob, ref_logprob, action_mask
    return token_rewards, {}
