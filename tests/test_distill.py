"""On-policy distillation: the teacher is explorer.auxiliary_models[0], scored by the trainer as
its reference model; the advantage is teacher minus student logprob on the student's samples."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from test_trainer import experiences, make_config
from transformers import AutoModelForCausalLM

from trinity.models import resolve_model_path
from trinity.trainer.batch import collate
from trinity.trainer.logprobs import response_logprobs
from trinity.trainer.trainer import Trainer, check_same_vocabulary


def test_the_advantage_is_the_teachers_logprob_minus_the_students(tmp_path, tiny_model_dir):
    teacher_dir = resolve_model_path("tiny://1m?seed=1")  # same tokenizer, other weights
    cfg = make_config(tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6, algo="kl_loss_fn: none")
    cfg.algorithm.algorithm_type = "on_policy_distill"
    cfg.algorithm.kl_loss_fn = None
    cfg.explorer.auxiliary_models = [
        cfg.explorer.rollout_model.model_copy(update={"model_path": str(teacher_dir)})
    ]
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=2)
    seen = {}
    advantage_fn = trainer.algo.advantage_fn

    def capture(inp, **kw):
        seen["inp"] = inp
        out = advantage_fn(inp, **kw)
        seen["adv"] = out[0]
        return out

    trainer.algo = dataclasses.replace(trainer.algo, advantage_fn=capture)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    trainer.train_step(exps)
    # the reference: the teacher's logprobs of the same tokens, computed independently
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    batch = collate(exps, trainer.pad_id)
    with torch.no_grad():
        want_ref, _ = response_logprobs(teacher, batch, with_entropy=False)
    inp = seen["inp"]
    mask = batch.response_mask
    torch.testing.assert_close(inp.ref_logprob * mask, want_ref * mask, atol=1e-5, rtol=0)
    # student: the engine's logprobs (one update per step: π_old is not recomputed first)
    torch.testing.assert_close(inp.logprob, batch.rollout_logprobs)
    torch.testing.assert_close(
        seen["adv"], (want_ref - batch.rollout_logprobs) * mask, atol=1e-5, rtol=0
    )


def test_a_teacher_with_another_vocabulary_is_refused():
    student = SimpleNamespace(get_vocab=lambda: {"a": 0, "b": 1})
    check_same_vocabulary(student, SimpleNamespace(get_vocab=lambda: {"a": 0, "b": 1}), "t")
    with pytest.raises(ValueError, match="another vocabulary"):
        check_same_vocabulary(student, SimpleNamespace(get_vocab=lambda: {"a": 1, "b": 0}), "t")
