"""PPO's critic: the clipped value loss by hand, the value model learning its targets, critic
warm-up (policy frozen), and the critic in checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from test_trainer import experiences, make_config
from transformers import AutoModelForCausalLM

from trinity.algorithm import Aggregator
from trinity.algorithm.value_loss import clipped_value_loss
from trinity.trainer.critic import CRITIC_WEIGHTS
from trinity.trainer.trainer import Trainer

TOKEN_MEAN = Aggregator("token-mean")


def t(x: float) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64)


@pytest.mark.parametrize(
    "v, old, ret, loss, clipfrac, grad",
    [
        # clip(2.0, 0.5, 1.5) = 1.5: (2 - 1.5)² = 0.25 vs (1.5 - 1.5)² = 0 → ½·0.25; ∇ = V - G
        (2.0, 1.0, 1.5, 0.125, 0.0, 0.5),
        # V = 0.2 below the range: clipped 0.5; (0.2-2)² = 3.24 > (0.5-2)² = 2.25 → 1.62
        (0.2, 1.0, 2.0, 1.62, 0.0, -1.8),
        # V = 2 above the range, target 3: clipped 1.5; (2-3)² = 1 < (1.5-3)² = 2.25 → 1.125,
        # the clipped branch is a constant in V: no gradient
        (2.0, 1.0, 3.0, 1.125, 1.0, 0.0),
    ],
)
def test_clipped_value_loss_by_hand(v, old, ret, loss, clipfrac, grad) -> None:
    values = t(v).requires_grad_()
    out, m = clipped_value_loss(
        values, t(old), t(ret), torch.ones(1, 1, dtype=torch.bool), agg=TOKEN_MEAN,
        cliprange_value=0.5,
    )  # fmt: skip
    assert float(out.detach()) == pytest.approx(loss)
    assert m["vf_clipfrac"] == clipfrac
    out.backward()
    assert float(values.grad) == pytest.approx(grad)
    with pytest.raises(ValueError, match="cliprange_value"):
        clipped_value_loss(values, t(old), t(ret), torch.ones(1, 1, dtype=torch.bool),
                           agg=TOKEN_MEAN, cliprange_value=0.0)  # fmt: skip


def ppo_trainer(tmp_path, model_dir, warmup: int = 0, lr: float = 1e-3) -> Trainer:
    cfg = make_config(
        tmp_path, model_dir, micro_batch_size_per_gpu=6,
        algo="kl_loss_fn: none",
    )  # fmt: skip
    cfg.algorithm.algorithm_type = "ppo"
    cfg.trainer.critic.warmup_steps = warmup
    cfg.trainer.critic.optimizer.lr = lr
    cfg.trainer.critic.cliprange_value = 10.0  # let the values move freely in this test
    return Trainer(cfg, str(model_dir), total_steps=30)


def test_the_critic_learns_its_targets(tmp_path, tiny_model_dir) -> None:
    trainer = ppo_trainer(tmp_path, tiny_model_dir)
    assert trainer.critic is not None
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    losses = [trainer.train_step(exps)["critic/vf_loss"] for _ in range(12)]
    # γ = λ = 1 with an outcome reward: every token's return is the row's reward (0 or 1); the
    # zero-initialised head starts at V = 0, so the first loss is ½·mean(r²) over the tokens
    assert losses[0] == pytest.approx(0.5 * _mean_squared_reward(exps), rel=1e-5)
    assert losses[-1] < 0.1 * losses[0], losses  # measured: 0.146 -> 0.002 at step 12


def _mean_squared_reward(exps) -> float:
    tokens = [(e.reward or 0.0) ** 2 for e in exps for _ in range(e.response_length)]
    return sum(tokens) / len(tokens)


def test_critic_warmup_freezes_the_policy(tmp_path, tiny_model_dir) -> None:
    trainer = ppo_trainer(tmp_path, tiny_model_dir, warmup=2)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    policy = copy.deepcopy(trainer.model.state_dict())
    critic = copy.deepcopy(trainer.critic.model.state_dict())
    for _ in range(2):
        metrics = trainer.train_step(exps)
        assert "train/pg_loss" not in metrics and "critic/vf_loss" in metrics
    same = all(torch.equal(policy[k], v) for k, v in trainer.model.state_dict().items())
    assert same, "the policy moved during the critic's warm-up"
    moved = any(not torch.equal(critic[k], v) for k, v in trainer.critic.model.state_dict().items())
    assert moved
    metrics = trainer.train_step(exps)  # step 3: both update
    assert "train/pg_loss" in metrics
    assert any(not torch.equal(policy[k], v) for k, v in trainer.model.state_dict().items())


def test_the_critic_is_saved_and_resumed(tmp_path, tiny_model_dir) -> None:
    trainer = ppo_trainer(tmp_path, tiny_model_dir)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    trainer.train_step(experiences(vocab))
    folder = trainer.save_checkpoint(tmp_path / "ckpt", 1)
    assert (folder / CRITIC_WEIGHTS).exists()
    saved = copy.deepcopy(trainer.critic.model.state_dict())
    fresh = ppo_trainer(tmp_path, tiny_model_dir)
    fresh.resume(folder)
    for k, v in fresh.critic.model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert fresh.critic.optimizer.state_dict()["state"], "the critic's Adam moments came back"
