"""Ulysses sequence parallelism (`trainer.ulysses_sequence_parallel_size`): the all-to-all
attention over 2 gloo ranks equals one process's attention on the whole sequence, forward and
backward; ranks' coordinates; models that cannot be split are refused by name."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray.cloudpickle
import torch
import torch.multiprocessing as mp

from trinity.trainer.parallel import Ranks

# the probes below run inside the rank actors, which cannot import this module
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# tiny GQA attention: 4 query heads over 2 key/value heads, head dim 8, 10 positions (5 a rank)
B, HEADS, KV, D, T = 2, 4, 2, 8, 10


def _attention_module():
    """A real transformers attention module (its `num_key_value_groups`, `is_causal` and
    module-level `eager_attention_forward` are what the wrapper reads)."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = Qwen2Config(
        hidden_size=HEADS * D, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D
    )
    return Qwen2Attention(config, 0)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, HEADS, T, D], k and v [B, KV, T, D] and an upstream gradient [B, T, HEADS, D] of
    the attention output (the same on every rank: seeded)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, HEADS, T, D, generator=g, dtype=torch.float64).float()
    k = torch.randn(B, KV, T, D, generator=g, dtype=torch.float64).float()
    v = torch.randn(B, KV, T, D, generator=g, dtype=torch.float64).float()
    return q, k, v, torch.randn(B, T, HEADS, D, generator=g)


def _one_process(q, k, v, up, inner: str):
    """One process's attention on the whole sequence, as a transformers model runs it: the
    `inner` attention function on q, k, v with the model's causal mask for the whole sequence
    (sdpa: none, its causal kernel; eager: transformers' additive mask); (output [B, T, HEADS,
    D], gradients of q, k, v under the upstream gradient `up`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import create_causal_mask
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    module = _attention_module()
    module.config._attn_implementation = inner
    mask = create_causal_mask(module.config, torch.empty(B, T, 1), None, None)
    fn = eager_attention_forward if inner == "eager" else AttentionInterface._global_mapping[inner]
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, _ = fn(module, q, k, v, mask, dropout=0.0, scaling=D**-0.5)
    (out * up).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _written_out(q, k, v):
    """The causal attention written out, as an oracle of the one-process reference:
    softmax(q k^T / sqrt(D) + causal) v, each key/value head shared by 2 query heads."""
    kk, vv = (t.repeat_interleave(HEADS // KV, dim=1) for t in (k, v))
    scores = q @ kk.transpose(-1, -2) / D**0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ vv).transpose(1, 2)  # [B, T, HEADS, D]


def _attention_rank(rank: int, world: int, store: str, inner: str, queue: Any) -> None:
    """Rank `rank` of 2: its slice of q, k, v through `ulysses_attention` (wrapping `inner`),
    backward from its slice of the upstream gradient; sends (output, q, k, v gradients)."""
    import functools

    import torch.distributed as dist

    from trinity.trainer.sequence_parallel import ulysses_attention

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        module = _attention_module()
        q, k, v, up = _inputs()
        cut = slice(rank * T // world, (rank + 1) * T // world)
        mine = [t[:, :, cut].clone().requires_grad_(True) for t in (q, k, v)]
        attend = functools.partial(ulysses_attention, inner=inner, group=dist.group.WORLD)
        out, _ = attend(module, *mine, None, dropout=0.0, scaling=D**-0.5)
        (out * up[:, cut]).sum().backward()
        # numpy arrays travel by value (a tensor would be shared by a descriptor of this process)
        queue.put((rank, out.detach().numpy(), *(t.grad.numpy() for t in mine)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("inner", ["sdpa", "eager"])
def test_ulysses_attention_equals_one_process_forward_and_backward(tmp_path, inner):
    """Each rank's output slice and its slices' gradients of q, k, v equal one process's on
    the whole sequence within 1e-6 (fp32): the all-to-alls only move data."""
    # each rank's few KB fit the pipe: the ranks exit before they are read, and a rank that
    # fails raises here (join) instead of leaving the test waiting for its results
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _attention_rank,
        args=(2, str(tmp_path / "store"), inner, queue),
        nprocs=2,
        start_method="spawn",
    )
    results = sorted((queue.get() for _ in range(2)), key=lambda r: r[0])
    out, dq, dk, dv = _one_process(*_inputs(), inner)
    torch.testing.assert_close(out, _written_out(*_inputs()[:3]), rtol=0, atol=1e-5)
    for rank, *arrays in results:
        r_out, r_dq, r_dk, r_dv = (torch.from_numpy(a) for a in arrays)
        cut = slice(rank * T // 2, (rank + 1) * T // 2)
        torch.testing.assert_close(r_out, out[:, cut], rtol=0, atol=1e-6)
        torch.testing.assert_close(r_dq, dq[:, :, cut], rtol=0, atol=1e-6)
        torch.testing.assert_close(r_dk, dk[:, :, cut], rtol=0, atol=1e-6)
        torch.testing.assert_close(r_dv, dv[:, :, cut], rtol=0, atol=1e-6)


def test_ranks_split_rows_over_data_parallel_groups_and_sequences_within():
    """World 4, sp 2: ranks 0-1 and 2-3 are the two data-parallel groups; both ranks of a group
    take the same rows (5 rows: 3 and 2), and the first of each group leads."""
    ranks = [Ranks(r, 4, 2) for r in range(4)]
    assert [(r.dp_rank, r.sp_rank, r.leads) for r in ranks] == [
        (0, 0, True),
        (0, 1, False),
        (1, 0, True),
        (1, 1, False),
    ]
    assert [r.rows(5).tolist() for r in ranks] == [[0, 1, 2], [0, 1, 2], [3, 4], [3, 4]]
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size 3 must divide"):
        Ranks(0, 4, 3)


def test_sequence_slices_pad_to_a_multiple_of_the_group():
    """9 columns over 2 ranks: padded to 10, columns 0-4 and 5-9."""
    from trinity.trainer.sequence_parallel import SequenceSlice

    cuts = [SequenceSlice.of(9, Ranks(r, 2, 2)) for r in range(2)]
    assert [(c.start, c.length, c.padded) for c in cuts] == [(0, 5, 10), (5, 5, 10)]


def test_a_model_whose_heads_do_not_split_is_refused_by_name(tiny_model_dir):
    """A model of 5 attention heads and 1 key/value head cannot be split over 2 ranks: the
    trainer's build fails naming the key and the numbers, before any collective."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trinity.trainer.sequence_parallel import use_sequence_parallel

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 5, 1, 16
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(
        ValueError,
        match=r"ulysses_sequence_parallel_size 2 must divide the model's attention heads \(5\) "
        r"and key/value heads \(1\)",
    ):
        use_sequence_parallel(model, Ranks(0, 2, 2))


# -- the trainer: sp ranks make the updates of one process ----------------------------------


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="sp")
    yield
    ray.shutdown()


def sp_experiences(vocab: int) -> list:
    """test_trainer's first 5 experiences (odd lengths: 2-5 prompt and 1-6 response tokens),
    the last replaced by a 9-token prompt with a 1-token response: alone in its micro-batch
    (2 rows each), its 9 columns split 5 + 5 (padded), its one response token predicted from
    column 8, so the first rank's slice holds no response token at all."""
    import dataclasses

    from tests.test_trainer import experiences

    exps = experiences(vocab)[:5]
    g = torch.Generator().manual_seed(1)
    exps[4] = dataclasses.replace(
        exps[4], tokens=torch.randint(3, vocab, (10,), generator=g), prompt_length=9,
        logprobs=-torch.rand(1, generator=g), action_mask=None,
    )  # fmt: skip
    return exps


SP_FIXED = {
    "micro_batch_size_per_gpu": 2,
    "use_dynamic_bsz": "false",
    "trainer_strategy": "fsdp2",
    "ulysses_sequence_parallel_size": 2,
}
SP_CASES = {
    # world 2, sp 2 (one data-parallel group): GRPO with a k3 KL loss (a sequence-parallel
    # reference model too), 3 micro-batches, the last with nothing on rank 0's slice
    "world2_grpo_kl": (2, "grpo", {**SP_FIXED, "world_size": 2}),
    # world 4, sp 2: two data-parallel groups (3 and 2 rows), token-packed micro-batches,
    # seq-mean aggregation over whole-batch counts
    "world4_token_budget_seq_mean": (
        4,
        "grpo",
        {
            **SP_FIXED,
            "world_size": 4,
            "use_dynamic_bsz": "true",
            "max_token_len_per_gpu": 8,
            "agg": "seq-mean-token-mean",
        },
    ),
    # PPO: a sequence-parallel critic, its values and its update
    "world2_ppo_critic": (2, "ppo", {**SP_FIXED, "world_size": 2, "algo": "kl_loss_fn: none"}),
    # activation checkpointing recomputes the all-to-alls in backward; the lean LM head
    "world2_checkpointing_lean_head": (
        2,
        "grpo",
        {
            **SP_FIXED,
            "world_size": 2,
            "enable_gradient_checkpointing": "true",
            "lean_lm_head": "true",
        },
    ),
}


def _sequence_place(rank) -> tuple[int, int, str]:
    """A rank actor's (data-parallel group, place in its sequence-parallel group, attention)."""
    t = rank.trainer
    return t.ranks.dp_rank, t.ranks.sp_rank, t.model.config._attn_implementation


@pytest.mark.parametrize(
    "case",
    [c if c == "world2_grpo_kl" else pytest.param(c, marks=pytest.mark.long) for c in SP_CASES],
)
def test_sequence_parallel_ranks_make_the_updates_of_one_process(
    tmp_path, tiny_model_dir, ray_instance, case
):
    """Gradients of the first step within 1e-6 of one process's, parameters after 3 steps
    within 1e-4, the same losses."""

    from transformers import AutoModelForCausalLM

    from tests.test_fsdp import assert_same_updates, config, one_process_run, sharded

    world, algorithm_type, kw = SP_CASES[case]
    cfg = config(tmp_path, tiny_model_dir, algorithm_type, **kw)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = sp_experiences(vocab)
    single, m1, g1 = one_process_run(cfg, tiny_model_dir, exps, 3)
    st = sharded(cfg, tiny_model_dir, world)
    # every rank splits its sequences: its place in a group of 2, its attention the wrapper
    placed = [ray.get(r.__ray_call__.remote(_sequence_place)) for r in st.ranks]
    assert placed == [(r // 2, r % 2, "trinity_ulysses_sdpa") for r in range(world)]
    assert_same_updates(st, exps, single, m1, g1, ("train/kl_loss",))
    st.close()


@pytest.mark.slow  # a whole run on 2 ranks
def test_trinity_run_trains_with_sequence_parallelism(tmp_path, tiny_model_dir):
    """`trinity run` (mode both) with 2 ranks per sequence: the plan names the groups and every
    step trains."""
    from tests.test_fsdp import fsdp_run, trained_steps

    out, run_dir = fsdp_run(tmp_path, tiny_model_dir, "trainer.ulysses_sequence_parallel_size=2")
    groups = "(1 data-parallel group of 2 ranks, each sequence split over a group)"
    assert f"trainer: fsdp2 over 2 ranks {groups}: rank 0" in out
    assert "ranks per sequence 2 (trainer.ulysses_sequence_parallel_size" in out
    assert trained_steps(run_dir) == [1, 2, 3]


@pytest.mark.long  # 2 ranks and one process, 2 steps each
def test_a_lora_adapter_trained_with_sequence_parallelism_is_one_process_s(
    tmp_path, tiny_model_dir, ray_instance
):
    """LoRA (the reference: the adapter switched off) on 2 ranks per sequence: the adapter
    after 2 steps equals one process's within 1e-5."""
    import copy

    from transformers import AutoModelForCausalLM

    from tests.test_fsdp import sharded
    from tests.test_lora import lora_config
    from trinity.config import load_config
    from trinity.sync.method import sync_method
    from trinity.trainer.trainer import Trainer

    lora_config(tmp_path, tiny_model_dir)
    path = tmp_path / "cfg.yaml"
    sp = "trainer_strategy: fsdp2, world_size: 2, ulysses_sequence_parallel_size: 2"
    path.write_text(
        path.read_text().replace(
            "micro_batch_size_per_gpu: 6", f"{sp}, micro_batch_size_per_gpu: 2"
        )
    )
    cfg = load_config(path)
    exps = sp_experiences(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)
    one = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    st = sharded(cfg, tiny_model_dir)
    for _ in range(2):
        one.train_step(copy.deepcopy(exps))
        st.train_step(copy.deepcopy(exps))
    got = sync_method("memory").receive(st.publish("memory", 2, None)[1])
    st.close()
    want = one.sync_state()
    assert set(got) == set(want)
    for k, t in want.items():
        torch.testing.assert_close(got[k], t, rtol=0, atol=1e-5)
