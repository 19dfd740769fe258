"""Trainer invariants: micro-batching is exact, parameters move, checkpoints load in transformers."""

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.algorithm.inputs import last_token_rewards
from trinity.common.experience import EID, Experience
from trinity.config import ConfigError, load_config
from trinity.trainer import trainer as trainer_module
from trinity.trainer.trainer import Trainer


def make_config(tmp_path, model_dir, **trainer_kw):
    agg = trainer_kw.pop("agg", None)
    algo = trainer_kw.pop("algo", "kl_loss_fn: k3")  # extra algorithm keys, inline YAML
    optim = trainer_kw.pop("optim", "")  # extra optimizer keys, inline YAML
    horizon = trainer_kw.pop("max_response_tokens", 8)
    trainer = ", ".join(f"{k}: {v}" for k, v in trainer_kw.items())
    p = tmp_path / "cfg.yaml"
    p.write_text(
        f"model: {{model_path: {model_dir}, max_response_tokens: {horizon}}}\n"
        f"algorithm: {{algorithm_type: grpo, repeat_times: 3, {algo}, "
        f"loss_agg_mode: {agg or 'token-mean'}, "
        f"optimizer: {{lr: 1.0e-2, weight_decay: 0.0{', ' + optim if optim else ''}}}}}\n"
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
    "agg",
    [
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ],
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


def test_training_state_is_released_when_training_is_over(tmp_path, tiny_model_dir):
    """After the last checkpoint the optimizer's moments and the gradients go; the weights stay
    exactly as trained (the final evaluation uses them)."""
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    trainer = Trainer(make_config(tmp_path, tiny_model_dir), str(tiny_model_dir), total_steps=10)
    trainer.train_step(experiences(vocab))
    moments = trainer.optimizer.state  # AdamW's exp_avg / exp_avg_sq per parameter
    assert len(moments) == len(list(trainer.model.parameters()))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.release_training_state()
    assert trainer.optimizer is None and trainer.scheduler is None
    assert all(p.grad is None for p in trainer.model.parameters())
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_several_updates_recompute_old_logprobs(tmp_path, tiny_model_dir):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=2, ppo_epochs=2, ppo_mini_batch_size=3
    )
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    m = trainer.train_step(experiences(vocab))
    assert "timing/train_old_logprob" in m  # a no-grad pass before the first update
    # 2 epochs x 2 mini-batches of 3 = 4 optimizer updates, but ONE lr-schedule step per train step
    assert trainer.scheduler.last_epoch == 1
    # after the first update the weights differ from the old ones, so the ratio moved off 1
    assert m["train/ppo_kl"] != 0.0


def record_update_lrs(trainer: Trainer) -> list[float]:
    """The lr of every optimizer update from now on (an optimizer step pre-hook)."""
    seen: list[float] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"])
    )
    return seen


def test_lr_schedule_counts_train_steps_not_updates(tmp_path, tiny_model_dir):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6, ppo_epochs=2, ppo_mini_batch_size=3,
        optim="lr_warmup_steps: 2, lr_scheduler_type: linear, min_lr_ratio: 0.1",
    )  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=5)
    seen = record_update_lrs(trainer)
    reported = [trainer.train_step(experiences(vocab, seed=s))["train/lr"] for s in range(5)]
    # 2 epochs x 2 mini-batches of 3 = 4 updates per train step, 5 train steps, lr 1e-2,
    # warm-up 2 train steps, then linear decay to 0.1 at train step 5 (progress (s-2)/(5-2)):
    #   s=0: 1/2 = 0.5    s=1: 2/2 = 1.0    s=2: 0.1 + 0.9·(1 - 0/3) = 1.0
    #   s=3: 0.1 + 0.9·(1 - 1/3) = 0.7      s=4: 0.1 + 0.9·(1 - 2/3) = 0.4 (the last step's value)
    factors = [0.5, 1.0, 1.0, 0.7, 0.4]
    expected = [1e-2 * f for f in factors for _ in range(4)]
    assert seen == pytest.approx(expected, rel=1e-12)
    # warm-up spans exactly 2 train steps: all 4 updates of step 0 at half the peak, the peak
    # first reached by step 1's first update (unfixed: by the 2nd update of step 0)
    assert seen[:4] == pytest.approx([0.5e-2] * 4) and seen[4] == pytest.approx(1e-2)
    # the last update of the last step is at the schedule's value for its last step (0.4·lr), and
    # the schedule's floor min_lr_ratio·lr = 1e-3 comes only after it (not 3/4 of the way through)
    assert seen[-1] == pytest.approx(0.4e-2)
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-3)
    assert reported == pytest.approx([1e-2 * f for f in factors])  # train/lr: the step's own lr


def test_kl_reward_penalty_keeps_the_outcome_reward(tmp_path, tiny_model_dir):
    # a hand-built batch: row 0's trailing token has action_mask 0, row 2 has no trained token
    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6,
        algo="kl_loss_fn: none, kl_penalty_fn: k1, kl_penalty_fn_args: {kl_coef: 0.0}",
    )  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=1)
    seen = {}
    advantage_fn = trainer.algo.advantage_fn

    def capture(inp, **kw):
        seen["rewards"] = inp.rewards.clone()
        return advantage_fn(inp, **kw)

    trainer.algo = dataclasses.replace(trainer.algo, advantage_fn=capture)

    def exp(run, reward, action_mask):
        n = len(action_mask)
        return Experience(
            tokens=torch.arange(3, 5 + n), prompt_length=2, logprobs=-torch.ones(n),
            reward=reward, action_mask=torch.tensor(action_mask, dtype=torch.bool),
            eid=EID(batch=1, task=0, run=run),
        )  # fmt: skip

    exps = [exp(0, 1.0, [1, 1, 0]), exp(1, 0.5, [1, 1, 1, 1]), exp(2, 2.0, [0, 0])]
    trainer.train_step(exps)
    # β = 0: shaping is the identity, so the advantage fn must see the outcome rewards unchanged;
    # unfixed, row 0's reward sat on its masked last token (lost → 0) and row 2's too (→ 0)
    assert seen["rewards"].tolist() == [1.0, 0.5, 2.0]


def test_outcome_token_rewards_by_hand():
    from trinity.algorithm import KL_PENALTY_FN

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.5, 2.0, 3.0])
    tok, trained = last_token_rewards(rewards, mask)
    # the reward sits on the last True of each mask row: t = 1, 3, none, 3
    assert tok.tolist() == [[0, 1.0, 0, 0], [0, 0, 0, 0.5], [0, 0, 0, 0], [0, 0, 0, 3.0]]
    assert trained.tolist() == [True, True, False, True]
    # k1 penalty with β = 0.1 and kl_t = logπ - logπ_ref = 0.5 on every token:
    #   row 0: 1.0 - 0.1·0.5·2 = 0.9;  row 1: 0.5 - 0.1·0.5·4 = 0.3;  row 3: 3.0 - 0.1·0.5·2 = 2.9
    lp, ref = torch.full((4, 4), -1.0), torch.full((4, 4), -1.5)
    shaped, _ = KL_PENALTY_FN.get("k1")(tok, lp, ref, mask, kl_coef=0.1)
    summed = (shaped * mask).sum(dim=1)
    torch.testing.assert_close(summed[trained], torch.tensor([0.9, 0.3, 2.9]), rtol=0, atol=1e-6)


def test_sum_norm_horizon_is_fixed_across_mini_batches(tmp_path, tiny_model_dir, monkeypatch):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    built = []

    class Recording(trainer_module.Aggregator):
        def __post_init__(self):
            super().__post_init__()
            built.append(self)

    monkeypatch.setattr(trainer_module, "Aggregator", Recording)
    cfg = make_config(
        tmp_path, tiny_model_dir, micro_batch_size_per_gpu=6, ppo_mini_batch_size=3,
        agg="seq-mean-token-sum-norm", max_response_tokens=8,
    )  # fmt: skip
    exps = experiences(vocab)
    lengths = [e.response_length for e in exps]
    # two mini-batches of 3 whose longest responses differ (so the old per-batch L differed too)
    assert max(lengths[:3]) != max(lengths[3:])
    Trainer(cfg, str(tiny_model_dir), total_steps=1).train_step(exps)
    assert [a.norm_length for a in built] == [8.0, 8.0]  # L = model.max_response_tokens


def test_sum_norm_without_max_response_tokens_is_a_config_error(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="max_response_tokens"):
        make_config(
            tmp_path, tiny_model_dir, agg="seq-mean-token-sum-norm", max_response_tokens="null"
        )
    make_config(tmp_path, tiny_model_dir, agg="token-mean", max_response_tokens="null")  # fine


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_excluded_rows_leave_the_sequence_count(tmp_path, tiny_model_dir, agg: str) -> None:
    """A row kept out of training (mask zeroed) adds nothing and is no sequence: every
    micro-batch's loss is scaled by N_seqs = 5 of the 6 rows."""
    from trinity.workflows.base import exclude_from_training

    cfg = make_config(tmp_path, tiny_model_dir, micro_batch_size_per_gpu=2, agg=agg,
                      use_dynamic_bsz="false", algo="kl_loss_fn: none")  # fmt: skip
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    exclude_from_training(exps[4:5], "test")
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    seen = []
    loss_fn = trainer.algo.policy_loss_fn

    def capture(inp, **kw):
        seen.append(kw["agg"].num_seqs)
        return loss_fn(inp, **kw)

    trainer.algo = dataclasses.replace(trainer.algo, policy_loss_fn=capture)
    trainer.train_step(exps)
    assert set(seen) == {5.0}
