"""Off-policy correction: importance weights, rejection masks and mismatch metrics by hand; every
policy loss is positively homogeneous in the advantage; the trainer applies both in one step."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.algorithm import POLICY_LOSS_FN, Aggregator
from trinity.algorithm.correction import (
    log_weights,
    mismatch_metrics,
    rejected_rows,
    rollout_correction,
)
from trinity.algorithm.inputs import PolicyLossInput
from trinity.trainer.batch import collate, micro_batches
from trinity.trainer.trainer import Trainer

# two rows, three positions; row 1's last position is padding
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0]], dtype=torch.float64)
ROLL = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.1, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, True], [True, True, False]])
# δ = old - roll = [[0.5, -1.0, 0.0], [-0.8, 0.1, (pad)]]


def close(actual, expected, atol: float = 1e-12) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=atol,
        rtol=0,
    )


def test_log_weights_at_each_level_by_hand() -> None:
    close(log_weights(OLD, ROLL, MASK, "token"), [[0.5, -1.0, 0.0], [-0.8, 0.1, 0.0]])
    # sequence: Σ δ = -0.5 and -0.7 on every trained token
    close(log_weights(OLD, ROLL, MASK, "sequence"), [[-0.5, -0.5, -0.5], [-0.7, -0.7, 0.0]])
    # geometric: the mean, -0.5/3 and -0.7/2
    g0, g1 = -0.5 / 3, -0.35
    close(log_weights(OLD, ROLL, MASK, "geometric"), [[g0, g0, g0], [g1, g1, 0.0]])
    with pytest.raises(ValueError, match="token, sequence, geometric"):
        log_weights(OLD, ROLL, MASK, "row")  # type: ignore[arg-type]


def test_log_weights_are_clamped_before_exp() -> None:
    old, roll = torch.tensor([[0.0, 0.0]]), torch.tensor([[-30.0, -30.0]])
    lw = log_weights(old, roll, torch.ones(1, 2, dtype=torch.bool), "sequence")
    close(lw, [[20.0, 20.0]])  # Σ δ = 60, clamped to 20


def test_truncated_token_weights_by_hand() -> None:
    w, keep, m = rollout_correction(OLD, ROLL, MASK, rollout_is="token", rollout_is_threshold=1.5)
    # e^0.5 = 1.6487 > 1.5 → 1.5; e^-1, e^0 = 1, e^-0.8, e^0.1 below C
    close(w, [[1.5, math.exp(-1.0), 1.0], [math.exp(-0.8), math.exp(0.1), 0.0]])
    assert torch.equal(keep, MASK)
    assert m["is_truncated_frac"] == pytest.approx(1 / 5)
    total = 1.5 + math.exp(-1.0) + 1.0 + math.exp(-0.8) + math.exp(0.1)
    assert m["is_weight_mean"] == pytest.approx(total / 5)


def test_truncated_sequence_weights_by_hand() -> None:
    w, _, m = rollout_correction(OLD, ROLL, MASK, rollout_is="sequence", rollout_is_threshold=0.55)
    # row 0: e^-0.5 = 0.6065 > 0.55 → 0.55; row 1: e^-0.7 = 0.4966 kept
    a, b = 0.55, math.exp(-0.7)
    close(w, [[a, a, a], [b, b, 0.0]])
    assert m["is_truncated_frac"] == pytest.approx(3 / 5)


def test_rejection_masks_by_hand() -> None:
    # token, bounds [1/1.5, 1.5] = [0.667, 1.5]: e^0.5 = 1.65 out, e^-1 = 0.37 out, e^-0.8 = 0.45 out
    _, keep, m = rollout_correction(OLD, ROLL, MASK, rollout_rs="token", rollout_rs_threshold=1.5)
    assert keep.tolist() == [[False, False, True], [False, True, False]]
    assert m["rs_masked_frac"] == pytest.approx(3 / 5)
    # geometric, bounds [0.7, 1.2]: row 0 e^(-1/6) = 0.846 kept, row 1 e^-0.35 = 0.705 kept
    _, keep, _ = rollout_correction(
        OLD, ROLL, MASK, rollout_rs="geometric", rollout_rs_threshold=1.2,
        rollout_rs_threshold_lower=0.7,
    )  # fmt: skip
    assert torch.equal(keep, MASK)
    # sequence, bounds [0.55, 2]: row 0 e^-0.5 = 0.607 kept, row 1 e^-0.7 = 0.497 dropped whole
    _, keep, _ = rollout_correction(
        OLD, ROLL, MASK, rollout_rs="sequence", rollout_rs_threshold=2.0,
        rollout_rs_threshold_lower=0.55,
    )  # fmt: skip
    assert keep.tolist() == [[True, True, True], [False, False, False]]


def test_a_row_rejected_whole_leaves_the_sequence_count() -> None:
    # sequence, bounds [0.55, 2]: row 1 (e^-0.7 = 0.497) is dropped whole, row 0 kept
    _, keep, m = rollout_correction(
        OLD, ROLL, MASK, rollout_rs="sequence", rollout_rs_threshold=2.0,
        rollout_rs_threshold_lower=0.55,
    )  # fmt: skip
    assert rejected_rows(MASK, keep).tolist() == [False, True]
    assert m["rs_rejected_seq_frac"] == pytest.approx(1 / 2)
    # token level: row 0 keeps one token, row 1 keeps one: no row is rejected whole
    _, keep_t, m_t = rollout_correction(
        OLD, ROLL, MASK, rollout_rs="token", rollout_rs_threshold=1.5
    )
    assert not rejected_rows(MASK, keep_t).any() and m_t["rs_rejected_seq_frac"] == 0.0
    # a row with no trained token to begin with is not "rejected": it keeps counting
    empty = torch.tensor([[True, False], [False, False]])
    assert rejected_rows(empty, empty).tolist() == [False, False]

    # the seq-mean modes then average over the one sequence left, N_seqs = 2 - 1 = 1
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    n_seqs = 2 - int(rejected_rows(MASK, keep).sum())
    agg = Aggregator("seq-mean-token-sum", num_tokens=float(keep.sum()), num_seqs=n_seqs)
    close(agg(loss, keep), 6.0)  # (1 + 2 + 3) / 1, not / 2
    agg = Aggregator("seq-mean-token-mean", num_seqs=n_seqs)
    close(agg(loss, keep), 2.0)  # (6 / 3) / 1
    agg = Aggregator("seq-mean-token-sum-norm", num_seqs=n_seqs, norm_length=4.0)
    close(agg(loss, keep), 1.5)  # 6 / (1 · 4)
    # micro-batch invariance with the global counts: one micro-batch per row sums to the whole
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "token-mean"):
        agg = Aggregator(mode, num_tokens=float(keep.sum()), num_seqs=n_seqs)
        parts = agg(loss[:1], keep[:1]) + agg(loss[1:], keep[1:])
        close(parts, agg(loss, keep))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"rollout_is": "token", "rollout_is_threshold": 0.0}, "rollout_is_threshold"),
        ({"rollout_is": "geometric"}, "token or sequence"),
        ({"rollout_rs": "token", "rollout_rs_threshold": 0.9}, "lower <= 1 <= upper"),
        ({"rollout_rs": "token", "rollout_rs_threshold_lower": 1.5}, "lower <= 1 <= upper"),
    ],
)
def test_bad_correction_arguments_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        rollout_correction(OLD, ROLL, MASK, **kw)


def test_mismatch_metrics_by_hand() -> None:
    m = mismatch_metrics(OLD, ROLL, MASK)
    deltas = [0.5, -1.0, 0.0, -0.8, 0.1]
    assert m["mismatch_kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in deltas) / 5)
    assert m["mismatch_kl_k1"] == pytest.approx(-sum(deltas) / 5)
    assert m["abs_logprob_diff"] == pytest.approx(sum(abs(d) for d in deltas) / 5)
    w = sorted(math.exp(d) for d in deltas)  # e^-1, e^-0.8, e^0, e^0.1, e^0.5
    assert m["is_weight_min"] == pytest.approx(w[0])
    assert m["is_weight_max"] == pytest.approx(w[-1])
    assert m["is_weight_p50"] == pytest.approx(w[2])  # the middle of five
    # linear interpolation at 0.9·(5-1) = 3.6 between w[3] and w[4]
    assert m["is_weight_p90"] == pytest.approx(w[3] + 0.6 * (w[4] - w[3]))
    assert m["is_ess"] == pytest.approx(sum(w) ** 2 / (5 * sum(x * x for x in w)))
    seq = mismatch_metrics(OLD, ROLL, MASK, sequence_level=True)
    rows = [math.exp(-0.5), math.exp(-0.7)]  # one weight per row
    assert seq["is_weight_min"] == pytest.approx(rows[1])
    assert seq["is_weight_max"] == pytest.approx(rows[0])
    assert mismatch_metrics(OLD, ROLL, torch.zeros_like(MASK)) == {}


def test_on_policy_batch_has_no_mismatch() -> None:
    m = mismatch_metrics(OLD, OLD, MASK)
    assert m["mismatch_kl"] == 0.0 and m["abs_logprob_diff"] == 0.0 and m["is_ess"] == 1.0


@pytest.mark.parametrize("name", [n for n in POLICY_LOSS_FN if n not in ("sft", "dpo")])
def test_every_loss_is_positively_homogeneous_in_the_advantage(name: str) -> None:
    """A weight w ≥ 0 on the advantage (and in `is_weights`, for a loss term that does not scale
    with A: DRO's and KL-Cov's penalties) scales each token's loss by w: ℓ(w·A, w) = w·ℓ(A), so
    the trainer's correction weighs every loss per token (sft and dpo do not read A)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        old = -torch.rand(1, 1, generator=g, dtype=torch.float64) * 2
        lp = old + (torch.rand(1, 1, generator=g, dtype=torch.float64) - 0.5)  # ratio 0.6..1.6
        adv = torch.randn(1, 1, generator=g, dtype=torch.float64)
        w = float(torch.rand(1, generator=g)) * 3
        mask = torch.ones(1, 1, dtype=torch.bool)
        agg = Aggregator("token-mean")
        fn = POLICY_LOSS_FN.get(name)
        no_expert = torch.zeros(1, dtype=torch.bool)  # mix losses read it: all rollouts
        plain, _ = fn(PolicyLossInput(lp, old, adv, mask, expert_mask=no_expert), agg=agg)
        weighted, _ = fn(
            PolicyLossInput(
                lp, old, adv * w, mask, expert_mask=no_expert, is_weights=torch.full_like(adv, w)
            ),
            agg=agg,
        )
        close(weighted, w * plain)


def _trainer_and_batch(
    tmp_path, tiny_model_dir, correction: str, micro: int = 2, agg: str = "token-mean"
):
    from tests.test_trainer import experiences, make_config

    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=micro, use_dynamic_bsz="false",
        algo=f"kl_loss_fn: none, rollout_correction: {{{correction}}}", agg=agg,
    )  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=2)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    # the engine's logprobs: the model's own, each moved by up to ±0.8 (a stale, noisy engine)
    batch = collate(exps, trainer.pad_id)
    with torch.no_grad():
        lp = trainer._logprobs_no_grad(trainer.policy, batch, micro_batches(batch, len(exps)))
    g = torch.Generator().manual_seed(1)
    for i, e in enumerate(exps):
        n = e.response_length
        e.logprobs = lp[i, :n] + (torch.rand(n, generator=g) - 0.5) * 1.6
    return trainer, exps


def _capture(trainer) -> list[PolicyLossInput]:
    seen: list[PolicyLossInput] = []
    loss_fn = trainer.algo.policy_loss_fn

    def capture(inp, **kw):
        seen.append(inp)
        return loss_fn(inp, **kw)

    trainer.algo = dataclasses.replace(trainer.algo, policy_loss_fn=capture)
    return seen


def test_trainer_weighs_advantages_and_drops_rejected_tokens(tmp_path, tiny_model_dir) -> None:
    trainer, exps = _trainer_and_batch(
        tmp_path, tiny_model_dir,
        "rollout_is: token, rollout_is_threshold: 1.2, rollout_rs: token, rollout_rs_threshold: 1.8",
    )  # fmt: skip
    seen = _capture(trainer)
    metrics = trainer.train_step(exps)
    for inp in seen:
        # the reference: weights and mask recomputed from the loss's own π_old and μ
        assert inp.rollout_logprob is not None
        delta = (inp.old_logprob - inp.rollout_logprob).clamp(-20, 20)
        w = torch.exp(delta)
        keep = (w >= 1 / 1.8) & (w <= 1.8)
        assert not (inp.action_mask & ~keep).any()  # no rejected token is trained
        assert (inp.logprob.detach() == inp.old_logprob).all()  # one update: π_old = π_θ
    assert 0.0 < metrics["off_policy/rs_masked_frac"] < 1.0  # noise up to 0.8 > log 1.8
    assert metrics["off_policy/is_truncated_frac"] > 0  # random μ: some weights exceed 1.2
    assert metrics["off_policy/mismatch_kl"] > 0 and "off_policy/is_weight_p99" in metrics


def test_correction_weights_enter_the_loss(tmp_path, tiny_model_dir) -> None:
    trainer, exps = _trainer_and_batch(
        tmp_path, tiny_model_dir, "rollout_is: sequence, rollout_is_threshold: 3.0"
    )
    seen = _capture(trainer)
    plain, _ = _trainer_and_batch(tmp_path, tiny_model_dir, "")
    plain_seen = _capture(plain)
    trainer.train_step(exps)
    plain.train_step(exps)
    for inp, ref in zip(seen, plain_seen, strict=True):
        # same model, same batch: the corrected advantages are the plain ones times min(Π ρ, C)
        assert ref.rollout_logprob is not None
        delta = torch.where(ref.action_mask, ref.old_logprob - ref.rollout_logprob, 0.0)
        w = torch.exp(delta.sum(-1, keepdim=True).clamp(-20, 20)).clamp(max=3.0)
        close(inp.advantages, torch.where(ref.action_mask, ref.advantages * w, 0.0), atol=1e-5)
        # the weight itself reaches the loss too, for terms that do not scale with A (DRO)
        assert inp.is_weights is not None and ref.is_weights is None
        close(torch.where(ref.action_mask, inp.is_weights, 0.0), w * ref.action_mask, atol=1e-5)


def test_trainer_takes_rejected_rows_out_of_the_sequence_count(tmp_path, tiny_model_dir) -> None:
    # sequence-level rejection with a narrow band: the engine's noise (±0.8 a token) drops some
    # rows whole and keeps others
    trainer, exps = _trainer_and_batch(
        tmp_path, tiny_model_dir,
        "rollout_rs: sequence, rollout_rs_threshold: 1.6, rollout_rs_threshold_lower: 0.6",
    )  # fmt: skip
    seen: list[tuple[PolicyLossInput, Aggregator]] = []
    loss_fn = trainer.algo.policy_loss_fn

    def capture(inp, **kw):
        seen.append((inp, kw["agg"]))
        return loss_fn(inp, **kw)

    trainer.algo = dataclasses.replace(trainer.algo, policy_loss_fn=capture)
    metrics = trainer.train_step(exps)
    # every experience has trained tokens, so a row with none left was rejected whole
    rejected = sum(int((~inp.action_mask.any(dim=-1)).sum()) for inp, _ in seen)
    assert 0 < rejected < len(exps)
    assert {agg.num_seqs for _, agg in seen} == {float(len(exps) - rejected)}
    assert metrics["off_policy/rs_rejected_seq_frac"] == pytest.approx(rejected / len(exps))


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean"])
def test_rejected_rows_keep_micro_batches_exact(tmp_path, tiny_model_dir, agg: str) -> None:
    """With rows rejected whole, one micro-batch of 6 and six of 1 give the same gradients: the
    sequence count is the mini-batch's, whatever the split."""
    rs = "rollout_rs: sequence, rollout_rs_threshold: 1.6, rollout_rs_threshold_lower: 0.6"
    grads, losses = [], []
    for micro in (6, 1):
        trainer, exps = _trainer_and_batch(tmp_path, tiny_model_dir, rs, micro=micro, agg=agg)
        m = trainer.train_step(exps)
        assert 0 < m["off_policy/rs_rejected_seq_frac"] < 1
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
        losses.append(m["train/loss"])
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-4)
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
