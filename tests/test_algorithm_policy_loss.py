"""Policy losses: PPO (symmetric, decoupled, dual clip) and SFT by hand, a token-loop oracle, grads."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN, Aggregator
from trinity.algorithm.inputs import PolicyLossInput

TOKEN_MEAN = Aggregator("token-mean")


def policy_loss(name: str, logprob, old, adv, mask, **args):
    """Calls the policy loss `name` on the four tensors every loss reads."""
    return POLICY_LOSS_FN.get(name)(PolicyLossInput(logprob, old, adv, mask), **args)


def close(actual: torch.Tensor | float, expected: float | list, atol: float = 1e-6) -> None:
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def make(ratios: list[list[float]], old: float = -1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logprob = old + ln(ratio), so that exp(logprob - old) = ratio."""
    old_lp = torch.full((len(ratios), len(ratios[0])), old, dtype=torch.float64)
    return old_lp + torch.tensor(ratios, dtype=torch.float64).log(), old_lp


# 2×2 case, ε = 0.2 (clip to [0.8, 1.2]); token (1,1) is masked out and carries a wild ratio.
#   (0,0): ρ = 1.5, A = +1: max(-1·1.5, -1·1.2) = max(-1.5, -1.2) = -1.2   clipped branch active
#   (0,1): ρ = 1.0, A = +2: max(-2·1.0, -2·1.0) = -2.0                      not clipped
#   (1,0): ρ = 0.5, A = -1: max(+1·0.5, +1·0.8) = max(0.5, 0.8) = 0.8      clipped branch active
#   (1,1): masked
# token-mean = (-1.2 - 2.0 + 0.8)/3 = -2.4/3 = -0.8; pg_clipfrac = 2/3
# ppo_kl = mean(old - logprob) = -(ln 1.5 + ln 1 + ln 0.5)/3 = -ln(0.75)/3 ≈ 0.0958940
# ratio_mean = (1.5 + 1.0 + 0.5)/3 = 1.0
RATIOS = [[1.5, 1.0], [0.5, 7.0]]
ADV = torch.tensor([[1.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True], [True, False]])


def test_ppo_by_hand() -> None:
    logprob, old = make(RATIOS)
    loss, m = policy_loss("ppo", logprob, old, ADV, MASK, agg=TOKEN_MEAN)
    close(loss, -0.8)
    close(m["pg_loss"], -0.8)
    close(m["pg_clipfrac"], 2 / 3)
    close(m["ppo_kl"], -math.log(0.75) / 3)
    close(m["ratio_mean"], 1.0)
    # the dual clip is on by default (c = 3): -A·c = 3 > 0.8 at (1,0), so it changes nothing here
    close(m["pg_clipfrac_lower"], 0.0)
    assert set(m) == {"pg_loss", "pg_clipfrac", "ppo_kl", "ratio_mean", "pg_clipfrac_lower"}
    _, m = policy_loss("ppo", logprob, old, ADV, MASK, agg=TOKEN_MEAN, clip_ratio_c=None)
    assert set(m) == {"pg_loss", "pg_clipfrac", "ppo_kl", "ratio_mean"}
    assert all(isinstance(v, float) for v in m.values())


def test_ppo_decoupled_clip() -> None:
    # ε_low = 0.1, ε_high = 0.3 → clip to [0.9, 1.3]
    #   ρ = 1.25, A = +1: within 1.3 → -1.25, not clipped (symmetric ε = 0.2 would give -1.2)
    #   ρ = 1.5,  A = +1: max(-1.5, -1.3) = -1.3, clipped
    #   ρ = 0.85, A = -1: max(0.85, 0.9) = 0.9, clipped (symmetric ε = 0.2 would keep 0.85)
    #   ρ = 0.95, A = -1: max(0.95, 0.95) = 0.95, not clipped
    # token-mean = (-1.25 - 1.3 + 0.9 + 0.95)/4 = -0.7/4 = -0.175; pg_clipfrac = 2/4
    logprob, old = make([[1.25, 1.5], [0.85, 0.95]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)

    def fn(*tensors, **args):
        return policy_loss("ppo", *tensors, **args)

    loss, m = fn(logprob, old, adv, mask, agg=TOKEN_MEAN, clip_range_low=0.1, clip_range_high=0.3)
    close(loss, -0.175)
    close(m["pg_clipfrac"], 0.5)
    # only the high side overridden: clip to [0.8, 1.3] → (-1.25 - 1.3 + 0.85 + 0.95)/4 = -0.1875
    loss, _ = fn(logprob, old, adv, mask, agg=TOKEN_MEAN, clip_range_high=0.3)
    close(loss, -0.1875)


def test_ppo_dual_clip() -> None:
    # c = 3, ε = 0.2
    #   ρ = 5, A = -1: max(5, 1.2) = 5 → min(5, -A·c = 3) = 3                dual clip active
    #   ρ = 5, A = +1: max(-5, -1.2) = -1.2; dual clip only applies to A < 0 → -1.2
    #   ρ = 2, A = -1: max(2, 1.2) = 2 → min(2, 3) = 2                       dual clip inactive
    #   ρ = 1, A = -2: max(2, 2) = 2 → min(2, 6) = 2
    # token-mean = (3 - 1.2 + 2 + 2)/4 = 5.8/4 = 1.45; pg_clipfrac_lower = 1/4
    # pg_clipfrac (clipped branch larger): ρ=5,A=+1 only → 1/4
    logprob, old = make([[5.0, 5.0], [2.0, 1.0]])
    adv = torch.tensor([[-1.0, 1.0], [-1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = policy_loss("ppo", logprob, old, adv, mask, agg=TOKEN_MEAN)  # c = 3 default
    close(loss, 1.45)
    close(m["pg_clipfrac_lower"], 0.25)
    close(m["pg_clipfrac"], 0.25)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss("ppo", logprob, old, adv, mask, agg=TOKEN_MEAN, clip_ratio_c=0.5)


def test_ppo_gradient_analytic() -> None:
    # ∂ℓ/∂logprob = -A·ρ on the unclipped branch, 0 where the clipped branch is active.
    # token-mean over 3 tokens: (0,0) clipped → 0; (0,1) ρ=1, A=2 → -2/3; (1,0) clipped → 0; (1,1) masked → 0
    logprob, old = make(RATIOS)
    logprob.requires_grad_(True)
    loss, _ = policy_loss("ppo", logprob, old, ADV, MASK, agg=TOKEN_MEAN)
    loss.backward()
    close(logprob.grad, [[0.0, -2 / 3], [0.0, 0.0]])


def test_ppo_gradient_finite_difference() -> None:
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    logprob = (old + 0.05 * torch.randn(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(
        True
    )
    adv = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=gen) > 0.3
    agg = Aggregator("seq-mean-token-mean")

    def f(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss("ppo", lp, old, adv, mask, agg=agg)[0]

    assert torch.autograd.gradcheck(f, (logprob,))


def ppo_oracle(logprob, old, adv, mask, eps_low, eps_high) -> float:  # token-mean, plain loops
    total, n = 0.0, 0
    for i in range(len(mask)):
        for t in range(len(mask[i])):
            if not mask[i][t]:
                continue
            r = math.exp(logprob[i][t] - old[i][t])
            clipped = min(max(r, 1 - eps_low), 1 + eps_high)
            loss = max(-adv[i][t] * r, -adv[i][t] * clipped)
            if adv[i][t] < 0:  # the dual clip, c = 3 (the default)
                loss = min(loss, -adv[i][t] * 3.0)
            total += loss
            n += 1
    return total / n


@pytest.mark.parametrize("seed", range(4))
def test_ppo_matches_loop_oracle(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64)
    logprob = old + 0.4 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    loss, _ = policy_loss(
        "ppo", logprob, old, adv, mask, agg=TOKEN_MEAN, clip_range_low=0.15, clip_range_high=0.28
    )
    expected = ppo_oracle(logprob.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.15, 0.28)
    close(loss, expected, atol=1e-12)


def test_sft_loss_by_hand() -> None:
    # token-mean of -logprob over masked tokens: (1 + 2 + 3)/3 = 2
    # seq-mean-token-mean: ((1+2)/2 + 3/1)/2 = (1.5 + 3)/2 = 2.25
    logprob = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)

    def fn(*tensors, **args):
        return policy_loss("sft", *tensors, **args)

    junk = torch.full((2, 2), float("nan"))  # old logprobs and advantages are ignored
    loss, m = fn(logprob, junk, junk, MASK, agg=TOKEN_MEAN)
    close(loss, 2.0)
    assert m == {"sft_loss": pytest.approx(2.0)}
    loss2, _ = fn(logprob, junk, junk, MASK, agg=Aggregator("seq-mean-token-mean"))
    close(loss2, 2.25)
    loss.backward()  # ∂/∂logprob = -1/3 on masked tokens
    close(logprob.grad, [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])
