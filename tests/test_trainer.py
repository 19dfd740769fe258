"""Trainer invariants: micro-batching is exact, parameters move, checkpoints load in transformers."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.common.experience import EID, Experience
from trinity.config import load_config
from trinity.trainer.trainer import Trainer


def make_config(tmp_path, model_dir, **trainer_kw):
    agg = trainer_kw.pop("agg", None)
    trainer = ", ".join(f"{k}: {v}" for k, v in trainer_kw.items())
    p = tmp_path / "cfg.yaml"
    p.write_text(
        f"model: {{model_path: {model_dir}}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 3, kl_loss_fn: k3, "
        f"loss_agg_mode: {agg or 'token-mean'}, optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}}}\n"
        f"trainer: {{{trainer}}}\n"
        "buffer: {batch_size: 2, explorer_input: {taskset: {storage_type: synthetic, path: arithmetic}}}\n"
    )
    return load_config(p)


def experiences(vocab: int, seed: int = 0) -> list[Experience]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for task in range(2):
        for run in range(3):
            p = int(torch.randint(2, 6, (1,), generator=g))
            r = int(torch.randint(1, 7, (1,), generator=g))
            out.append(
                Experience(
                    tokens=torch.randint(3, vocab, (p + r,), generator=g),
                    prompt_length=p,
                    logprobs=-torch.rand(r, generator=g),
                    reward=float(run == task),  # a mix of right and wrong answers per group
                    eid=EID(batch=1, task=task, run=run),
                )
            )
    return out


def params_after_step(cfg, model_dir, exps):
    """(params before, accumulated gradients of the step, params after, metrics)."""
    trainer = Trainer(cfg, str(model_dir), total_steps=10)
    before = copy.deepcopy(trainer.model.state_dict())
    metrics = trainer.train_step(exps)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    return before, grads, trainer.model.state_dict(), metrics


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_micro_batches_equal_one_batch(tmp_path, tiny_model_dir, agg):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    whole = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6, use_dynamic_bsz="false", agg=agg
    )
    split = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=2, use_dynamic_bsz="false", agg=agg
    )
    budget = make_config(
        tmp_path, tiny_model_dir, max_token_len_per_gpu=16, use_dynamic_bsz="true", agg=agg
    )
    before, a, after, ma = params_after_step(whole, tiny_model_dir, exps)
    _, b, _, mb = params_after_step(split, tiny_model_dir, exps)
    _, c, _, _ = params_after_step(budget, tiny_model_dir, exps)
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4, "the step did not change the parameters"
    # gradients (before clipping and Adam, which amplifies float noise in near-zero grads)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(a[k], c[k], atol=1e-6, rtol=1e-4)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-5)
    assert ma["train/grad_norm"] == pytest.approx(mb["train/grad_norm"], rel=1e-4)


def test_metrics_and_checkpoint_roundtrip(tmp_path, tiny_model_dir):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    cfg = make_config(tmp_path, tiny_model_dir, micro_batch_size_per_gpu=4)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    m = trainer.train_step(experiences(vocab))
    for key in ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/kl_loss", "train/entropy",
                "train/grad_norm", "train/lr", "train/tokens_per_s"):  # fmt: skip
        assert key in m, key
    # first update: the ratio is exactly 1, so nothing is clipped
    assert m["train/pg_clipfrac"] == 0.0
    path = trainer.save_checkpoint(tmp_path / "ckpt", step=1)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)


def test_several_updates_recompute_old_logprobs(tmp_path, tiny_model_dir):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=2, ppo_epochs=2, ppo_mini_batch_size=3
    )
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    m = trainer.train_step(experiences(vocab))
    assert "timing/train_old_logprob" in m  # a no-grad pass before the first update
    # 2 epochs x 2 mini-batches of 3 = 4 optimizer updates, each stepping the lr schedule
    assert trainer.scheduler.last_epoch == 4
    # after the first update the weights differ from the old ones, so the ratio moved off 1
    assert m["train/ppo_kl"] != 0.0
