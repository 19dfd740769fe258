"""TOPR, OPMD, sPPO, GMPO (geo_mean) and DPO/IPO: hand-derived values and gradients, a loop
oracle for GMPO, and micro-batch invariance with the whole batch's counts."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN, Aggregator
from trinity.algorithm.aggregation import LOSS_AGG_MODES
from trinity.algorithm.inputs import PolicyLossInput

TOKEN_MEAN = Aggregator("token-mean")


def close(actual, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64).detach(),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def call(name, logprob, old, adv, mask=None, ref=None, agg=TOKEN_MEAN, **args):
    mask = torch.ones(logprob.shape, dtype=torch.bool) if mask is None else mask
    inp = PolicyLossInput(logprob, old, adv, mask, ref_logprob=ref)
    return POLICY_LOSS_FN.get(name)(inp, agg=agg, **args)


# one row, two tokens: ratios π/π_old = 2.0 and 0.5; A = +1 then -2
LP = [[math.log(0.5), math.log(0.2)]]
OLD = torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=torch.float64)
ADV = torch.tensor([[1.0, -2.0]], dtype=torch.float64)


def test_topr_by_hand() -> None:
    # α = [1 (A > 0), clip(0.5, 0, 1) = 0.5]; ℓ = -α·A·log π = [-log 0.5, 0.5·2·log 0.2]
    logprob = leaf(LP)
    loss, m = call("topr", logprob, OLD, ADV)
    close(loss, (-math.log(0.5) + math.log(0.2)) / 2)
    loss.backward()
    close(logprob.grad, [[-0.5, 0.5]])  # -α·A / 2 tokens
    close(m["topr_alpha"], 0.75)
    close(m["ratio_mean"], 1.25)
    # a threshold of 1.5 makes token 0 "negative" too: α_0 = clip(2, 0, 1) = 1 (unchanged here)
    _, m = call("topr", leaf(LP), OLD, ADV, advantage_threshold=1.5)
    close(m["topr_alpha"], 0.75)


def test_opmd_by_hand() -> None:
    # ℓ = -A·log π / (1 + τ), τ = 1: [-log 0.5 / 2, 2·log 0.2 / 2]
    logprob = leaf(LP)
    loss, _ = call("opmd", logprob, OLD, ADV, tau=1.0)
    close(loss, (-math.log(0.5) / 2 + math.log(0.2)) / 2)
    loss.backward()
    close(logprob.grad, [[-0.25, 0.5]])  # -A / (1 + τ) / 2 tokens
    with pytest.raises(ValueError, match="tau"):
        call("opmd", leaf(LP), OLD, ADV, tau=-1.0)


def test_sppo_by_hand() -> None:
    # ratios 2.0 and 0.5 lie outside [1/1.3, 1.3]: no loss, no gradient
    logprob = leaf(LP)
    loss, m = call("sppo", logprob, OLD, ADV)
    close(loss, 0.0)
    close(m["pg_clipfrac"], 1.0)
    # ratio 1.1 inside: ℓ = -A·log 1.1, ∇ = -A / 2 tokens
    logprob = (OLD + math.log(1.1)).clone().requires_grad_()
    loss, m = call("sppo", logprob, OLD, ADV)
    close(loss, (-math.log(1.1) + 2 * math.log(1.1)) / 2)
    loss.backward()
    close(logprob.grad, [[-0.5, 1.0]])
    close(m["pg_clipfrac"], 0.0)


def test_geo_mean_by_hand() -> None:
    # row 0, A = +1, d = [0.5, -0.1, 0.2]: d̃ = [min(0.5, 0.4), -0.1, 0.2] → ρ̄ = e^(0.5/3),
    #   ℓ_0 = -ρ̄_0; ∇ on the unclipped tokens 1, 2: -ρ̄_0 / 3, over N = 2 rows
    # row 1, A = -1, d = [0.5, -0.6, ·]: d̃ = [max(0.5, 0.4), max(-0.6, -0.4)] = [0.5, -0.4]
    #   → ρ̄ = e^0.05, ℓ_1 = +ρ̄_1; ∇ on token 0 (unclipped): ρ̄_1 / 2, over 2 rows
    old = torch.zeros(2, 3, dtype=torch.float64)
    logprob = leaf([[0.5, -0.1, 0.2], [0.5, -0.6, 9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    r0, r1 = math.exp(0.5 / 3), math.exp(0.05)
    loss, m = call("geo_mean", logprob, old, adv, mask)
    close(loss, (-r0 + r1) / 2, atol=1e-12)
    loss.backward()
    close(logprob.grad, [[0.0, -r0 / 6, -r0 / 6], [r1 / 4, 0.0, 0.0]], atol=1e-12)
    # verl's definitions: d outside [-0.4, 0.4], split by the sign of A, over the 5 masked tokens
    close(m["pg_clipfrac"], 1 / 5)  # A > 0: token 0 of row 0 (0.5)
    close(m["pg_clipfrac_lower"], 2 / 5)  # A < 0: both tokens of row 1 (0.5 and -0.6)


def test_geo_mean_matches_a_per_sequence_loop() -> None:
    g = torch.Generator().manual_seed(4)
    b, t, eps = 5, 6, 0.4
    old = -torch.rand(b, t, generator=g, dtype=torch.float64)
    logprob = (old + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t)
    mask = torch.rand(b, t, generator=g) > 0.3
    loss, _ = call("gmpo", logprob, old, adv, mask)
    total, rows = 0.0, 0
    for i in range(b):
        d = [float(logprob.detach()[i, k] - old[i, k]) for k in range(t) if mask[i, k]]
        rows += 1
        if not d:
            continue
        a = float(adv[i, 0])
        pessimistic = [min(x, max(-eps, min(eps, x))) if a > 0 else max(x, max(-eps, min(eps, x)))
                       for x in d]  # fmt: skip
        total += -a * math.exp(sum(pessimistic) / len(pessimistic))
    close(loss, total / rows, atol=1e-12)


def test_dpo_by_hand() -> None:
    # chosen: log π - log π_ref = (-1 + 1.5) + (-1 + 1) = 0.5; rejected: (-2 + 1) + (-1 + 1) = -1
    logprob = leaf([[-1.0, -1.0], [-2.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    zeros = torch.zeros(2, 2, dtype=torch.float64)
    h, beta = 1.5, 0.1

    def softplus(x: float) -> float:  # -log σ(-x)
        return math.log1p(math.exp(x))

    loss, m = call("dpo", logprob, zeros, zeros, ref=ref, beta=beta)
    close(loss, softplus(-beta * h), atol=1e-12)
    loss.backward()
    s = beta / (1 + math.exp(beta * h))  # -dℓ/dh = β·σ(-βh)
    close(logprob.grad, [[-s, -s], [s, s]], atol=1e-12)
    close(m["chosen_reward"], 0.05)
    close(m["rejected_reward"], -0.1)
    close(m["reward_margin"], 0.15)
    close(m["reward_accuracy"], 1.0)
    # label smoothing ε = 0.1: 0.9·softplus(-βh) + 0.1·softplus(βh)
    loss, _ = call("dpo", leaf([[-1.0, -1.0], [-2.0, -1.0]]), zeros, zeros, ref=ref,
                   label_smoothing=0.1)  # fmt: skip
    close(loss, 0.9 * softplus(-0.15) + 0.1 * softplus(0.15), atol=1e-12)
    # IPO: per-token means, h = 0.5/2 - (-1/2) = 0.75; (0.75 - 1/(2β))² = (0.75 - 5)²
    loss, _ = call("dpo", leaf([[-1.0, -1.0], [-2.0, -1.0]]), zeros, zeros, ref=ref,
                   loss_type="ipo")  # fmt: skip
    close(loss, (0.75 - 5.0) ** 2, atol=1e-12)


def test_dpo_refuses_bad_input() -> None:
    lp, z = leaf([[-1.0], [-2.0], [-1.0]]), torch.zeros(3, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="pairs"):
        call("dpo", lp, z, z, ref=z)
    lp2, z2 = leaf([[-1.0], [-2.0]]), torch.zeros(2, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs ref_logprob"):
        call("dpo", lp2, z2, z2)
    for kw, msg in [({"beta": 0.0}, "beta"), ({"label_smoothing": 0.5}, "label_smoothing"),
                    ({"loss_type": "hinge"}, "loss_type")]:  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            call("dpo", lp2, z2, z2, ref=z2, **kw)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["topr", "opmd", "sppo", "geo_mean", "dpo"])
def test_micro_batches_with_global_counts_sum_to_the_whole_batch(name: str, mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    logprob = (old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) > 0.3
    whole, _ = call(name, logprob, old, adv, mask, ref, agg=Aggregator(mode, norm_length=8.0))
    agg = Aggregator(mode, float(mask.sum()), float(b), norm_length=8.0)
    # micro-batches keep DPO's (chosen, rejected) pairs (0, 1), (2, 3), (4, 5) together
    parts = [
        call(name, logprob[i], old[i], adv[i], mask[i], ref[i], agg=agg)[0]
        for i in ([0, 1, 4, 5], [2, 3])
    ]
    close(sum(parts), float(whole.detach()), atol=1e-12)
    (g_whole,) = torch.autograd.grad(whole, logprob)
    (g_parts,) = torch.autograd.grad(sum(parts), logprob)
    close(g_parts, g_whole, atol=1e-12)


def test_dpo_pairs_count_whole_and_a_pair_with_no_trained_token_is_no_pair() -> None:
    """Pair 0 is the by-hand pair above (ℓ = softplus(-β·1.5)); pair 1's rejected row is fully
    masked (h = 0.5 - 0: ℓ = softplus(-β·0.5)), so it is still one whole pair; pair 2 has no
    trained token: it trains nothing and is no pair. Loss = (ℓ_0 + ℓ_1) / 2."""
    from types import SimpleNamespace

    from trinity.trainer.batch import Batch

    pair = [[-1.0, -1.0], [-2.0, -1.0]]
    ref_pair = [[-1.5, -1.0], [-1.0, -1.0]]
    logprob = leaf(pair * 3)
    ref = torch.tensor(ref_pair * 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0], [0, 0], [0, 0]], dtype=torch.bool)
    n = Batch.num_seqs(SimpleNamespace(response_mask=mask), unit=2)
    assert n == 4  # two pairs of two rows; the row-by-row count would be 3
    zeros = torch.zeros(6, 2, dtype=torch.float64)
    beta = 0.1

    def softplus(x: float) -> float:
        return math.log1p(math.exp(x))

    agg = Aggregator("token-mean", float(mask.sum()), float(n))
    loss, _ = call("dpo", logprob, zeros, zeros, mask=mask, ref=ref, agg=agg, beta=beta)
    close(loss, (softplus(-beta * 1.5) + softplus(-beta * 0.5)) / 2, atol=1e-12)
