"""Clip_B and Clip_V (entropy-control token filters on GRPO's advantage), REC's advantage and
policy loss: hand-derived values, loop oracles of the token filters, and the trainer's token
statistics against full logits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN, Aggregator
from trinity.algorithm.inputs import AdvantageInput, PolicyLossInput, TokenFilter
from trinity.common.logits import token_stats_from_logits

EPS = 1e-6


def close(actual, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual).double(),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


def stats_input(rewards, groups, entropy, nec=None, logprob=None) -> AdvantageInput:
    entropy = torch.tensor(entropy)
    mask = torch.ones_like(entropy, dtype=torch.bool)
    return AdvantageInput.from_outcomes(
        torch.tensor(rewards),
        torch.tensor(groups),
        mask,
        logprob=torch.zeros_like(entropy) if logprob is None else torch.tensor(logprob),
        entropy=entropy,
        nec=None if nec is None else torch.tensor(nec),
    )


# -- token statistics -----------------------------------------------------------------------------


def test_token_stats_by_hand() -> None:
    # logits [0, ln 2]: p = [1/3, 2/3]; H = (1/3)ln 3 + (2/3)ln(3/2) = 0.6365142
    # NEC = (1/9)(H + ln(1/3)) + (4/9)(H + ln(2/3)) = (5/9)H - (1/9)ln 3 - (4/9)ln(3/2)
    h = math.log(3) / 3 + 2 / 3 * math.log(1.5)
    nec = 5 / 9 * h - math.log(3) / 9 - 4 / 9 * math.log(1.5)
    lp, ent, n = token_stats_from_logits(torch.tensor([[0.0, math.log(2)]]), torch.tensor([1]))
    close(lp, [math.log(2 / 3)])
    close(ent, [h])
    close(n, [nec])


def test_trainer_token_stats_match_full_logits(tiny_model_dir) -> None:
    from trinity.common.experience import EID, Experience
    from trinity.trainer.batch import collate
    from trinity.trainer.logprobs import response_token_stats

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    exps = [
        Experience(
            tokens=torch.randint(3, vocab, (p + r,), generator=g),
            prompt_length=p,
            logprobs=-torch.ones(r),
            reward=0.0,
            eid=EID(task=0, run=i),
        )
        for i, (p, r) in enumerate([(3, 4), (5, 2)])
    ]
    batch = collate(exps, pad_id=0)
    lp, ent, nec = response_token_stats(model, batch, chunk_size=3)
    for i, e in enumerate(exps):  # the reference: the full logits of each sequence alone
        with torch.no_grad():
            logits = model(e.tokens[None]).logits[0, e.prompt_length - 1 : -1]  # [r, V]
        logp = torch.log_softmax(logits.double(), -1)
        p = logp.exp()
        h = -(p * logp).sum(-1)
        r = len(e.tokens) - e.prompt_length
        close(lp[i, :r], logp.gather(-1, e.tokens[e.prompt_length :, None]).squeeze(-1), 1e-5)
        close(ent[i, :r], h, 1e-5)
        close(nec[i, :r], (p * p * (h[:, None] + logp)).sum(-1), 1e-5)
        assert (lp[i, r:] == 0).all() and (ent[i, r:] == 0).all()


# -- Clip_B ---------------------------------------------------------------------------------------


def clipb_oracle(inp: AdvantageInput, adv: torch.Tensor, mu: float) -> torch.Tensor:
    """Trinity-RFT's Clip_B filter, token by token: S over trained tokens, population std."""
    n, t = adv.shape
    cells = [(i, j) for i in range(n) for j in range(t) if inp.response_mask[i, j]]
    s = {c: math.exp(inp.logprob[c]) * (inp.entropy[c] + inp.logprob[c]) for c in cells}
    mean = sum(s.values()) / len(cells)
    std = math.sqrt(sum((v - mean) ** 2 for v in s.values()) / len(cells))
    keep = torch.ones(n, t, dtype=torch.bool)
    if std >= 1e-12:
        for c in cells:
            if adv[c] < 0 and s[c] - mean < -mu * std:
                keep[c] = False
    return keep


def test_clipb_by_hand() -> None:
    # logprob 0 (p = 1): S = H. Rewards [1, 0]: A = ±0.5/(√0.5 + ε).
    # S = [[0, 0, -10], [0, 0, -10]]: mean -10/3, population var (4·(10/3)² + 2·(20/3)²)/6
    # = 200/9, std 4.714; z(-10) = -20/3 = -6.667 < -1.0·4.714: dropped where A < 0 only.
    inp = stats_input([1.0, 0.0], [0, 0], [[0.0, 0.0, -10.0], [0.0, 0.0, -10.0]])
    adv, ret, filt = ADVANTAGE_FN.get("clipb")(inp, mu=1.0)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(adv, [[a] * 3, [-a] * 3])
    torch.testing.assert_close(adv, ret)
    assert isinstance(filt, TokenFilter)
    assert filt.keep.tolist() == [[True] * 3, [True, True, False]]
    close(
        [filt.metrics[k] for k in ("frac_clipped", "frac_clipped_pos", "frac_clipped_neg")],
        [1 / 6, 0.0, 1 / 3],
    )
    close([filt.metrics["ES"], filt.metrics["varS"]], [-10 / 3, 200 / 9], 1e-4)
    # mu = 1.5: -1.5·4.714 = -7.07 < -6.667: nothing dropped
    _, _, filt = ADVANTAGE_FN.get("clipb")(inp, mu=1.5)
    assert filt.keep.all()
    # all S equal: σ_S = 0, every token kept
    flat = stats_input([1.0, 0.0], [0, 0], [[1.0, 1.0], [1.0, 1.0]])
    assert ADVANTAGE_FN.get("clipb")(flat)[2].keep.all()
    # a batch with no positive or negative token (equal rewards: A = 0) reports 0 dropped of none
    even = stats_input([1.0, 1.0], [0, 0], [[0.0, -10.0], [0.0, 0.0]])
    m = ADVANTAGE_FN.get("clipb")(even, mu=0.1)[2].metrics
    assert (m["frac_clipped"], m["frac_clipped_pos"], m["frac_clipped_neg"]) == (0.0, 0.0, 0.0)


def test_clipb_matches_a_token_loop() -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        n, t = 8, 6
        lp = -torch.rand(n, t, generator=g) * 3
        inp = AdvantageInput.from_outcomes(
            torch.randint(0, 2, (n,), generator=g).float(),
            torch.arange(n) // 4,
            torch.rand(n, t, generator=g) > 0.2,
            logprob=lp,
            entropy=torch.rand(n, t, generator=g) * 2,
        )
        adv, _, filt = ADVANTAGE_FN.get("clipb")(inp, mu=0.5)
        assert filt.keep.tolist() == clipb_oracle(inp, adv, 0.5).tolist()
        assert not filt.keep[adv > 0].logical_not().any()  # positive tokens always kept


def test_clipb_needs_token_stats() -> None:
    inp = AdvantageInput.from_outcomes(
        torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 2, dtype=torch.bool)
    )
    with pytest.raises(ValueError, match="clipb needs logprob"):
        ADVANTAGE_FN.get("clipb")(inp)
    assert ADVANTAGE_FN.get("clipb").token_stats and ADVANTAGE_FN.get("clipv").token_stats


# -- Clip_V ---------------------------------------------------------------------------------------


def test_clipv_by_hand_with_the_cap() -> None:
    # entropy 0 and logprob 0: S = 0, D = NEC. Rewards [1, 0]: row 0 positive, row 1 negative.
    # D = [[5, 0, 0], [4, 3, 0]]: mean 2, population var (9+4+4+4+1+4)/6 = 26/6, σ_D = 2.0817.
    # mu = 1: candidates are negative tokens with D > 2.0817: 4 and 3 (the positive 5 stays).
    nec = [[5.0, 0.0, 0.0], [4.0, 3.0, 0.0]]
    inp = stats_input([1.0, 0.0], [0, 0], [[0.0] * 3] * 2, nec=nec)
    clipv = ADVANTAGE_FN.get("clipv")
    # max_frac 0.5: cap = max(⌊0.5·6⌋, 1) = 3 ≥ 2, both dropped
    _, _, filt = clipv(inp, mu=1.0, max_frac=0.5)
    assert filt.keep.tolist() == [[True] * 3, [False, False, True]]
    close(filt.metrics["stdD"], math.sqrt(26 / 6))
    close(filt.metrics["frac_clipped_neg"], 2 / 3)
    # max_frac 0.2: cap = max(⌊1.2⌋, 1) = 1: only the largest D (4) dropped
    _, _, filt = clipv(inp, mu=1.0, max_frac=0.2)
    assert filt.keep.tolist() == [[True] * 3, [False, True, True]]
    # the default max_frac 1e-4: cap = 1 as well
    assert clipv(inp, mu=1.0)[2].keep.tolist() == [[True] * 3, [False, True, True]]
    # mu = 2: threshold 4.16, no negative token above it
    assert clipv(inp, mu=2.0, max_frac=0.5)[2].keep.all()
    with pytest.raises(ValueError, match="clipv needs nec"):
        clipv(stats_input([1.0, 0.0], [0, 0], [[0.0]] * 2))


def test_clipv_d_uses_s_of_the_sampled_token() -> None:
    # rewards [0, 0, 2]: rows 0 and 1 negative, row 2 positive. Row 0: p = e^-1, H = 2:
    # S = e^-1·(2 - 1) = 0.3679, NEC 0 → D = -0.3679. Row 1: S = 0, NEC = 1 → D = 1. Row 2: D = 0.
    inp3 = AdvantageInput.from_outcomes(
        torch.tensor([0.0, 0.0, 2.0]),
        torch.tensor([0, 0, 0]),
        torch.ones(3, 1, dtype=torch.bool),
        logprob=torch.tensor([[-1.0], [0.0], [0.0]]),
        entropy=torch.tensor([[2.0], [0.0], [0.0]]),
        nec=torch.tensor([[0.0], [1.0], [0.0]]),
    )
    # D = [-0.3679, 1, 0]: mean 0.2107, var ((0.5786)² + (0.7893)² + (0.2107)²)/3 = 0.3340,
    # σ 0.5780; row 1 (negative, D = 1 > 0.5780) is dropped, row 0 is not (D is not centred)
    _, _, filt = ADVANTAGE_FN.get("clipv")(inp3, mu=1.0, max_frac=1.0)
    assert filt.keep[:, 0].tolist() == [True, False, True]
    close(filt.metrics["stdD"], 0.5780, 1e-4)


def test_a_token_filter_reaches_the_trainers_mask(tmp_path, tiny_model_dir) -> None:
    """A train step with clipb: its dropped tokens leave the response mask the losses see, and
    its metrics are reported."""
    from tests.test_trainer import experiences, make_config
    from trinity.trainer.trainer import Trainer

    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6,
        algo="kl_loss_fn: none, advantage_fn: clipb, advantage_fn_args: {mu: 0.5}",
    )  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=1)
    vocab = trainer.model.config.vocab_size
    seen = {}
    fn = trainer.algo.advantage_fn

    def capture(inp, **kw):
        out = fn(inp, **kw)
        seen["keep"], seen["mask"] = out[2].keep, inp.response_mask
        seen["entropy"] = inp.entropy
        return out

    capture.token_stats = True  # type: ignore[attr-defined]
    trainer.algo = dataclasses.replace(trainer.algo, advantage_fn=capture)
    masks = []
    loss_fn = trainer.algo.policy_loss_fn

    def loss_capture(inp, **kw):
        masks.append(inp.action_mask)
        return loss_fn(inp, **kw)

    trainer.algo = dataclasses.replace(trainer.algo, policy_loss_fn=loss_capture)
    metrics = trainer.train_step(experiences(vocab))
    assert seen["entropy"] is not None and (seen["entropy"][seen["mask"]] > 0).all()
    dropped = seen["mask"] & ~seen["keep"]
    assert dropped.any(), "mu = 0.5 should drop some negative-advantage token"
    assert masks[0].tolist() == (seen["mask"] & seen["keep"]).tolist()
    assert metrics["train/advantage/frac_clipped"] == pytest.approx(
        float(dropped.sum() / seen["mask"].sum())
    )


# -- REC advantage --------------------------------------------------------------------------------


def rec_first_col(rewards, groups, **args) -> torch.Tensor:
    n = len(rewards)
    inp = AdvantageInput.from_outcomes(
        torch.tensor(rewards), torch.tensor(groups), torch.ones(n, 1, dtype=torch.bool)
    )
    adv, ret = ADVANTAGE_FN.get("rec")(inp, **args)
    torch.testing.assert_close(adv, ret)
    return adv[:, 0]


def test_rec_advantage_by_hand() -> None:
    # group [1, 0, 0, 0]: mean 0.25 → [0.75, -0.25, -0.25, -0.25]; a group of one [3]: 3
    close(rec_first_col([1.0, 0.0, 0.0, 0.0, 3.0], [0, 0, 0, 0, 1]), [0.75, -0.25, -0.25, -0.25, 3])
    # std_normalize: population std of [1, 0, 0, 0] = √(3/16) = 0.4330
    s = math.sqrt(3 / 16) + EPS
    close(
        rec_first_col([1.0, 0.0, 0.0, 0.0], [0] * 4, std_normalize=True),
        [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s],
    )


def test_rec_balance_drop() -> None:
    # 1 positive, 3 negatives: 2 negatives dropped (A = 0); the kept [1, 0] have mean 0.5
    torch.manual_seed(0)
    out = rec_first_col([1.0, 0.0, 0.0, 0.0], [0] * 4, drop="balance").tolist()
    assert out[0] == pytest.approx(0.5)
    assert sorted(out[1:]) == pytest.approx([-0.5, 0.0, 0.0])
    # population std of the kept [1, 0] is 0.5
    out = rec_first_col([1.0, 0.0, 0.0, 0.0], [0] * 4, drop="balance", std_normalize=True)
    assert out[0].item() == pytest.approx(0.5 / (0.5 + EPS))
    # more positives than negatives: nothing dropped
    close(rec_first_col([1.0, 1.0, 0.0], [0] * 3, drop="balance"), [1 / 3, 1 / 3, -2 / 3])
    with pytest.raises(ValueError, match="drop"):
        rec_first_col([1.0], [0], drop="all")


# -- REC policy loss ------------------------------------------------------------------------------

# ratios r = [0.7, 0.7, 1.3, 1.3] (old logprob 0, logprob ln r), advantages [1, -1, 1, -1]
R = [0.7, 0.7, 1.3, 1.3]
A = [1.0, -1.0, 1.0, -1.0]


def rec_loss(**args):
    lp = torch.tensor([[math.log(r) for r in R]], requires_grad=True)
    inp = PolicyLossInput(
        lp, torch.zeros(1, 4), torch.tensor([A]), torch.ones(1, 4, dtype=torch.bool)
    )
    loss, metrics = POLICY_LOSS_FN.get("rec")(inp, agg=Aggregator("token-mean"), **args)
    loss.backward()
    return loss, lp.grad[0], metrics


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        ({"clip_mode": "none"}, [1, 1, 1, 1]),
        # two-side [0.8, 1.2]: every ratio outside
        ({"clip_mode": "two-side"}, [0, 0, 0, 0]),
        # one-side: A ≥ 0 needs r ≤ 1.2 (t0 yes, t2 no); A ≤ 0 needs r ≥ 0.8 (t1 no, t3 yes)
        ({"clip_mode": "one-side"}, [1, 0, 0, 1]),
        # ring, outer bounds 0.25: A ≥ 0 and r ≤ 0.75 (t0); A ≤ 0 and r ≥ 1.25 (t3)
        (
            {"clip_mode": "ring", "epsilon_low_prime": 0.25, "epsilon_high_prime": 0.25},
            [1, 0, 0, 1],
        ),
        ({"clip_mode": "ring"}, [0, 0, 0, 0]),  # outer bounds 0.4: 0.6 and 1.4
    ],
)
def test_rec_clip_modes_by_hand(args, kept) -> None:
    loss, grad, metrics = rec_loss(**args)
    # ℓ_t = -A_t·ln r_t·K_t, token-mean over 4; ∂/∂logprob_t = -A_t·K_t / 4
    close(loss, sum(-a * math.log(r) * k for a, r, k in zip(A, R, kept, strict=True)) / 4)
    close(grad, [-a * k / 4 for a, k in zip(A, kept, strict=True)])
    close(metrics["pg_clipfrac"], 1 - sum(kept) / 4)


def test_rec_weights_and_regularizers_by_hand() -> None:
    # importance weight: A·r (detached) → gradient -A_t·r_t / 4
    _, grad, _ = rec_loss(weight="importance_sampling")
    close(grad, [-a * r / 4 for a, r in zip(A, R, strict=True)])
    # advantage weight: A·exp(A/τ), τ = 2
    _, grad, _ = rec_loss(weight="advantage", temp=2.0)
    close(grad, [-a * math.exp(a / 2) / 4 for a in A])
    # sequence ratio s = (0.7·0.7·1.3·1.3)^(1/4) = √0.91: A·s
    _, grad, _ = rec_loss(weight="gspo_importance_sampling")
    close(grad, [-a * math.sqrt(0.91) / 4 for a in A])
    # k2: + c·(logprob - old)², gradient + 2c·ln r / 4; forward-kl: - c·logprob, gradient - c/4
    _, grad, _ = rec_loss(regularizer="k2", regularizer_coef=0.5)
    close(grad, [(-a + 2 * 0.5 * math.log(r)) / 4 for a, r in zip(A, R, strict=True)])
    _, grad, _ = rec_loss(regularizer="forward-kl", regularizer_coef=0.5)
    close(grad, [(-a - 0.5) / 4 for a in A])


def test_rec_gspo_one_side_uses_the_sequence_ratio_and_a_sequence_mean() -> None:
    # s = √0.91 = 0.954 lies in [0.8, 1.2]: every token kept; one row: seq-mean-token-mean is
    # the token mean of the row
    loss, _, metrics = rec_loss(clip_mode="gspo-one-side")
    close(loss, sum(-a * math.log(r) for a, r in zip(A, R, strict=True)) / 4)
    assert metrics["pg_clipfrac"] == 0.0
    # two rows of different lengths: the sequence mean, not the token mean
    lp = torch.zeros(2, 2)
    mask = torch.tensor([[True, True], [True, False]])
    inp = PolicyLossInput(lp - 1.0, lp, torch.tensor([[1.0, 1.0], [2.0, 0.0]]), mask)
    loss, _ = POLICY_LOSS_FN.get("rec")(
        inp, agg=Aggregator("token-mean"), clip_mode="gspo-one-side"
    )
    # row 0: mean(1, 1) = 1; row 1: 2·1 = 2 → (1 + 2) / 2 = 1.5 (token-mean would be 4/3)
    close(loss, 1.5)


def test_rec_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="clip_mode"):
        rec_loss(clip_mode="both")
    with pytest.raises(ValueError, match="weight"):
        rec_loss(weight="is")
    with pytest.raises(ValueError, match="epsilon_low"):
        rec_loss(epsilon_low=1.5)
    with pytest.raises(ValueError, match="temp"):
        rec_loss(temp=0.0)


def test_the_rec_record_resolves_with_trinity_rfts_example_args() -> None:
    from trinity.algorithm.algorithms import resolve_algorithm, value_problems
    from trinity.config import schema  # noqa: F401  (the section's type)

    section = type(
        "Algo",
        (),
        {
            "algorithm_type": "rec",
            "advantage_fn": None,
            "policy_loss_fn": None,
            "kl_loss_fn": None,
            "kl_penalty_fn": None,
            "entropy_loss_fn": None,
            "sample_strategy": None,
            "advantage_fn_args": {"std_normalize": False},
            "policy_loss_fn_args": {"clip_mode": "one-side", "weight": "none"},
            "kl_loss_fn_args": {"kl_coef": 0.0},
            "kl_penalty_fn_args": None,
            "entropy_loss_fn_args": None,
            "sample_strategy_args": None,
            "loss_agg_mode": None,
        },
    )()
    r = resolve_algorithm(section)
    assert (r.spec.advantage_fn, r.spec.policy_loss_fn, r.spec.kl_loss_fn) == ("rec", "rec", "k2")
    assert r.use_reference
    assert r.advantage_fn_args == {"epsilon": 1e-6, "std_normalize": False}
    assert value_problems(r) == []


def test_rec_under_a_correction_is_its_weight_times_the_loss() -> None:
    """With importance weights w in the advantages (`algorithm.rollout_correction`), every
    per-token term is w times the uncorrected one: ℓ(A·w, is_weights=w) = w·ℓ(A)."""
    w = torch.tensor([[0.5, 2.0, 0.0, 1.5]])
    for args in (
        {"weight": "advantage", "temp": 2.0},
        {"regularizer": "k2", "regularizer_coef": 0.5},
        {"regularizer": "forward-kl", "regularizer_coef": 0.5, "clip_mode": "one-side"},
    ):
        lp = torch.tensor([[math.log(r) for r in R]])
        mask = torch.ones(1, 4, dtype=torch.bool)
        plain = PolicyLossInput(lp, torch.zeros(1, 4), torch.tensor([A]), mask)
        fixed = PolicyLossInput(lp, torch.zeros(1, 4), torch.tensor([A]) * w, mask, is_weights=w)
        agg = Aggregator("token-sum")
        per = [
            POLICY_LOSS_FN.get("rec")(
                dataclasses.replace(plain, action_mask=torch.arange(4)[None] == t),
                agg=agg, **args,
            )[0]
            for t in range(4)
        ]  # fmt: skip
        want = sum(float(w[0, t]) * float(per[t]) for t in range(4))
        close(POLICY_LOSS_FN.get("rec")(fixed, agg=agg, **args)[0], want)
