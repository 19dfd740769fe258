"""A sharded trainer (`trainer_strategy: fsdp2`, ranks as Ray actors over gloo) makes the updates
one process makes, checkpoints that resume bit-exactly at its own world size and load at
another, and publishes the whole weights."""

import copy
import sys

import pytest
import ray
import ray.cloudpickle
import torch
from transformers import AutoModelForCausalLM

from tests.test_trainer import experiences, make_config
from trinity.config import load_config
from trinity.sync.method import sync_method
from trinity.trainer.ranks import ShardedTrainer
from trinity.trainer.trainer import Trainer

# the probes below run inside the rank actors, which cannot import this module
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="fsdp")
    yield
    ray.shutdown()


def _full_grads(rank):
    """Every parameter's whole gradient (a collective: call it on every rank)."""
    return {
        n: p.grad.full_tensor().clone()
        for n, p in rank.trainer.model.named_parameters()
        if p.grad is not None
    }


def _full_optimizer(rank):
    """The optimizer state keyed by parameter name, whole (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    t = rank.trainer
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(t.model, t.optimizer, options=opts).get("state", {})


def on_ranks(sharded, fn):
    """`fn(rank_actor_object)` on every rank at once; rank 0's result."""
    return ray.get([r.__ray_call__.remote(fn) for r in sharded.ranks])[0]


def sharded(cfg, model_dir, world=2):
    return ShardedTrainer(cfg, str(model_dir), 10, world, 1, 1, 0)


def weights(st):
    _, payload = st.publish("memory", 0, None)
    return sync_method("memory").receive(payload)


def values(metrics):
    """A step's metrics without its timings and memory."""
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith(("timing/", "memory/")) and not k.endswith("_per_s")
    }


def one_process_run(cfg, model_dir, exps, steps):
    trainer = Trainer(cfg, str(model_dir), total_steps=10)
    metrics, grads = [], None
    for _ in range(steps):
        metrics.append(trainer.train_step(copy.deepcopy(exps)))
        if grads is None:
            grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    return trainer, metrics, grads


def config(tmp_path, model_dir, algorithm_type="grpo", **kw):
    """test_trainer's config (GRPO, a k3 KL loss) with another algorithm type, lr 1e-3.

    At test_trainer's lr 1e-2 the weights after 3 steps differ by up to 1.5e-4 in 1 of 57,344
    elements: Adam divides a near-zero gradient by its own magnitude, so a rounding difference
    of 1e-9 in it (the ranks sum the same terms in another order) moves the weight by up to lr;
    the gradients themselves agree within 1e-6."""
    make_config(tmp_path, model_dir, **kw)
    path = tmp_path / "cfg.yaml"
    text = path.read_text().replace("grpo", algorithm_type, 1).replace("lr: 1.0e-2", "lr: 1.0e-3")
    path.write_text(text)
    return load_config(path)


FIXED = {"micro_batch_size_per_gpu": 2, "use_dynamic_bsz": "false"}
CASES = {
    # 5 rows over 2 ranks, 2 rows per micro-batch: rank 0 runs 2 micro-batches, rank 1 one and
    # an idle one; the KL loss brings a sharded reference model
    "grpo_kl_idle_micro_batch": ("grpo", FIXED, 5),
    # token-packed micro-batches, seq-mean aggregation (whole-batch sequence counts)
    "token_budget_seq_mean": (
        "grpo",
        {"use_dynamic_bsz": "true", "max_token_len_per_gpu": 16, "agg": "seq-mean-token-mean"},
        6,
    ),
    # PPO: a sharded critic, its values and its update
    "ppo_critic": ("ppo", {**FIXED, "algo": "kl_loss_fn: none"}, 6),
    # activation checkpointing inside the sharded layers, the lean LM head inside the root pass
    "checkpointing_lean_head": (
        "grpo",
        {**FIXED, "enable_gradient_checkpointing": "true", "lean_lm_head": "true"},
        6,
    ),
}


# the first case runs in `make test`; the others with the slow tests (each starts 2 ranks)
@pytest.mark.parametrize(
    "case",
    [
        c if c == "grpo_kl_idle_micro_batch" else pytest.param(c, marks=pytest.mark.long)
        for c in CASES
    ],
)
def test_two_ranks_make_the_updates_of_one_process(tmp_path, tiny_model_dir, case):
    algorithm_type, kw, rows = CASES[case]
    cfg = config(tmp_path, tiny_model_dir, algorithm_type, **kw)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)[:rows]
    single, m1, g1 = one_process_run(cfg, tiny_model_dir, exps, 3)
    st = sharded(cfg, tiny_model_dir)
    assert_same_updates(st, exps, single, m1, g1, ("train/grad_norm",))
    st.close()


def assert_same_updates(st, exps, single, m1, g1, extra_keys=()) -> None:
    """Three steps of the sharded trainer `st` on `exps` against one process's (`single`, its
    metrics `m1` and first gradients `g1`): gradients of the first step within 1e-6 (a sum over
    ranks of the same terms), parameters after 3 steps within 1e-4, the same losses."""
    m2 = [st.train_step(copy.deepcopy(exps))]
    g2 = on_ranks(st, _full_grads)
    m2 += [st.train_step(copy.deepcopy(exps)) for _ in range(2)]
    assert set(g2) == set(g1)
    for n in g1:
        torch.testing.assert_close(g2[n], g1[n], rtol=0, atol=1e-6, msg=n)
    w2, w1 = weights(st), single.model.state_dict()
    for n, t in w2.items():
        torch.testing.assert_close(t, w1[n], rtol=0, atol=1e-4)
    for a, b in zip(m1, m2, strict=True):
        for k in ("train/loss", "train/pg_loss", "critic/vf_loss", *extra_keys):
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


@pytest.mark.slow  # two sharded runs and a reload (about 20 s on 2 cores)
def test_a_sharded_checkpoint_resumes_bit_exactly_and_loads_at_another_world_size(
    tmp_path, tiny_model_dir
):
    """2 ranks: step, checkpoint, 2 more steps. A new pair of ranks resumed from the checkpoint
    makes the same 2 steps bit for bit; one process resumed from it holds the same weights and
    optimizer state; the checkpoint's weights load in transformers."""
    cfg = config(tmp_path, tiny_model_dir, **FIXED)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)[:5]
    a = sharded(cfg, tiny_model_dir)
    a.train_step(copy.deepcopy(exps))
    ckpt = a.save_checkpoint(tmp_path / "ckpt", 1, leases=[7])
    saved_weights, saved_optim = weights(a), on_ranks(a, _full_optimizer)
    after_a = [a.train_step(copy.deepcopy(exps)) for _ in range(2)]
    final_a = weights(a)
    a.close()
    assert (ckpt / "optimizer").is_dir() and (ckpt / "checkpoint_manifest.json").is_file()
    # the Hugging Face export is the gathered weights
    export = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    for n, t in saved_weights.items():
        assert torch.equal(export[n], t), n
    # the same world size: bit-exact
    b = sharded(cfg, tiny_model_dir)
    assert b.resume(ckpt)["step"] == 1
    after_b = [b.train_step(copy.deepcopy(exps)) for _ in range(2)]
    final_b = weights(b)
    b.close()
    assert [values(m) for m in after_b] == [values(m) for m in after_a]
    assert all(torch.equal(final_b[n], t) for n, t in final_a.items())
    # one process: the same weights and optimizer moments, each tensor whole
    one = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    one.resume(ckpt)
    for n, t in saved_weights.items():
        assert torch.equal(one.model.state_dict()[n], t), n
    by_name = {n: one.optimizer.state[p] for n, p in one.model.named_parameters()}
    assert set(by_name) == set(saved_optim)
    for n, state in saved_optim.items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(by_name[n][k], state[k]), (n, k)


@pytest.mark.slow  # 2 ranks started again
def test_a_one_process_checkpoint_resumes_on_two_ranks(tmp_path, tiny_model_dir):
    """A `torch` trainer's checkpoint (optimizer state by parameter index in trainer_state.pt)
    resumes on 2 ranks: the same next step as the one process resumed from it."""
    cfg = config(tmp_path, tiny_model_dir, **FIXED)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    one = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    one.train_step(copy.deepcopy(exps))
    ckpt = one.save_checkpoint(tmp_path / "ckpt", 1)
    assert not (ckpt / "optimizer").exists()
    expected = one.train_step(copy.deepcopy(exps))
    st = sharded(cfg, tiny_model_dir)
    st.resume(ckpt)
    got = st.train_step(copy.deepcopy(exps))
    for n, t in weights(st).items():
        torch.testing.assert_close(t, one.model.state_dict()[n], rtol=0, atol=1e-6)
    st.close()
    assert got["train/loss"] == pytest.approx(expected["train/loss"], abs=1e-6)


@pytest.mark.slow  # 2 ranks per method
@pytest.mark.parametrize("method", ["memory", pytest.param("checkpoint", marks=pytest.mark.long)])
def test_a_sharded_trainer_publishes_the_gathered_weights(tmp_path, tiny_model_dir, method):
    """What an engine receives is every parameter, whole (the tied LM head once), and the bytes
    the publish reports are theirs."""
    cfg = config(tmp_path, tiny_model_dir, **FIXED)
    st = sharded(cfg, tiny_model_dir)
    nbytes, payload = st.publish(method, 1, tmp_path / "sync")
    got = sync_method(method).receive(payload)
    st.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = {n: p for n, p in model.state_dict().items() if n != "lm_head.weight"}
    assert model.config.tie_word_embeddings and set(got) == set(expected)
    assert all(torch.equal(got[n], t) for n, t in expected.items())
    assert nbytes == sum(t.numel() * t.element_size() for t in expected.values())


def fsdp_run(tmp_path, model_dir, *sets, env=None):
    from tests.test_e2e import grpo_config, run_trinity

    cfg = grpo_config(tmp_path, model_dir)
    base = ["trainer.trainer_strategy=fsdp2", "trainer.world_size=2", "trainer.save_interval=1"]
    r = run_trinity(cfg, env, overrides=[*base, *sets], timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return " ".join(r.stdout.split()), tmp_path / "ckpt" / "e2e" / "grpo"


def trained_steps(run_dir):
    import json

    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in recs if "train/loss" in r]


@pytest.mark.slow  # 2 ranks started again
def test_trinity_run_trains_on_two_ranks(tmp_path, tiny_model_dir):
    """`trinity run` (mode both) with a 2-rank trainer: the plan is printed, every step trains,
    and each checkpoint holds both ranks' optimizer shards."""
    out, run_dir = fsdp_run(tmp_path, tiny_model_dir)
    assert "trainer: fsdp2 over 2 ranks: rank 0 on node" in out and "rank 1 on node" in out
    assert "trainer ranks 2 (trainer.world_size)" in out
    assert trained_steps(run_dir) == [1, 2, 3]
    shards = sorted(p.name for p in (run_dir / "global_step_3" / "optimizer").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.long  # two runs
def test_a_two_rank_run_continues_on_one_rank(tmp_path, tiny_model_dir):
    """A run of 2 steps on 2 ranks, continued to 4 steps on 1 rank (fsdp2, world 1) from its
    checkpoint: the continued run trains steps 3 and 4 only."""
    _, run_dir = fsdp_run(tmp_path, tiny_model_dir, "buffer.total_steps=2")
    out, _ = fsdp_run(
        tmp_path, tiny_model_dir, "buffer.total_steps=4", "trainer.world_size=1",
        "continue_from_checkpoint=true",
    )  # fmt: skip
    assert "trainer: fsdp2 over 1 ranks" in out
    assert trained_steps(run_dir) == [1, 2, 3, 4]


@pytest.mark.long  # a topology: a two-node Ray cluster
def test_trainer_ranks_go_to_different_nodes(tmp_path, tiny_model_dir):
    """Two nodes (two raylets on this machine, as Ray's own tests build them), `node_num: 2`:
    rank 0 and rank 1 of the trainer run on different nodes, and the run trains."""
    import os
    import re
    import tempfile
    from pathlib import Path

    from ray.cluster_utils import Cluster

    ray_tmp = Path(tempfile.mkdtemp(prefix="rf", dir="/tmp"))  # short: Ray's socket paths
    env = {"RAY_TMPDIR": str(ray_tmp)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ids = {cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)}
        out, run_dir = fsdp_run(
            tmp_path, tiny_model_dir, "cluster.node_num=2", "buffer.total_steps=2",
            f"cluster.ray_address={cluster.address}", "buffer.explorer_input.eval_tasksets=[]",
            env=env,
        )  # fmt: skip
        placed = re.search(r"rank 0 on node (\w+) .*?rank 1 on node (\w+) ", out)
        assert placed, out[-3000:]
        first, second = placed.groups()
        assert first != second
        assert all(any(i.startswith(p) for i in ids) for p in (first, second)), (ids, placed)
        assert trained_steps(run_dir) == [1, 2]
    finally:
        cluster.shutdown()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_a_failing_rank_stops_every_rank_at_once(tmp_path, tiny_model_dir):
    """A token id out of the vocabulary in rank 1's rows fails rank 1's forward while rank 0
    waits for it in a collective: the step raises rank 1's error at once (not after the
    process group's 10-minute timeout), and the ranks are stopped."""
    import time

    cfg = config(tmp_path, tiny_model_dir, **FIXED)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)
    exps[-1].tokens[0] = vocab + 5  # rows 3-5 are rank 1's
    st = sharded(cfg, tiny_model_dir)
    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayTaskError, match=r"IndexError|index out of range"):
        st.train_step(exps)
    assert time.monotonic() - t0 < 60
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        st.train_step(experiences(vocab))


@pytest.mark.slow  # 2 ranks, twice
def test_lora_on_two_ranks_trains_and_syncs_the_adapter_of_one_process(tmp_path, tiny_model_dir):
    """LoRA under FSDP2: the adapter 2 ranks train equals one process's (1e-5 after 2 steps),
    only the adapter is published, and a sharded checkpoint's adapter loads in peft and resumes
    on 2 ranks with the same next step."""
    from peft import PeftModel

    from tests.test_lora import lora_config

    cfg = lora_config(tmp_path, tiny_model_dir)
    vocab = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    exps = experiences(vocab)[:5]
    one = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    st = sharded(cfg, tiny_model_dir)
    for _ in range(2):
        one.train_step(copy.deepcopy(exps))
        st.train_step(copy.deepcopy(exps))
    nbytes, payload = st.publish("memory", 2, None)
    got, want = sync_method("memory").receive(payload), one.sync_state()
    assert set(got) == set(want) and all(k.startswith("lora.") for k in got)
    assert nbytes == sum(t.numel() * t.element_size() for t in want.values())
    for k, t in want.items():
        torch.testing.assert_close(got[k], t, rtol=0, atol=1e-5)
    ckpt = st.save_checkpoint(tmp_path / "ckpt", 2)
    expected = st.train_step(copy.deepcopy(exps))
    st.close()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = PeftModel.from_pretrained(base, ckpt / "adapter")
    ids = torch.tensor([exps[0].tokens.tolist()])
    merged = AutoModelForCausalLM.from_pretrained(ckpt)
    torch.testing.assert_close(peft_model(ids).logits, merged(ids).logits, rtol=0, atol=1e-5)
    again = sharded(cfg, tiny_model_dir)
    again.resume(ckpt)
    assert values(again.train_step(copy.deepcopy(exps))) == values(expected)
    again.close()


def test_ranks_that_do_not_fit_the_cluster_fail_by_name(tmp_path, tiny_model_dir, monkeypatch):
    """8 ranks of one CPU each on a 4-CPU instance: the start fails naming trainer.world_size
    (it waited for the placement group, which would never be ready)."""
    from trinity.trainer import ranks

    monkeypatch.setattr(ranks, "PLACEMENT_TIMEOUT_S", 3.0)
    cfg = config(tmp_path, tiny_model_dir, **FIXED)
    with pytest.raises(RuntimeError, match=r"trainer.world_size=8: no room for 8 ranks"):
        ShardedTrainer(cfg, str(tiny_model_dir), 10, 8, 1, 1, 0)
