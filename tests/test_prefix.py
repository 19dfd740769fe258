"""Shared prompt prefixes (trinity/trainer/prefix.py): the split by hand, the shared passes equal
one pass (values and gradients, fp64), the trainer uses them where they pay and only there."""

import copy

import pytest
import torch
from test_trainer import make_config
from transformers import AutoModelForCausalLM

from trinity.common.experience import EID, Experience
from trinity.trainer import logprobs as logprobs_mod
from trinity.trainer.batch import collate
from trinity.trainer.logprobs import response_logprobs
from trinity.trainer.prefix import split_prefixes, worth_sharing
from trinity.trainer.trainer import Trainer, enable_checkpointing


def exp(prompt: list[int], response: list[int], task: int = 0, run: int = 0) -> Experience:
    return Experience(
        tokens=torch.tensor(prompt + response),
        prompt_length=len(prompt),
        logprobs=-torch.rand(len(response)),
        reward=float(run % 2),
        eid=EID(batch=1, task=task, run=run),
    )


def test_split_by_hand():
    # rows 0 and 1 share the prompt [5 6 7 8]; row 2's prompt [5 6 8] starts the same way but
    # its prefix (all but the last prompt token) [5 6] is shorter; row 3 has no response
    rows = [
        exp([5, 6, 7, 8], [20, 21]),
        exp([5, 6, 7, 8], [22]),
        exp([5, 6, 8], [23, 24, 25]),
        exp([9, 9], []),
    ]
    batch = collate(rows, pad_id=0)
    s = split_prefixes(batch.input_ids, batch.attention_mask, batch.valid_mask.sum(dim=1))
    assert s is not None
    # distinct prefixes [5 6 7], [5 6], [9]; torch.unique orders them: [5 6 -1] < [5 6 7] < [9 -1 -1]
    assert s.inverse.tolist() == [1, 1, 0, 2]
    assert s.prefix_ids.tolist() == [[0, 5, 6], [5, 6, 7], [0, 0, 9]]  # left-padded
    assert s.prefix_mask.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    # suffix = the last prompt token, then the response but its last token (it predicts
    # nothing); right-padded to the longest (3); row 3 has nothing to predict: all padding
    assert s.suffix_ids.tolist() == [[8, 20, 0], [8, 0, 0], [8, 23, 24], [0, 0, 0]]
    assert s.suffix_mask.sum(dim=1).tolist() == [2, 1, 3, 0]
    assert s.suffix_start.tolist() == [3, 3, 2, 1]  # the position of the last prompt token
    assert s.positions == 3 * 3 + 4 * 3  # against one pass's 4 rows × 5 columns (all but last)


def test_one_token_prompt_and_distinct_prompts_take_one_pass():
    batch = collate([exp([5], [6, 7]), exp([5], [8])], pad_id=0)
    assert split_prefixes(batch.input_ids, batch.attention_mask, batch.valid_mask.sum(1)) is None
    # 4 distinct 6-token prompts, 3-token replies: 4·5 + 4·3 = 32 positions of one pass's 32
    # (4 rows × 8 columns, the last of 9 left out)
    rows = [exp([i] * 6, [1, 2, 3], task=i) for i in range(4)]
    batch = collate(rows, pad_id=0)
    split = split_prefixes(batch.input_ids, batch.attention_mask, batch.valid_mask.sum(1))
    assert split is not None and split.positions == 32
    assert not worth_sharing(split, batch.input_ids[:, :-1].numel())


def grpo_batch(vocab: int, seed: int = 0):
    """3 tasks × 4 samples: prompts of 7, 3 and 12 tokens, replies of 0 to 6 tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for task, plen in enumerate((7, 3, 12)):
        prompt = torch.randint(3, vocab, (plen,), generator=g).tolist()
        for run in range(4):
            r = int(torch.randint(0, 7, (1,), generator=g)) if run else 6
            rows.append(exp(prompt, torch.randint(3, vocab, (r,), generator=g).tolist(), task, run))
    return rows


@pytest.mark.parametrize("lean", [False, True])
def test_shared_prefix_equals_one_pass(tiny_model_dir, monkeypatch, lean):
    """Logprobs, entropy and every parameter's gradient of the shared passes match one pass, and
    the shared passes did run. The model is fp64, but Qwen2's RMSNorm computes in fp32, so the
    two orders of summation differ at fp32's rounding: measured 5e-8 at most, relative to a
    parameter's gradient norm. A gradient that missed a shared prefix's other rows would be off
    by about its own size."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).double()
    batch = collate(grpo_batch(model.config.vocab_size), pad_id=0)
    shared = []
    real = logprobs_mod.shared_prefix_forward
    monkeypatch.setattr(
        logprobs_mod, "shared_prefix_forward", lambda *a: shared.append(1) or real(*a)
    )
    g = torch.Generator().manual_seed(1)
    up_lp = torch.randn(batch.valid_mask.shape, generator=g, dtype=torch.float64)
    up_ent = torch.randn(batch.valid_mask.shape, generator=g, dtype=torch.float64)
    out = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, batch, chunk_size=5, lean=lean, share_prefix=share)
        ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            nograd, _ = response_logprobs(model, batch, with_entropy=False, share_prefix=share)
        out.append((lp.detach(), ent.detach(), grads, nograd))
    assert len(shared) == 2  # with and without gradients
    (lp0, ent0, g0, n0), (lp1, ent1, g1, n1) = out
    tol = dict(rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(lp1, lp0, **tol)
    torch.testing.assert_close(ent1, ent0, **tol)
    torch.testing.assert_close(n1, n0, **tol)
    assert (lp1[~batch.valid_mask] == 0).all()  # padding and the empty reply stay zero
    for name in g0:
        assert float((g1[name] - g0[name]).norm() / g0[name].norm()) < 1e-6, name


def test_gradient_checkpointing_takes_one_pass(tiny_model_dir, monkeypatch):
    """A checkpointed layer drops the KV cache in a training forward: one pass under gradients;
    a no-grad pass (reference, old logprobs) still shares."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    enable_checkpointing(model)
    model.train()
    batch = collate(grpo_batch(model.config.vocab_size), pad_id=0)
    shared = []
    real = logprobs_mod.shared_prefix_forward
    monkeypatch.setattr(
        logprobs_mod, "shared_prefix_forward", lambda *a: shared.append(1) or real(*a)
    )
    lp, _ = response_logprobs(model, batch)
    lp.sum().backward()
    assert shared == []
    with torch.no_grad():
        response_logprobs(model, batch, with_entropy=False)
    assert shared == [1]


def test_train_step_shares_prefixes_and_lands_where_one_pass_does(
    tmp_path, tiny_model_dir, monkeypatch
):
    """GRPO with a k3 KL loss: the reference pass and the update share prefixes (a shared pass
    per micro-batch each: 12 rows, micro-batches of 8, so 4 per step; the second micro-batch is
    one task's 4 samples), `trainer.share_prompt_prefix: false` turns them off, and one step
    lands on the same parameters and losses either way."""
    calls = []
    real = logprobs_mod.shared_prefix_forward
    monkeypatch.setattr(
        logprobs_mod, "shared_prefix_forward", lambda *a: calls.append(1) or real(*a)
    )
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    rows = grpo_batch(vocab)
    after, metrics = [], []
    for on in ("false", "true"):
        calls.clear()
        cfg = make_config(tmp_path, tiny_model_dir, share_prompt_prefix=on)
        trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
        metrics.append(trainer.train_step(copy.deepcopy(rows)))
        assert len(calls) == (4 if on == "true" else 0)
        after.append(trainer.model.state_dict())
    for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-7), key
    # Adam's first step moves an entry by about lr·g/(|g|+eps), so entries whose gradient is
    # rounding noise (see test_lean_head's same check) may move differently; a wrong gradient
    # would move most entries by ~lr (1e-2)
    diffs = torch.cat([(after[1][k] - after[0][k]).abs().flatten() for k in after[0]])
    assert int((diffs > 1e-4).sum()) <= diffs.numel() // 10_000
    assert float(diffs.median()) < 1e-7
