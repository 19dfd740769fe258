"""A replay copy's π_old is the logprobs of the engine that sampled it (trinity/trainer/
replayed_rows.py): reuse is clipped against the behaviour policy, as PPO's epochs are."""

from __future__ import annotations

import torch
from test_algorithm_correction import _capture, _trainer_and_batch

from trinity.trainer.batch import collate
from trinity.trainer.replayed_rows import clip_copies_to_behaviour


def test_copies_take_their_rollout_logprobs_as_old_and_fresh_rows_keep_theirs() -> None:
    """Rows 0 (fresh) and 1 (a copy), response of 2 tokens: π_old recomputed [-1, -1] on both,
    μ [-2, -0.5]; the copy's π_old becomes μ, and the drift reported is on its tokens alone:
    δ = π_old - μ = (1, -0.5), |δ| mean 0.75, k1 = mean(-δ) = -0.25."""
    from test_trainer import experiences

    exps = experiences(32)[:2]
    for e, uses in zip(exps, (0, 1), strict=True):
        e.info["use_count"] = uses
        e.logprobs = torch.tensor([-2.0, -0.5])[: e.response_length]
    batch = collate(exps, 0)
    assert batch.replayed is not None and batch.replayed.tolist() == [False, True]
    batch.old_logprobs = torch.full(batch.rollout_logprobs.shape, -1.0)
    mask = torch.zeros_like(batch.response_mask)
    mask[:, :2] = True
    drift = clip_copies_to_behaviour(batch, mask)
    assert batch.old_logprobs[0].tolist() == [-1.0] * batch.old_logprobs.shape[1]
    assert batch.old_logprobs[1, :2].tolist() == [-2.0, -0.5]
    assert abs(drift["replay/behaviour_abs_logprob_diff"] - 0.75) < 1e-6
    assert abs(drift["replay/behaviour_mismatch_kl_k1"] - -0.25) < 1e-6
    assert collate([exps[0]], 0).replayed is None  # no copy: nothing to do


def test_a_train_step_clips_a_copy_against_the_policy_that_sampled_it(tmp_path, tiny_model_dir):
    """Every row a copy whose engine μ is the current policy's logprobs moved by up to ±0.8:
    the loss sees π_old = μ (the current policy would give ratio 1 and clip nothing), so the
    tokens whose ratio π_θ/μ left [1 - ε, 1 + ε] on their advantage's side are clipped."""
    trainer, exps = _trainer_and_batch(tmp_path, tiny_model_dir, "")
    seen = _capture(trainer)
    for e in exps:
        e.info["use_count"] = 1
    metrics = trainer.train_step(exps)
    for inp in seen:
        assert inp.rollout_logprob is not None
        on = inp.action_mask
        assert torch.equal(inp.old_logprob[on], inp.rollout_logprob[on])
        assert not torch.equal(inp.logprob.detach()[on], inp.old_logprob[on])
    assert metrics["replay/behaviour_abs_logprob_diff"] > 0.1  # μ was moved by up to ±0.8
    assert metrics["train/pg_clipfrac"] > 0
