"""GSPO, CISPO, SAPO, importance sampling and REINFORCE: values and gradients by hand, micro-batch
invariance, and the records that select them."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN, Aggregator
from trinity.algorithm.aggregation import LOSS_AGG_MODES
from trinity.algorithm.algorithms import resolve_algorithm
from trinity.algorithm.inputs import PolicyLossInput

TOKEN_MEAN = Aggregator("token-mean")


def policy_loss(name: str, logprob, old, adv, mask, **args):
    """Calls the policy loss `name` on the four tensors every loss reads."""
    return POLICY_LOSS_FN.get(name)(PolicyLossInput(logprob, old, adv, mask), **args)


SEQ_MEAN = Aggregator("seq-mean-token-mean")


def close(actual: torch.Tensor | float, expected: float | list, atol: float = 1e-7) -> None:
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# The shared 2x2 case: old_logprob = -1 everywhere; token ratios 1.5, 1.0 / 0.5 and a masked,
# wild 7.0; advantages +1, +2 / -1 (and -1 on the masked token).
#   logprob = -1 + ln ρ: -1 + 0.4054651081 = -0.5945348919, -1, -1 - 0.6931471806 = -1.6931471806
OLD = torch.full((2, 2), -1.0, dtype=torch.float64)
RATIOS = [[1.5, 1.0], [0.5, 7.0]]
ADV = torch.tensor([[1.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True], [True, False]])


def shared_case() -> torch.Tensor:
    return leaf((OLD + torch.tensor(RATIOS, dtype=torch.float64).log()).tolist())


# -- GSPO ---------------------------------------------------------------------------------------
# Log-ratios: row 0 (0.2, 0.0) → mean 0.1 → s_0 = e^0.1 = 1.1051709181; row 1 (-0.3, masked 5.0)
# → mean -0.3 → s_1 = e^-0.3 = 0.7408182207. A: row 0 +1, row 1 -2. ε = 0.05: clip to [0.95, 1.05].
#   row 0 tokens: max(-1.10517, -1.05) = -1.05 (clipped branch)
#   row 1 token:  max(2·0.740818, 2·0.95) = max(1.481636, 1.9) = 1.9 (clipped branch)
# seq-mean-token-mean = (-1.05 + 1.9)/2 = 0.425; token-mean = (-1.05 - 1.05 + 1.9)/3 = -0.2/3
# ppo_kl = -(0.2 + 0 - 0.3)/3 = 0.1/3; ppo_kl_seq = -(0.1 - 0.3)/2 = 0.1
# seq_ratio_mean = (1.1051709181 + 0.7408182207)/2 = 0.9229945694
GSPO_LOG_RATIOS = [[0.2, 0.0], [-0.3, 5.0]]
GSPO_ADV = torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64)


def gspo_case() -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64)
    return leaf((old + torch.tensor(GSPO_LOG_RATIOS, dtype=torch.float64)).tolist()), old


def test_gspo_by_hand_clipped() -> None:
    logprob, old = gspo_case()
    loss, m = policy_loss("gspo", logprob, old, GSPO_ADV, MASK, agg=SEQ_MEAN, clip_range=0.05)
    close(loss, 0.425)
    close(m["pg_clipfrac"], 1.0)
    close(m["ppo_kl"], 0.1 / 3)
    close(m["ppo_kl_seq"], 0.1)
    close(m["seq_ratio_mean"], (math.exp(0.1) + math.exp(-0.3)) / 2)
    loss.backward()
    close(logprob.grad, [[0.0, 0.0], [0.0, 0.0]])  # every token on its clipped branch
    loss_tm, _ = policy_loss("gspo", *gspo_case(), GSPO_ADV, MASK, agg=TOKEN_MEAN, clip_range=0.05)
    close(loss_tm, -0.2 / 3)


def test_gspo_gradient_is_the_sequence_ratio_times_each_token_s_score() -> None:
    # unclipped (ε = 10): ∂ℓ_it/∂logprob_it = -A_i·s_i, so token-mean over 3 tokens gives
    #   row 0: -1·1.1051709181/3 = -0.3683903060 (both tokens); row 1: 2·0.7408182207/3 = 0.4938788138
    # a token's gradient does not depend on the other tokens' ratios beyond s_i (GSPO-token)
    logprob, old = gspo_case()
    loss, m = policy_loss("gspo", logprob, old, GSPO_ADV, MASK, agg=TOKEN_MEAN, clip_range=10)
    loss.backward()
    s0, s1 = math.exp(0.1), math.exp(-0.3)
    close(logprob.grad, [[-s0 / 3, -s0 / 3], [2 * s1 / 3, 0.0]])
    close(loss, (-s0 - s0 + 2 * s1) / 3)
    close(m["pg_clipfrac"], 0.0)


def test_gspo_matches_a_per_sequence_loop() -> None:
    g = torch.Generator().manual_seed(3)
    b, t = 5, 7
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logprob = (old + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0] = False  # a row with no trained token
    loss, _ = policy_loss(
        "gspo", logprob, old, adv, mask, agg=SEQ_MEAN, clip_range_low=0.05, clip_range_high=0.08
    )
    total = torch.zeros((), dtype=torch.float64)
    for i in range(b):  # the paper's sequence-level objective, one sequence at a time
        idx = mask[i].nonzero().flatten().tolist()
        if not idx:
            continue
        s = torch.exp(sum(logprob[i, k] - old[i, k] for k in idx) / len(idx))
        a = adv[i, 0]
        total = total + torch.maximum(-a * s, -a * s.clamp(0.95, 1.08))
    oracle = total / (b - 1)  # the row with no trained token is no sequence of the mean
    close(loss, float(oracle.detach()), atol=1e-12)
    (grad,) = torch.autograd.grad(loss, logprob)
    (want,) = torch.autograd.grad(oracle, logprob)
    close(grad, want.tolist(), atol=1e-12)


# -- CISPO --------------------------------------------------------------------------------------
# weights clip(ρ, 1 - 1.0, 1 + 0.28) = clip(ρ, 0, 1.28): 1.28, 1.0, 0.5
#   ℓ = -w·A·logprob: -1.28·1·(-0.5945348919) = 0.7610046616; -1·2·(-1) = 2.0;
#                     -0.5·(-1)·(-1.6931471806) = -0.8465735903
# token-mean = (0.7610046616 + 2.0 - 0.8465735903)/3 = 0.6381436904
# ∂/∂logprob = -w·A/3: -1.28/3, -2/3, +0.5/3 (the clipped token keeps its gradient, unlike PPO)
def test_cispo_by_hand() -> None:
    logprob = shared_case()
    loss, m = policy_loss("cispo", logprob, OLD, ADV, MASK, agg=TOKEN_MEAN)
    close(loss, 0.6381436904)
    close(m["is_weight_mean"], (1.28 + 1.0 + 0.5) / 3)
    close(m["unmasked_frac"], 1.0)
    close(m["pg_clipfrac"], 1 / 3)  # only ρ = 1.5 lies outside [0, 1.28]
    close(m["ppo_kl"], -math.log(0.75) / 3)
    loss.backward()
    close(logprob.grad, [[-1.28 / 3, -2 / 3], [0.5 / 3, 0.0]])


def test_cispo_mask_drops_tokens_past_the_trust_region() -> None:
    # δ_high 0.28, δ_low 0.2: (0,0) A > 0 and ρ 1.5 > 1.28 → dropped; (1,0) A < 0 and
    # ρ 0.5 < 0.8 → dropped; only (0,1) stays: loss = 2.0/3, unmasked 1/3
    logprob = shared_case()
    loss, m = policy_loss(
        "cispo",
        logprob,
        OLD,
        ADV,
        MASK,
        agg=TOKEN_MEAN,
        enable_mask_clip=True,
        mask_clip_range_low=0.2,
    )
    close(loss, 2.0 / 3)
    close(m["unmasked_frac"], 1 / 3)
    loss.backward()
    close(logprob.grad, [[0.0, -2 / 3], [0.0, 0.0]])


# -- SAPO ---------------------------------------------------------------------------------------
# τ_pos = 1, τ_neg = 2; f(r) = (4/τ)·σ(τ(r - 1)); σ(0.5) = 0.6224593312, σ(-1) = 0.2689414214
#   (0,0) A = +1, r = 1.5: f = 4·0.6224593312 = 2.4898373250, ℓ = -2.4898373250
#   (0,1) A = +2, r = 1.0: f = 4·0.5 = 2,                     ℓ = -4
#   (1,0) A = -1, r = 0.5: f = 2·σ(-1) = 0.5378828427,        ℓ = +0.5378828427
# token-mean = -5.9519544823/3 = -1.9839848274; gate_mean = 5.0277201677/3 = 1.6759067226
# ∂ℓ/∂logprob = -A·4σ(1-σ)·r:
#   (0,0) -4·0.6224593312·0.3775406688·1.5 = -1.4100222732
#   (0,1) -2·4·0.25·1 = -2 (the plain policy gradient on-policy)
#   (1,0) +4·0.2689414214·0.7310585786·0.5 = 0.3932238664
def test_sapo_by_hand() -> None:
    logprob = shared_case()
    loss, m = policy_loss("sapo", logprob, OLD, ADV, MASK, agg=TOKEN_MEAN, tau_pos=1.0, tau_neg=2.0)
    close(loss, -1.9839848274)
    close(m["gate_mean"], 1.6759067226)
    close(m["ratio_mean"], 1.0)
    loss.backward()
    close(logprob.grad, [[-1.4100222732 / 3, -2 / 3], [0.3932238664 / 3, 0.0]])


def test_sapo_refuses_a_non_positive_temperature() -> None:
    with pytest.raises(ValueError, match="tau_neg=0"):
        policy_loss("sapo", shared_case(), OLD, ADV, MASK, agg=TOKEN_MEAN, tau_neg=0)


# -- importance sampling and REINFORCE ----------------------------------------------------------
# importance_sampling: ℓ = -A·ρ: -1.5, -2, +0.5 → token-mean -1.0; ∂ = -A·ρ/3: -0.5, -2/3, 1/6
# reinforce: ℓ = -A·logprob: 0.5945348919, 2, -1.6931471806 → 0.9013877113/3 = 0.3004625704;
#            ∂ = -A/3: -1/3, -2/3, 1/3
def test_importance_sampling_and_reinforce_by_hand() -> None:
    logprob = shared_case()
    loss, m = policy_loss("importance_sampling", logprob, OLD, ADV, MASK, agg=TOKEN_MEAN)
    close(loss, -1.0)
    close(m["ratio_mean"], 1.0)
    loss.backward()
    close(logprob.grad, [[-0.5, -2 / 3], [0.5 / 3, 0.0]])
    logprob = shared_case()
    loss, m = policy_loss("reinforce", logprob, OLD, ADV, MASK, agg=TOKEN_MEAN)
    close(loss, 0.3004625704)
    close(m["ppo_kl"], -math.log(0.75) / 3)
    loss.backward()
    close(logprob.grad, [[-1 / 3, -2 / 3], [1 / 3, 0.0]])


# -- every new loss ------------------------------------------------------------------------------
NEW = ["gspo", "cispo", "sapo", "importance_sampling", "reinforce"]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", NEW)
def test_micro_batches_with_global_counts_sum_to_the_whole_batch(name: str, mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    logprob = (old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) > 0.3
    whole, _ = policy_loss(name, logprob, old, adv, mask, agg=Aggregator(mode, norm_length=8.0))
    agg = Aggregator(mode, float(mask.sum()), float(b), norm_length=8.0)
    parts = [
        policy_loss(name, logprob[i], old[i], adv[i], mask[i], agg=agg)[0]
        for i in ([0, 3, 4], [1, 2, 5])
    ]
    close(sum(parts).detach(), float(whole.detach()), atol=1e-12)
    (g_whole,) = torch.autograd.grad(whole, logprob)
    (g_parts,) = torch.autograd.grad(sum(parts), logprob)
    close(g_parts, g_whole.tolist(), atol=1e-12)


@pytest.mark.parametrize(
    ("algorithm_type", "loss", "agg"),
    [("gspo", "gspo", "seq-mean-token-mean"), ("cispo", "cispo", "token-mean"),
     ("sapo", "sapo", "seq-mean-token-mean")],
)  # fmt: skip
def test_one_line_selects_the_algorithm(algorithm_type: str, loss: str, agg: str) -> None:
    class Cfg:
        pass

    cfg = Cfg()
    cfg.algorithm_type = algorithm_type  # type: ignore[attr-defined]
    r = resolve_algorithm(cfg)
    assert r.policy_loss_fn is POLICY_LOSS_FN.get(loss)
    assert r.spec.advantage_fn == "grpo" and r.spec.kl_loss_fn == "k2" and r.use_reference
    assert r.loss_agg_mode == agg
