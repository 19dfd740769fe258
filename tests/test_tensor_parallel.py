"""Tensor-parallel inference (`explorer.rollout_model.tensor_parallel_size`) against one process.

The references are the one-process computations on the same weights: a decoder layer's forward,
and the one-process `HFRolloutEngine` (logprobs, keyed samples, weights loaded by each sync
method). The tensor-parallel engine is started as the launcher starts it (`start_engine_pools`:
a placement group of two rank actors, gloo between them).
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import ray
import torch

from trinity.common.resources import Share
from trinity.common.rollout import Peers, SamplingParams
from trinity.models.loading import distinct_tensors
from trinity.sync.method import sync_method

ATOL = 1e-5  # fp32


def tiny_qwen2() -> torch.nn.Module:
    """A 2-layer Qwen2 of random weights (seed 0): 4 heads, 2 KV heads, MLP width 128."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def layer_output(model: torch.nn.Module) -> torch.Tensor:
    """Decoder layer 0 of `model` on fixed hidden states [2, 10, 64] (causal attention)."""
    hidden = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(10)[None].expand(2, -1)
    with torch.inference_mode():
        rope = model.model.rotary_emb(hidden, positions)
        out = model.model.layers[0](hidden, position_embeddings=rope, attention_mask=None)
    return out[0] if isinstance(out, tuple) else out


def _layer_on_rank(rank: int, port: int, out: str) -> None:
    """One of 2 spawned ranks: the tiny model split over both, its layer 0's output saved."""
    from torch.distributed.tensor import DTensor

    from trinity.models.tensor_parallel import TensorParallel, TPPlace

    torch.set_num_threads(1)
    tp = TensorParallel.join(TPPlace(rank, 2, ("127.0.0.1", port)), timeout_s=60)
    model = tp.parallelize(tiny_qwen2())
    q = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q, DTensor) and q.to_local().shape == (32, 64)  # 2 of 4 heads of 16
    torch.save(layer_output(model), f"{out}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_decoder_layer_over_two_ranks_equals_one_process(tmp_path) -> None:
    """q/k/v and gate/up split by output rows, o and down by input columns, their partial sums
    all-reduced over gloo: the layer's output is one process's to fp32 rounding."""
    import torch.multiprocessing as mp

    mp.spawn(_layer_on_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    expected = layer_output(tiny_qwen2())
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
        print(f"rank {rank}: max |TP - one process| = {(got - expected).abs().max().item():.2e}")


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="tp-engine")
    yield
    ray.shutdown()


def start_tp_engine(model_dir, max_restarts: int = 0):
    """A tensor_parallel_size 2 rollout engine as the launcher starts it: (rank 0's handle, its
    pools, which free its placement group)."""
    from trinity.config import validate_config
    from trinity.explorer.engine_pools import start_engine_pools

    cfg = validate_config(
        {
            "model": {"model_path": str(model_dir), "max_model_len": 64},
            "seed": 0,
            "buffer": {"batch_size": 1, "explorer_input": {"taskset": {"path": "x"}}},
            "explorer": {
                "rollout_model": {"tensor_parallel_size": 2, "max_restarts": max_restarts}
            },
        }
    )
    pools = start_engine_pools(cfg, str(model_dir), Share(1.0, 0.0, 2), nodes=None)
    return pools.rollout[0], pools


@pytest.fixture(scope="module")
def engines(ray_local, tiny_model_dir):
    """(the tensor-parallel engine, the one-process engine) of the same model, seed and limit."""
    from trinity.explorer.engine import HFRolloutEngine

    tp, pools = start_tp_engine(tiny_model_dir)
    placed = ray.get(tp.ranks_placed.remote())  # two processes, one engine
    assert [p["rank"] for p in placed] == [0, 1] and placed[0]["pid"] != placed[1]["pid"]
    one = HFRolloutEngine(str(tiny_model_dir), seed=0, max_model_len=64, num_threads=1)
    yield tp, one
    ray.kill(tp)
    pools.release()


def prompts(engine) -> list[list[int]]:
    return [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in ("12+34=", "7*8=")]


def assert_same_answers(tp, one) -> None:
    """Keyed samples (the same tokens, logprobs within ATOL) and `logprobs` scoring."""
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_tokens=12)
    ps = prompts(one)
    expected = one.generate(ps, params, keys=[11, 22])
    got = ray.get(tp.generate.remote(ps, params, keys=[11, 22]))
    worst = 0.0
    for g_got, g_exp in zip(got, expected, strict=True):
        for s_got, s_exp in zip(g_got, g_exp, strict=True):
            assert s_got.response_ids == s_exp.response_ids
            assert s_got.model_version == s_exp.model_version
            diff = torch.tensor(s_got.logprobs) - torch.tensor(s_exp.logprobs)
            worst = max(worst, diff.abs().max().item())
    seq = ps[0] + expected[0][0].response_ids
    scored = torch.tensor(ray.get(tp.logprobs.remote(seq))) - torch.tensor(one.logprobs(seq))
    print(f"max |TP - one process|: sampled logprobs {worst:.2e}, scored {scored.abs().max():.2e}")
    assert worst <= ATOL and scored.abs().max().item() <= ATOL


def test_a_tp2_engine_samples_and_scores_as_one_process(engines) -> None:
    tp, one = engines
    assert_same_answers(tp, one)
    # streamed: each decode step's tokens as the engine samples them, then the same answer
    p, params = prompts(one)[:1], SamplingParams(n=2, temperature=1.0, max_tokens=6)
    items = [ray.get(r) for r in tp.generate_stream.options(num_returns="streaming").remote(
        p, params, [5], [True])]  # fmt: skip
    *steps, final = items
    expected = one.generate(p, params, keys=[5])
    assert [s.response_ids for s in final[0]] == [s.response_ids for s in expected[0]]
    streamed = {}
    for step in steps:
        for _, sample, pos, token, _, _ in step.tokens:
            streamed.setdefault(sample, {})[pos] = token
    assert [list(streamed[j].values()) for j in range(2)] == [s.response_ids for s in expected[0]]


def perturbed(one, seed: int) -> dict[str, torch.Tensor]:
    """The one-process engine's weights plus seeded noise, as a trainer sends them (each
    distinct tensor once: the tied output embedding is not sent)."""
    g = torch.Generator().manual_seed(seed)
    state = distinct_tensors(one.model.state_dict())
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in state.items()}


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_a_tp2_engine_loads_synced_weights_as_one_process(engines, method, tmp_path) -> None:
    """Each rank receives the full weights and keeps its slices; the engine then answers as
    the one-process engine given the same weights."""
    tp, one = engines
    version = {"memory": 1, "checkpoint": 2}[method]
    payload = sync_method(method).send(perturbed(one, version), version, tmp_path)
    assert ray.get(tp.update_weights.remote(method, payload, version)) == version
    one.update_weights(method, payload, version)
    assert ray.get(tp.weights_version.remote()) == version
    assert_same_answers(tp, one)


def test_a_lora_adapter_is_merged_into_each_rank_s_slices(engines, tmp_path) -> None:
    """An adapter payload (`models/lora_merge.py`) on column-split (q, up) and row-split (o,
    down) layers: each rank adds its slices of scaling · B·A to its slices of W0."""
    from trinity.models import lora_merge

    tp, one = engines
    g, adapter = torch.Generator().manual_seed(5), {lora_merge.SCALING: torch.tensor(2.0)}
    weights = dict(one.model.named_parameters())
    for module in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
        name = f"model.layers.1.{module}"
        out, inner = weights[f"{name}.weight"].shape
        adapter[lora_merge.adapter_key(name, "A")] = 0.1 * torch.randn(4, inner, generator=g)
        adapter[lora_merge.adapter_key(name, "B")] = 0.1 * torch.randn(out, 4, generator=g)
    payload = sync_method("memory").send(adapter, 4, tmp_path)
    ray.get(tp.update_weights.remote("memory", payload, 4))
    one.update_weights("memory", payload, 4)
    assert_same_answers(tp, one)


def test_weights_every_rank_refuses_leave_the_engine_usable(engines, tmp_path) -> None:
    """A payload that does not match the model fails on every rank alike: the call raises the
    engine's own error, the ranks stay in step, and the engine answers as before."""
    tp, one = engines
    payload = sync_method("memory").send({"model.nope.weight": torch.ones(2)}, 9, tmp_path)
    with pytest.raises(ray.exceptions.RayTaskError, match="does not match the model"):
        ray.get(tp.update_weights.remote("memory", payload, 9))
    assert_same_answers(tp, one)


def test_a_rank_that_fails_alone_fails_the_engine_at_once(ray_local, monkeypatch) -> None:
    """Rank 0 watches the other ranks while its own part runs: a rank's error is raised at once
    (rank 0's part, stuck in a collective here, is not waited for), naming the rank, and every
    later call raises it."""
    import threading

    from trinity.common.compute import ComputeLane
    from trinity.explorer import tp_engine

    monkeypatch.setattr(tp_engine, "SETTLE_S", 0.5)

    @ray.remote
    def rank_fails() -> None:
        raise ValueError("rank 1 broke")

    engine = object.__new__(tp_engine.TensorParallelEngine)  # its lockstep, without a model
    engine.world, engine.failed, engine.engine = 2, None, object()
    lane, stuck = ComputeLane("test-rank0"), threading.Event()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed.*rank 1 broke"):
        engine._gather(lane.submit(stuck.wait), [rank_fails.remote()])
    assert time.monotonic() - t0 < 10
    with pytest.raises(RuntimeError, match=r"(?s)failed earlier.*rank 1 broke"):
        engine._raise_if_failed()
    stuck.set()


@pytest.mark.long
def test_a_tp2_engine_whose_rank_dies_is_restarted_with_its_weights(
    ray_local, tiny_model_dir, tmp_path
) -> None:
    """Killing rank 1's process ends rank 0's (it does not wait in a collective), Ray restarts
    the engine with new ranks, and the explorer's client gives it back its weights."""
    import asyncio

    from trinity.explorer.engine import HFRolloutEngine
    from trinity.explorer.model_client import BatchingClient

    tp, pools = start_tp_engine(tiny_model_dir, max_restarts=1)
    try:
        one = HFRolloutEngine(str(tiny_model_dir), seed=0, max_model_len=64, num_threads=1)
        payload = sync_method("memory").send(perturbed(one, 3), 3, tmp_path)
        one.update_weights("memory", payload, 3)
        client = BatchingClient([tp], restart_timeout=120)

        async def run() -> list:
            await client.update_weights("memory", payload, 3)
            rank1 = ray.get(tp.ranks_placed.remote())[1]["pid"]
            os.kill(rank1, signal.SIGKILL)
            return await client.generate(prompts(one)[0], SamplingParams(n=2, max_tokens=8), key=4)

        got = asyncio.run(asyncio.wait_for(run(), 180))
        assert client.restarts == 1
        expected = one.generate(prompts(one)[:1], SamplingParams(n=2, max_tokens=8), keys=[4])[0]
        assert [s.response_ids for s in got] == [s.response_ids for s in expected]
    finally:
        ray.kill(tp)
        pools.release()


@pytest.mark.long
def test_nccl_sync_reaches_every_rank_as_a_member_of_the_broadcast(engines, tmp_path) -> None:
    """sync_method nccl (gloo here): each rank joins the trainer's broadcast as its own member
    (rank r of engine i is member i·2 + r of 2) and keeps its slices."""
    tp, one = engines
    state = perturbed(one, 7)
    payload = sync_method("nccl").send(state, 7, tmp_path)
    assert ray.get(tp.update_weights.remote("nccl", payload, 7, Peers(0, 1))) == 7
    one.update_weights("memory", sync_method("memory").send(state, 7, tmp_path), 7)
    assert_same_answers(tp, one)


@pytest.mark.slow  # a whole run with two engine ranks (20-30 s on 2 cores)
def test_a_grpo_run_with_tensor_parallel_engines_completes(tmp_path, tiny_model_dir) -> None:
    """`trinity run` (mode both, 2 steps) with tensor_parallel_size 2 and nccl weight sync: the
    plan says the engine's ranks, rank 0 prints where they run, and the synced weights serve
    step 2."""
    import json

    from test_e2e import grpo_config, run_trinity

    over = [
        "buffer.total_steps=2",
        "explorer.rollout_model.tensor_parallel_size=2",
        "synchronizer.sync_method=nccl",
    ]
    r = run_trinity(grpo_config(tmp_path, tiny_model_dir), overrides=over)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "over 2 tensor-parallel ranks" in r.stdout
    assert "rollout engine: tensor-parallel over 2 ranks" in r.stdout + r.stderr
    records = [
        json.loads(x)
        for x in (tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    versions = [rec["rollout/model_version"] for rec in records if "rollout/model_version" in rec]
    assert versions[-2:] == [0, 1]
