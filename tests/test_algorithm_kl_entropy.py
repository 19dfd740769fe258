"""KL estimators, KL loss and penalty, entropy and the entropy bonus, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trinity.algorithm import (
    ENTROPY_LOSS_FN,
    KL_LOSS_FN,
    KL_PENALTY_FN,
    Aggregator,
    entropy_from_logits,
    kl_estimate,
)

TOKEN_MEAN = Aggregator("token-mean")
LN2 = math.log(2.0)


def close(actual: torch.Tensor | float, expected: float | list, atol: float = 1e-6) -> None:
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def test_kl_estimators_by_hand() -> None:
    # logprob = -1, ref = -1 + ln 2, so d = logprob - ref = -ln 2 and ref - logprob = ln 2
    #   k1 = d = -ln 2 ≈ -0.693147
    #   k2 = ½·d² = ½·(ln 2)² ≈ 0.240227
    #   k3 = exp(ln 2) - ln 2 - 1 = 2 - ln 2 - 1 = 1 - ln 2 ≈ 0.306853
    #   abs = ln 2
    logprob = torch.tensor([[-1.0]], dtype=torch.float64)
    ref = logprob + LN2
    close(kl_estimate(logprob, ref, "k1"), [[-LN2]])
    close(kl_estimate(logprob, ref, "kl"), [[-LN2]])  # verl's name for k1
    close(kl_estimate(logprob, ref, "k2"), [[0.5 * LN2**2]])
    close(kl_estimate(logprob, ref, "k3"), [[2 - LN2 - 1]])
    close(kl_estimate(logprob, ref, "low_var_kl"), [[1 - LN2]])
    close(kl_estimate(logprob, ref, "abs"), [[LN2]])
    # identical distributions: every estimator is 0
    for kind in ("k1", "k2", "k3", "abs"):
        close(kl_estimate(logprob, logprob, kind), [[0.0]])


def test_verl_kl_name_is_k1_in_value_and_gradient() -> None:
    # kl = d = logprob - ref: [0.5, -1] → token-mean -0.25; ∂/∂logprob = 1/2 per token
    ref = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    logprob = torch.tensor([[-1.0, -1.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = KL_LOSS_FN.get("kl")(
        logprob, ref, torch.ones(1, 2, dtype=torch.bool), agg=TOKEN_MEAN, kl_coef=1.0
    )
    close(loss, -0.25)
    loss.backward()
    close(logprob.grad, [[0.5, 0.5]])
    # as a reward penalty: r - β·d on each token
    shaped, _ = KL_PENALTY_FN.get("kl")(
        torch.zeros(1, 2, dtype=torch.float64), logprob.detach(), ref,
        torch.ones(1, 2, dtype=torch.bool), kl_coef=0.1,
    )  # fmt: skip
    close(shaped, [[-0.05, 0.1]])


def test_k3_is_clamped_like_verl() -> None:
    # ref - logprob = 30 → exp(20) - 20 - 1 (log-ratio clamped to 20) → clamped to 10
    out = kl_estimate(torch.tensor([0.0]), torch.tensor([30.0]), "k3")
    close(out, [10.0])
    with pytest.raises(ValueError, match="k1, k2, k3, low_var_kl, abs"):
        kl_estimate(torch.tensor([0.0]), torch.tensor([0.0]), "k4")


def test_kl_loss_by_hand_and_gradient() -> None:
    # k3 at ref - logprob = ln 2 on all 3 masked tokens → agg = 1 - ln 2; loss = 0.1·(1 - ln 2)
    # ∂k3/∂logprob = 1 - exp(ref - logprob) = 1 - 2 = -1 → ∂loss/∂logprob = 0.1·(-1)/3 per masked token
    logprob = torch.full((2, 2), -1.0, dtype=torch.float64, requires_grad=True)
    ref = torch.full((2, 2), -1.0 + LN2, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = KL_LOSS_FN.get("k3")(logprob, ref, mask, agg=TOKEN_MEAN, kl_coef=0.1)
    close(loss, 0.1 * (1 - LN2))
    assert m == {"kl_loss": pytest.approx(1 - LN2), "kl_coef": 0.1}
    loss.backward()
    close(logprob.grad, [[-0.1 / 3, -0.1 / 3], [-0.1 / 3, 0.0]])


def test_straight_through_variants_keep_the_value_and_take_k2_s_gradient() -> None:
    # d = logprob - ref = 0.5 and -1 (both masked), token-mean, kl_coef 1:
    #   k3 values: exp(-0.5) + 0.5 - 1 = 0.1065306597, exp(1) - 1 - 1 = 0.7182818285
    #   → loss = (0.1065306597 + 0.7182818285)/2 = 0.4124062441
    #   k2's gradient ∂(½d²)/∂logprob = d → grads d/2 = 0.25, -0.5 (k3's own would be
    #   (1 - exp(-d))/2 = 0.1967346701, -0.8591409142)
    #   mse = ½d² = 0.125, 0.5 → 0.3125 with the same gradient; k1+ = d → (0.5 - 1)/2 = -0.25
    #   k2+ = k2 in value (0.3125) and gradient (k2's own)
    ref = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    want = {
        "k3+": 0.4124062441,
        "low_var_kl+": 0.4124062441,
        "mse": 0.3125,
        "k1+": -0.25,
        "k2+": 0.3125,
    }
    for name, value in want.items():
        logprob = torch.tensor([[-1.0, -1.5]], dtype=torch.float64, requires_grad=True)
        loss, m = KL_LOSS_FN.get(name)(logprob, ref, mask, agg=TOKEN_MEAN, kl_coef=1.0)
        close(loss, value)
        close(m["kl_loss"], value)
        loss.backward()
        close(logprob.grad, [[0.25, -0.5]])
    # abs+: |0.5| and |-1| → 0.75, k2's gradient again
    logprob = torch.tensor([[-1.0, -1.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = KL_LOSS_FN.get("abs+")(logprob, ref, mask, agg=TOKEN_MEAN, kl_coef=1.0)
    close(loss, 0.75)
    loss.backward()
    close(logprob.grad, [[0.25, -0.5]])
    # as a reward penalty (no gradient) a + variant is its estimator
    rewards = torch.zeros(1, 2, dtype=torch.float64)
    lp = torch.tensor([[-1.0, -1.5]], dtype=torch.float64)
    shaped, _ = KL_PENALTY_FN.get("k3+")(rewards, lp, ref, mask, kl_coef=1.0)
    close(shaped, (-kl_estimate(lp, ref, "k3")).tolist())


@pytest.mark.parametrize(
    "name", ["k1", "kl", "k2", "k3", "low_var_kl", "abs", "mse", "k3+", "abs+", "k2+"]
)
def test_kl_loss_matches_estimator(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    lp, ref = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.4
    loss, m = KL_LOSS_FN.get(name)(lp, ref, mask, agg=TOKEN_MEAN)  # default kl_coef = 0.001
    expected = kl_estimate(lp, ref, name)[mask].mean()
    close(loss, 0.001 * expected)
    close(m["kl_loss"], float(expected))


def test_no_kl_loss() -> None:
    lp = torch.zeros(2, 2, requires_grad=True)
    loss, m = KL_LOSS_FN.get("none")(
        lp, lp.detach(), torch.ones(2, 2, dtype=torch.bool), agg=TOKEN_MEAN
    )
    assert loss.shape == () and float(loss) == 0.0 and m == {}


def test_kl_penalty_shaping_by_hand() -> None:
    # d = logprob - ref; k1 = d; β = 0.5; r' = r - β·d on masked tokens, masked tokens unchanged
    #   row 0: [0 - 0.05, 0 - 0.10, 1 - 0.15] = [-0.05, -0.10, 0.85]
    #   row 1: [0 - 0.20, 2 - 0.25, 0 (masked, d = 9.9 ignored)] = [-0.20, 1.75, 0.0]
    # kl_penalty metric = (0.1 + 0.2 + 0.3 + 0.4 + 0.5)/5 = 0.3
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    ref = torch.full((2, 3), -2.0, dtype=torch.float64)
    logprob = ref + torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.9]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    shaped, m = KL_PENALTY_FN.get("k1")(rewards, logprob, ref, mask, kl_coef=0.5)
    close(shaped, [[-0.05, -0.10, 0.85], [-0.20, 1.75, 0.0]])
    assert m == {"kl_penalty": pytest.approx(0.3), "kl_coef": 0.5}
    same, m = KL_PENALTY_FN.get("none")(rewards, logprob, ref, mask)
    assert same is rewards and m == {}


def test_entropy_from_logits_by_hand() -> None:
    # uniform over 4: H = ln 4
    close(entropy_from_logits(torch.zeros(4, dtype=torch.float64)), math.log(4))
    # p = [½, ¼, ¼]: H = ½ ln 2 + 2·¼ ln 4 = ½ ln 2 + ln 2 = 1.5 ln 2 ≈ 1.039721 (logits shift-invariant)
    logits = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).log() + 7.0
    close(entropy_from_logits(logits), 1.5 * LN2)
    # one-hot limit and huge logits: ≈ 0 and finite
    out = entropy_from_logits(torch.tensor([1000.0, 0.0, -1000.0]))
    assert torch.isfinite(out) and abs(float(out)) < 1e-6


def test_entropy_from_logits_matches_definition() -> None:
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)
    definition = -(p * p.log()).sum(dim=-1)  # H = -Σ p log p
    out = entropy_from_logits(logits)
    assert out.shape == (2, 3)
    close(out, definition, atol=1e-12)


def test_entropy_loss_by_hand() -> None:
    # token-mean of entropy over all 4 tokens = (1+2+3+4)/4 = 2.5; loss = -0.01·2.5 = -0.025
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = ENTROPY_LOSS_FN.get("default")(entropy, mask, agg=TOKEN_MEAN, entropy_coef=0.01)
    close(loss, -0.025)
    assert m == {"entropy": pytest.approx(2.5)}
    loss.backward()  # ∂/∂H = -0.01/4
    close(entropy.grad, [[-0.0025] * 2] * 2)
    loss, m = ENTROPY_LOSS_FN.get("none")(entropy, mask, agg=TOKEN_MEAN)
    assert float(loss) == 0.0 and m == {}


def test_adaptive_kl_controller_by_hand() -> None:
    from trinity.algorithm.kl_controller import AdaptiveKLController

    c = AdaptiveKLController(0.1, target_kl=0.5, horizon=100)
    c.update(1.0, n_steps=10)  # KL twice the target: e = clip(1.0, ±0.2) = 0.2 → β·(1 + 0.02)
    assert c.value == pytest.approx(0.102)
    c.update(0.45, n_steps=10)  # e = 0.45/0.5 - 1 = -0.1 → β·(1 - 0.01)
    assert c.value == pytest.approx(0.102 * 0.99)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=100)


def test_trainer_adapts_the_penalty_coefficient(tmp_path, tiny_model_dir) -> None:
    from test_trainer import experiences, make_config
    from transformers import AutoModelForCausalLM

    from trinity.trainer.trainer import Trainer

    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6,
        algo="kl_loss_fn: none, kl_penalty_fn: k1, kl_penalty_fn_args: {kl_coef: 0.05}, "
        "kl_ctrl: {type: adaptive, target_kl: 1000.0, horizon: 12}",
    )  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=3)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    m = trainer.train_step(experiences(vocab))
    # the engine's logprobs (random) are far from the reference's, yet far below the target
    # 1000: e = -0.2 (clipped), 6 samples over a horizon of 12 → β·(1 - 0.1)
    assert m["train/kl_coef"] == pytest.approx(0.05)  # the step used the starting β
    assert trainer.kl_ctrl is not None and trainer.kl_ctrl.value == pytest.approx(0.045)
    m = trainer.train_step(experiences(vocab))
    assert m["train/kl_coef"] == pytest.approx(0.045)


def test_entropy_term_has_gradient_only_with_a_nonzero_coefficient():
    from trinity.algorithm.entropy import (
        entropy_loss,
        entropy_term_has_gradient,
        no_entropy_loss,
    )

    assert entropy_term_has_gradient(entropy_loss, {"entropy_coef": 0.001})
    assert entropy_term_has_gradient(entropy_loss, {"entropy_coef": -0.5})
    assert not entropy_term_has_gradient(entropy_loss, {"entropy_coef": 0.0})
    assert not entropy_term_has_gradient(entropy_loss, {})  # its default: 0
    assert not entropy_term_has_gradient(no_entropy_loss, {})

    def users_own(entropy, action_mask, *, agg, weight=1.0):  # no entropy_coef: its own rule
        return weight * agg(entropy, action_mask), {}

    assert entropy_term_has_gradient(users_own, {"weight": 0.0})


def test_metric_only_entropy_steps_as_with_autograd(tmp_path, tiny_model_dir):
    """entropy_coef 0: the trainer computes the entropy outside autograd; the step's parameters
    and metrics equal those of the same step with the entropy under autograd (0 · its grad)."""
    import copy

    from test_trainer import experiences, make_config

    from trinity.trainer.trainer import Trainer

    cfg = make_config(tmp_path, tiny_model_dir)
    out = []
    for grad in (True, False):
        trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
        assert trainer.entropy_grad is False  # grpo's entropy_coef is 0
        trainer.entropy_grad = grad
        exps = experiences(trainer.model.config.vocab_size)
        out.append((trainer.train_step(copy.deepcopy(exps)), trainer.model.state_dict()))
    (m0, w0), (m1, w1) = out
    assert m1["train/entropy"] == m0["train/entropy"] and m1["train/loss"] == m0["train/loss"]
    for k in w0:
        assert torch.equal(w1[k], w0[k]), k
