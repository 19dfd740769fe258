"""Mixed SFT + RL: CHORD's μ schedule, the mix and mix_chord losses by hand, exact gradient
accumulation with the parts' own counts, and the mix sample strategy (the end-to-end run with an
auxiliary buffer is a stage of tests/test_e2e.py's every-algorithm run)."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import POLICY_LOSS_FN, Aggregator
from trinity.algorithm.aggregation import LOSS_AGG_MODES
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.losses.mix import mu_schedule
from trinity.algorithm.sample_strategy import SampleContext, mix_sample_strategy
from trinity.common.experience import Experience


def test_mu_schedule_by_hand() -> None:
    # warm-up 10 steps to 0.5, cosine down to 0.1 over 10 more, then 0.1
    assert mu_schedule(5, 10, 10, 0.5, 0.1) == pytest.approx(0.25)
    assert mu_schedule(10, 10, 10, 0.5, 0.1) == pytest.approx(0.5)
    assert mu_schedule(15, 10, 10, 0.5, 0.1) == pytest.approx(0.1 + 0.4 * 0.5)  # cos(π/2) = 0
    assert mu_schedule(25, 10, 10, 0.5, 0.1) == pytest.approx(0.1)
    assert mu_schedule(3, 0, 0, 0.2, 0.2) == pytest.approx(0.2)


def two_rows(expert_lp: list[float]):
    """Row 0 a rollout (ratio 1, A = [2, 1]); row 1 an expert row with logprobs `expert_lp`."""
    logprob = torch.tensor([[-1.0, -2.0], expert_lp], dtype=torch.float64, requires_grad=True)
    old = logprob.detach().clone()
    adv = torch.tensor([[2.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    expert = torch.tensor([False, True])
    parts = {
        "usual": Aggregator("token-mean", num_tokens=2.0, num_seqs=1.0),
        "expert": Aggregator("token-mean", num_tokens=2.0, num_seqs=1.0),
    }
    inp = PolicyLossInput(logprob, old, adv, mask, expert_mask=expert, part_aggs=parts, step=15)
    return inp, logprob


def test_mix_loss_by_hand() -> None:
    # usual: PPO at ratio 1 is -A: mean(-2, -1) = -1.5; expert: mean(-log 0.5, -log 0.25)
    inp, logprob = two_rows([math.log(0.5), math.log(0.25)])
    loss, m = POLICY_LOSS_FN.get("mix")(inp, agg=Aggregator("token-mean"), mu=0.1)
    sft = (math.log(2) + math.log(4)) / 2
    assert float(loss.detach()) == pytest.approx(0.9 * -1.5 + 0.1 * sft)
    assert m["usual/pg_loss"] == pytest.approx(-1.5) and m["expert/sft_loss"] == pytest.approx(sft)
    loss.backward()
    # ∂/∂logprob: usual -0.9·A/2 = [-0.9, -0.45]; expert -0.1/2 each
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.9, -0.45], [-0.05, -0.05]],
                                                          dtype=torch.float64))  # fmt: skip


def test_mix_chord_loss_by_hand() -> None:
    # φ = p(1-p) = [0.25, 0.1875]; expert part mean(φ·(-log p)); μ at step 15 of the schedule
    # (warm-up 10 to 0.5, decay 10 to 0.1) = 0.3
    inp, _ = two_rows([math.log(0.5), math.log(0.25)])
    fn = POLICY_LOSS_FN.get("mix_chord")
    loss, m = fn(inp, agg=Aggregator("token-mean"), mu_warmup_steps=10, mu_decay_steps=10,
                 mu_peak=0.5, mu_valley=0.1)  # fmt: skip
    sft_phi = (0.25 * math.log(2) + 0.1875 * math.log(4)) / 2
    assert m["mu"] == pytest.approx(0.3)
    assert float(loss.detach()) == pytest.approx(0.7 * -1.5 + 0.3 * sft_phi)
    with pytest.raises(ValueError, match="mu_peak"):
        fn(inp, agg=Aggregator("token-mean"), mu_peak=1.5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["mix", "mix_chord"])
def test_micro_batches_with_the_parts_counts_sum_to_the_whole_batch(name: str, mode: str) -> None:
    g = torch.Generator().manual_seed(1)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    logprob = (old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) > 0.3
    expert = torch.tensor([False, True, False, False, True, True])

    def parts(rows: torch.Tensor) -> dict[str, Aggregator]:
        return {
            "usual": Aggregator(mode, float((mask & ~expert[:, None]).sum()),
                                float((~expert).sum()), norm_length=8.0),
            "expert": Aggregator(mode, float((mask & expert[:, None]).sum()),
                                 float(expert.sum()), norm_length=8.0),
        }  # fmt: skip

    def call(i):
        inp = PolicyLossInput(logprob[i], old[i], adv[i], mask[i], expert_mask=expert[i],
                              part_aggs=parts(i), step=3)  # fmt: skip
        return POLICY_LOSS_FN.get(name)(inp, agg=Aggregator(mode, norm_length=8.0))[0]

    whole = call(torch.arange(b))
    split = call(torch.tensor([0, 1, 4])) + call(torch.tensor([2, 3, 5]))
    torch.testing.assert_close(split, whole, atol=1e-12, rtol=0)
    (g_whole,) = torch.autograd.grad(whole, logprob)
    (g_split,) = torch.autograd.grad(split, logprob)
    torch.testing.assert_close(g_split, g_whole, atol=1e-12, rtol=0)


def test_mix_sample_strategy_adds_marked_experts() -> None:
    rollouts = [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=1) for _ in range(6)]
    pool = iter(Experience(tokens=torch.tensor([4, 5]), prompt_length=1) for _ in range(100))
    ctx = SampleContext(auxiliary={"sft_dataset": lambda n: [next(pool) for _ in range(n)]})
    out = mix_sample_strategy(rollouts, ctx, expert_data_ratio=0.25)  # ceil(1/3 · 6) = 2
    assert len(out) == 8 and out[:6] == rollouts
    assert [e.info.get("is_expert", False) for e in out] == [False] * 6 + [True] * 2
    assert len(mix_sample_strategy(rollouts, ctx, expert_data_ratio=0.5)) == 12  # 1:1
    with pytest.raises(ValueError, match="not configured"):
        mix_sample_strategy(rollouts, SampleContext(), expert_data_ratio=0.5)
    with pytest.raises(ValueError, match="expert_data_ratio"):
        mix_sample_strategy(rollouts, ctx, expert_data_ratio=1.0)


def test_sft_loss_agg_mode_aggregates_the_expert_part_its_own_way() -> None:
    """Trinity-RFT's `sft_loss_agg_mode`: the expert NLL over the expert part's counts in its
    own mode. Expert row: -log p = [log 2, log 4] over 2 tokens of 1 sequence: token-mean
    (log 2 + log 4) / 2, seq-mean-token-sum (log 2 + log 4) / 1."""
    total = math.log(2) + math.log(4)
    for name in ("mix", "mix_chord"):
        args = {"mu": 0.1} if name == "mix" else {"enable_phi_function": False}
        for mode, expected in (("token-mean", total / 2), ("seq-mean-token-sum", total)):
            inp, _ = two_rows([math.log(0.5), math.log(0.25)])
            loss_fn = POLICY_LOSS_FN.get(name)
            _, m = loss_fn(inp, agg=Aggregator("token-mean"), sft_loss_agg_mode=mode, **args)
            assert m["expert/sft_loss"] == pytest.approx(expected), (name, mode)
        with pytest.raises(ValueError, match="token-avg"):
            loss_fn(inp, agg=Aggregator("token-mean"), sft_loss_agg_mode="token-avg", **args)


def test_a_full_step_takes_the_planned_expert_rows_and_a_short_one_the_ratio() -> None:
    """ρ = 1/3 and train_batch_size 10: Trinity-RFT takes ceil(10/3) = 4 experts and 6
    rollouts; ceil(ρ/(1-ρ) · 6) = 3 would miss one, so a full step takes the planned 4."""
    rollouts = [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=1) for _ in range(6)]
    pool = iter(Experience(tokens=torch.tensor([4, 5]), prompt_length=1) for _ in range(100))
    aux = {"sft_dataset": lambda n: [next(pool) for _ in range(n)]}
    ctx = SampleContext(auxiliary=aux, planned_rows=(6, 4))
    assert len(mix_sample_strategy(rollouts, ctx, expert_data_ratio=1 / 3)) == 10
    short = mix_sample_strategy(rollouts[:3], ctx, expert_data_ratio=1 / 3)  # ceil(0.5 · 3) = 2
    assert len(short) == 5
