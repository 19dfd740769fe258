"""verl's remaining pieces: DRO, DPPO-TV / DPPO-KL, Clip-Cov, KL-Cov losses and the OPO and
grpo_passk advantages, by hand (arithmetic in the comments) and against loop oracles."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN, Aggregator
from trinity.algorithm.inputs import AdvantageInput, PolicyLossInput
from trinity.algorithm.losses.dppo import binary_kl

TOKEN_MEAN = Aggregator("token-mean")
LN2 = math.log(2.0)


def close(actual, expected, atol: float = 1e-9) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64).detach(),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


def near(metric: float, expected: float) -> None:
    """Metrics are float32 means (`masked_mean`): 1e-7."""
    close(metric, expected, atol=1e-7)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def call(name, logprob, old, adv, mask=None, agg=TOKEN_MEAN, **kw):
    extra = {k: kw.pop(k) for k in ("rollout_logprob", "is_weights", "step") if k in kw}
    mask = torch.ones(logprob.shape, dtype=torch.bool) if mask is None else mask
    inp = PolicyLossInput(logprob, old, adv, mask, **extra)
    return POLICY_LOSS_FN.get(name)(inp, agg=agg, **kw)


# -- DRO -------------------------------------------------------------------------------------
def test_dro_by_hand() -> None:
    # π_old = 0.25, 0.4; π_θ = 0.5, 0.2: d = ln 2, -ln 2; A = +1, -2; β = 0.1
    #   ℓ_0 = -(1·ln 0.5 - 0.05·ln²2) = ln 2 + 0.05 ln²2
    #   ℓ_1 = -(-2·ln 0.2 - 0.05·ln²2) = 2 ln 0.2 + 0.05 ln²2;  token-mean = (ℓ_0 + ℓ_1)/2
    #   ∂ℓ/∂log π = -(A - β·d): -(1 - 0.1 ln 2), -(-2 + 0.1 ln 2), each / 2
    old = t64([[math.log(0.25), math.log(0.4)]])
    adv = t64([[1.0, -2.0]])
    logprob = leaf([[math.log(0.5), math.log(0.2)]])
    loss, m = call("dro", logprob, old, adv, dro_beta=0.1)
    penalty = 0.05 * LN2**2
    close(loss, (LN2 + penalty + 2 * math.log(0.2) + penalty) / 2)
    near(m["dro_penalty"], penalty)
    near(m["ppo_kl"], 0.0)  # -(ln 2 - ln 2)/2
    loss.backward()
    close(logprob.grad, [[-(1 - 0.1 * LN2) / 2, (2 - 0.1 * LN2) / 2]])
    # on-policy the penalty vanishes: REINFORCE
    lp = leaf([[math.log(0.25), math.log(0.4)]])
    loss, _ = call("dro", lp, old, adv)
    close(loss, (-math.log(0.25) + 2 * math.log(0.4)) / 2)
    with pytest.raises(ValueError, match="dro_beta"):
        call("dro", leaf([[0.0]]), t64([[0.0]]), t64([[1.0]]), dro_beta=0.0)


def test_dro_weighs_its_penalty_with_the_correction() -> None:
    # ℓ(A·w, is_weights=w) = w·ℓ(A) per token: w = 0.5, 2 on the two tokens of the case above
    old = t64([[math.log(0.25), math.log(0.4)]])
    adv, w = t64([[1.0, -2.0]]), t64([[0.5, 2.0]])
    lp = t64([[math.log(0.5), math.log(0.2)]])
    penalty = 0.05 * LN2**2
    plain = [LN2 + penalty, 2 * math.log(0.2) + penalty]  # per token, from the test above
    loss, _ = call("dro", lp, old, adv * w, is_weights=w)
    close(loss, (0.5 * plain[0] + 2.0 * plain[1]) / 2)


# -- DPPO ------------------------------------------------------------------------------------
# five tokens of one row: π_old → π_θ and the advantage's sign
#   t0: 0.5 → 0.7, A +1   t1: 0.5 → 0.6, A +1   t2: 0.9 → 0.7, A -1   t3: 0.1 → 0.05, A -1
#   t4: 0.01 → 0.15, A +1;  ratios r = 1.4, 1.2, 7/9, 0.5, 15
P_OLD = [0.5, 0.5, 0.9, 0.1, 0.01]
P_NEW = [0.7, 0.6, 0.7, 0.05, 0.15]
DPPO_ADV = t64([[1.0, 1.0, -1.0, -1.0, 1.0]])


def dppo_case() -> tuple[torch.Tensor, torch.Tensor]:
    return leaf([[math.log(p) for p in P_NEW]]), t64([[math.log(p) for p in P_OLD]])


def test_binary_kl_by_hand() -> None:
    # KL((q, 1-q) ‖ (p, 1-p)) = q ln(q/p) + (1-q) ln((1-q)/(1-p))
    want = [
        q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
        for p, q in zip(P_NEW, P_OLD, strict=True)
    ]
    # t0: 0.5 ln(25/21) = 0.0872, t1: 0.5 ln(25/24) = 0.0204, t2: 0.1163, t3: 0.0207, t4: 0.1239
    lp, old = dppo_case()
    close(binary_kl(lp.detach(), old), [want], atol=1e-7)  # the 1e-8 guard moves it < 1e-7
    assert [round(x, 4) for x in want] == [0.0872, 0.0204, 0.1163, 0.0207, 0.1239]


def test_dppo_tv_by_hand() -> None:
    # δ = 0.15 on the shift p - p_old = 0.2, 0.1, -0.2, -0.05, 0.14:
    #   t0 A > 0 and 0.2 > δ: out; t1 in; t2 A < 0 and -0.2 < -δ: out; t3 in; t4 in (0.14)
    #   ℓ = -A·r·log p on t1, t3, t4: -1.2 ln 0.6, +0.5 ln 0.05, -15 ln 0.15, token-mean / 5
    #   ∇ = -A·r / 5: [0, -1.2, 0, 0.5, -15] / 5   (PPO's clip would zero t3 (r 0.5 < 0.8) and
    #   t4 (r 15): a rare token's big ratio is a small move of the distribution)
    lp, old = dppo_case()
    loss, m = call("dppo_tv", lp, old, DPPO_ADV)
    close(loss, (-1.2 * math.log(0.6) + 0.5 * math.log(0.05) - 15 * math.log(0.15)) / 5)
    near(m["pg_clipfrac"], 2 / 5)
    near(m["pg_clipfrac_lower"], 0.0)
    loss.backward()
    close(lp.grad, [[0.0, -1.2 / 5, 0.0, 0.5 / 5, -15 / 5]])
    # C = 10 truncates t4's weight (r 15, kept) but not t0's count (r 1.4 < 10; t0 is out anyway)
    lp, old = dppo_case()
    loss, m = call("dppo_tv", lp, old, DPPO_ADV, clip_ratio_c=10.0)
    near(m["pg_clipfrac_lower"], 1 / 5)
    loss.backward()
    close(lp.grad, [[0.0, -1.2 / 5, 0.0, 0.5 / 5, -10 / 5]])
    # decoupled bounds: δ_high 0.25 lets t0 (0.2) in
    lp, old = dppo_case()
    _, m = call("dppo_tv", lp, old, DPPO_ADV, clip_range_high=0.25)
    near(m["pg_clipfrac"], 1 / 5)


def test_dppo_kl_by_hand() -> None:
    # δ = 0.05 on the binary KLs 0.0872, 0.0204, 0.1163, 0.0207, 0.1239 (test above):
    #   t0 up and 0.087 > δ: out; t1 in; t2 down and 0.116 > δ: out; t3 in; t4 up, 0.124: out
    #   (TV kept t4: the KL weighs a rare token's move more)
    lp, old = dppo_case()
    loss, m = call("dppo_kl", lp, old, DPPO_ADV)
    close(loss, (-1.2 * math.log(0.6) + 0.5 * math.log(0.05)) / 5)
    near(m["pg_clipfrac"], 3 / 5)
    loss.backward()
    close(lp.grad, [[0.0, -1.2 / 5, 0.0, 0.5 / 5, 0.0]])
    # a move the advantage does not ask for is never masked: flip every sign
    lp, old = dppo_case()
    _, m = call("dppo_kl", lp, old, -DPPO_ADV)
    # A < 0 now on t0, t1, t4 (they moved up: inside), A > 0 on t2, t3 (moved down: inside)
    near(m["pg_clipfrac"], 0.0)


def test_dppo_anchors_on_the_engine_s_logprobs() -> None:
    lp, old = dppo_case()
    ref, m_ref = call("dppo_tv", lp, old, DPPO_ADV)
    lp2, _ = dppo_case()
    other_old = lp2.detach().clone()  # π_old = π_θ: nothing would be masked against it
    loss, m = call("dppo_tv", lp2, other_old, DPPO_ADV, rollout_logprob=old, anchor="rollout")
    close(loss, ref)
    assert m == m_ref
    with pytest.raises(ValueError, match="rollout_logprob"):
        call("dppo_kl", lp2, other_old, DPPO_ADV, anchor="rollout")
    with pytest.raises(ValueError, match="anchor"):
        call("dppo_kl", lp2, other_old, DPPO_ADV, anchor="engine")


# -- KL-Cov ----------------------------------------------------------------------------------
def test_kl_cov_by_hand() -> None:
    # log π = -1, -2, -3, -0.5 (mean -1.625); A = 1, -1, 1, -1 (mean 0)
    #   cov = 1·0.625, -1·(-0.375), 1·(-1.375), -1·1.125 = 0.625, 0.375, -1.375, -1.125
    #   k = max(1, ⌊0.25·4⌋) = 1: t0 is penalised
    # d = log π - log π_old = 0.1, -0.2, 0.3, 0.05; ρ = e^d
    #   ℓ = -A·ρ (+ |d| on t0): -e^0.1 + 0.1, e^-0.2, -e^0.3, e^0.05; token-mean / 4
    #   ∇ = -A·ρ (+ sign(d_0) on t0): 1 - e^0.1, e^-0.2, -e^0.3, e^0.05; / 4
    d = [0.1, -0.2, 0.3, 0.05]
    lp = leaf([[-1.0, -2.0, -3.0, -0.5]])
    old = lp.detach() - t64([d])
    adv = t64([[1.0, -1.0, 1.0, -1.0]])
    loss, m = call("kl_cov", lp, old, adv, kl_cov_ratio=0.25)
    e = math.exp
    close(loss, (-e(0.1) + 0.1 + e(-0.2) - e(0.3) + e(0.05)) / 4)
    near(m["kl_cov_frac"], 1 / 4)
    near(m["ppo_kl_abs"], (0.1 + 0.2 + 0.3 + 0.05) / 4)
    loss.backward()
    close(lp.grad, [[(1 - e(0.1)) / 4, e(-0.2) / 4, -e(0.3) / 4, e(0.05) / 4]])
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        call("kl_cov", lp, old, adv, kl_cov_ratio=0.0)


def kl_cov_oracle(lp, old, adv, mask, ratio: float, coef: float) -> float:
    """Token-mean KL-Cov, one token at a time."""
    cells = [(i, t) for i in range(lp.shape[0]) for t in range(lp.shape[1]) if mask[i, t]]
    mean_a = sum(float(adv[c]) for c in cells) / len(cells)
    mean_lp = sum(float(lp[c]) for c in cells) / len(cells)
    cov = {c: (float(adv[c]) - mean_a) * (float(lp[c]) - mean_lp) for c in cells}
    k = max(1, int(ratio * len(cells)))
    top = set(sorted(cells, key=lambda c: cov[c], reverse=True)[:k])
    total = 0.0
    for c in cells:
        d = float(lp[c]) - float(old[c])
        total += -float(adv[c]) * math.exp(d) + (coef * abs(d) if c in top else 0.0)
    return total / len(cells)


@pytest.mark.parametrize("seed", range(3))
def test_kl_cov_matches_a_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 7, generator=g, dtype=torch.float64) * 3
    lp = old + 0.3 * torch.randn(4, 7, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 7, generator=g) > 0.3
    loss, _ = call("kl_cov", lp, old, adv, mask, kl_cov_ratio=0.2, ppo_kl_coef=0.7)
    close(loss, kl_cov_oracle(lp, old, adv, mask, 0.2, 0.7), atol=1e-12)


# -- Clip-Cov --------------------------------------------------------------------------------
# log π = -0.5, -2.5, -2.5, -0.5 (mean -1.5); A = 3, -3, 3, -3 (mean 0)
#   cov = 3·1, -3·(-1), 3·(-1), -3·1 = 3, 3, -3, -3: t0 and t1 lie in (1, 5)
COV_LP = [[-0.5, -2.5, -2.5, -0.5]]
COV_ADV = t64([[3.0, -3.0, 3.0, -3.0]])


def test_clip_cov_by_hand() -> None:
    # d = 0, 0, 0.1, -0.1: no token is clipped by PPO (ρ 1, 1, 1.105, 0.905 inside [0.8, 1.2])
    # ratio 0.5: k = 2, both candidates t0, t1 are cut whatever the draw
    #   ℓ = 0, 0, -3e^0.1, 3e^-0.1; token-mean / 4; ∇ = 0, 0, -3e^0.1 / 4, 3e^-0.1 / 4
    lp = leaf(COV_LP)
    old = lp.detach() - t64([[0.0, 0.0, 0.1, -0.1]])
    loss, m = call("clip_cov", lp, old, COV_ADV, clip_cov_ratio=0.5)
    e = math.exp
    close(loss, (-3 * e(0.1) + 3 * e(-0.1)) / 4)
    near(m["pg_clipfrac"], 2 / 4)
    loss.backward()
    close(lp.grad, [[0.0, 0.0, -3 * e(0.1) / 4, 3 * e(-0.1) / 4]])
    # a token PPO already clipped is no candidate: t0 at ρ 1.5 (A > 0) keeps -3·1.2, no gradient
    lp = leaf(COV_LP)
    old = lp.detach() - t64([[math.log(1.5), 0.0, 0.1, -0.1]])
    loss, m = call("clip_cov", lp, old, COV_ADV, clip_cov_ratio=0.5)
    close(loss, (-3.6 - 3 * e(0.1) + 3 * e(-0.1)) / 4)
    near(m["pg_clipfrac"], 1 / 4)  # only t1 cut
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        call("clip_cov", lp, old, COV_ADV, clip_cov_ratio=-1.0)


def test_clip_cov_draw_is_seeded_by_seed_and_step() -> None:
    # ratio 0.25: k = 1 of the two candidates t0, t1; ℓ(t0) = -3, ℓ(t1) = +3 (ρ = 1)
    #   cut t0: (3 - 3e^0.1 + 3e^-0.1)/4;  cut t1: (-3 - 3e^0.1 + 3e^-0.1)/4
    e = math.exp
    outcomes = {
        round((3 - 3 * e(0.1) + 3 * e(-0.1)) / 4, 9): "t0",
        round((-3 - 3 * e(0.1) + 3 * e(-0.1)) / 4, 9): "t1",
    }
    lp = t64(COV_LP)
    old = lp - t64([[0.0, 0.0, 0.1, -0.1]])
    seen = set()
    for step in range(1, 13):
        first, m = call("clip_cov", lp, old, COV_ADV, clip_cov_ratio=0.25, step=step)
        again, _ = call("clip_cov", lp, old, COV_ADV, clip_cov_ratio=0.25, step=step)
        assert float(first) == float(again)  # same seed and step: same draw
        near(m["pg_clipfrac"], 1 / 4)
        seen.add(outcomes[round(float(first), 9)])
    assert seen == {"t0", "t1"}  # the draw does vary with the step


def test_clip_cov_outside_its_band_is_ppo() -> None:
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 6, generator=g, dtype=torch.float64)
    lp = old + 0.4 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 6, generator=g) > 0.2
    got, m = call("clip_cov", lp, old, adv, mask, clip_cov_lb=100.0, clip_cov_ub=200.0)
    want, _ = call("ppo", lp, old, adv, mask, clip_ratio_c=None)
    close(got, want, atol=1e-12)
    assert m["pg_clipfrac"] == 0.0


# -- OPO -------------------------------------------------------------------------------------
def mask_of(lengths: list[int], t: int) -> torch.Tensor:
    return torch.arange(t).expand(len(lengths), t) < torch.tensor(lengths)[:, None]


def test_opo_by_hand() -> None:
    # group 0: r = 1, 0, 1 with lengths 2, 4, 1: b = (2·1 + 4·0 + 1·1)/7 = 3/7
    #   A = 4/7, -3/7, 4/7   (the plain mean 2/3 would give 1/3, -2/3, 1/3)
    # group 1: one response, r = 0.5: b = 0, A = 0.5
    # group 2: r = 0.3, 0.3: flat, A = 0 exactly
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.3, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 2, 2])
    mask = mask_of([2, 4, 1, 3, 2, 2], 4)
    adv, ret = ADVANTAGE_FN.get("opo")(AdvantageInput.from_outcomes(rewards, groups, mask))
    scores = [4 / 7, -3 / 7, 4 / 7, 0.5, 0.0, 0.0]
    close(adv, t64(scores)[:, None] * mask, atol=1e-7)
    assert torch.equal(adv, ret)
    assert adv[4].abs().sum() == 0 and adv[5].abs().sum() == 0


def test_opo_matches_a_loop() -> None:
    g = torch.Generator().manual_seed(2)
    n, t = 12, 6
    rewards = torch.rand(n, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 4, (n,), generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g).tolist()
    mask = mask_of(lengths, t)
    adv, _ = ADVANTAGE_FN.get("opo")(AdvantageInput.from_outcomes(rewards, groups, mask))
    for i in range(n):
        members = [j for j in range(n) if groups[j] == groups[i]]
        if len(members) == 1:
            b = 0.0
        else:
            b = sum(lengths[j] * float(rewards[j]) for j in members)
            b /= sum(lengths[j] for j in members)
        close(adv[i, : lengths[i]], [float(rewards[i]) - b] * lengths[i], atol=1e-12)
        close(adv[i, lengths[i] :], [0.0] * (t - lengths[i]))


# -- grpo_passk ------------------------------------------------------------------------------
def test_grpo_passk_by_hand() -> None:
    # group 0: r = 0.2, 0.9, 0.5: the best (row 1) gets 0.9 - 0.5 = 0.4, the others 0;
    #   std (n-1) = sqrt(((-1/3)² + (11/30)² + (-1/30)²)/2) = sqrt(0.2466667/2) = 0.3511885
    # group 1: r = 1, 1, 0: a tie for the best → 0 everywhere; group 2: one response → 0
    rewards = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0, 0.7], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    mask = torch.ones(7, 2, dtype=torch.bool)
    inp = AdvantageInput.from_outcomes(rewards, groups, mask)
    std = math.sqrt(((1 / 3) ** 2 + (11 / 30) ** 2 + (1 / 30) ** 2) / 2)
    adv, _ = ADVANTAGE_FN.get("grpo_passk")(inp)
    close(adv[:, 0], [0.0, 0.4 / (std + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0])
    adv, _ = ADVANTAGE_FN.get("grpo_passk")(inp, std_normalize=False)
    close(adv[:, 1], [0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_grpo_passk_matches_a_loop() -> None:
    g = torch.Generator().manual_seed(7)
    n = 15
    rewards = torch.rand(n, generator=g, dtype=torch.float64)
    groups = torch.randint(10, 14, (n,), generator=g)  # non-contiguous ids, shuffled rows
    mask = torch.ones(n, 3, dtype=torch.bool)
    adv, _ = ADVANTAGE_FN.get("grpo_passk")(AdvantageInput.from_outcomes(rewards, groups, mask))
    want = [0.0] * n
    for gid in set(groups.tolist()):
        rows = [i for i in range(n) if groups[i] == gid]
        if len(rows) < 2:
            continue
        ranked = sorted(rows, key=lambda i: float(rewards[i]), reverse=True)
        vals = [float(rewards[i]) for i in rows]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        want[ranked[0]] = (float(rewards[ranked[0]]) - float(rewards[ranked[1]])) / (std + 1e-6)
    close(adv[:, 2], want, atol=1e-12)


# -- through the trainer ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "algo",
    [
        "policy_loss_fn: dro",
        "policy_loss_fn: dppo_tv, policy_loss_fn_args: {anchor: rollout}",
        "policy_loss_fn: dppo_kl",
        "policy_loss_fn: clip_cov",
        "policy_loss_fn: kl_cov",
        "advantage_fn: opo, kl_loss_fn: kl",
        "advantage_fn: grpo_passk, kl_loss_fn: k2+",
    ],
)
def test_a_train_step_with_each_new_piece(tmp_path, tiny_model_dir, algo: str) -> None:
    from transformers import AutoModelForCausalLM

    from tests.test_trainer import experiences, make_config
    from trinity.trainer.trainer import Trainer

    cfg = make_config(tmp_path, tiny_model_dir, micro_batch_size_per_gpu=2, algo=algo)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=2)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    m = trainer.train_step(experiences(vocab))
    assert math.isfinite(m["train/loss"])
    moved = max(float((v - before[k]).abs().max()) for k, v in trainer.model.state_dict().items())
    assert moved > 1e-6
