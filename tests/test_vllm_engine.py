"""The vLLM engine's own parts (`trinity/explorer/vllm_engine.py`); the contract it shares with
our engine is `test_engine_contract.py`. Marked `vllm`: `make test-vllm` runs them in
`.venv-vllm`, and they are skipped where vLLM is not installed (the seeds' derivation, plain
numpy, runs everywhere)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trinity.common.rollout import SamplingParams
from trinity.explorer.sampling import request_seeds

MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser on Python ints (Steele, Lea & Flood 2014), the reference."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_request_seeds_are_the_row_keys_in_63_bits():
    for key in (0, 1, 2**62 + 12345, MASK64):
        want = [(_splitmix64((_splitmix64(key) + j) & MASK64)) & ((1 << 63) - 1) for j in range(4)]
        assert request_seeds(key, 4) == want
    assert len(set(request_seeds(5, 64))) == 64


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> Path:
    from vllm_models import build_h64_model

    return build_h64_model(tmp_path_factory.mktemp("h64") / "tied", tied=True)


@pytest.fixture(scope="module")
def engine(tied_dir):
    from trinity.explorer.vllm_engine import VLLMRolloutEngine

    built = VLLMRolloutEngine(str(tied_dir), seed=0, max_model_len=48, max_batch_size=16)
    yield built
    built.close()  # the only vLLM engine of this process: see VLLMRolloutEngine.close


@pytest.mark.vllm
def test_the_cpu_kv_cache_is_what_the_engine_can_use(engine):
    """On CPU the KV cache is max_batch_size sequences of max_model_len tokens, not
    gpu_memory_utilization of the machine's memory (what vLLM would reserve)."""
    cache = engine.engine.vllm_config.cache_config
    # 2 layers × (k, v) × 1 kv head × head_dim 64 × 4 bytes = 1024 bytes a token; 16 × 48 tokens
    assert cache.kv_cache_memory_bytes == 1024 * 48 * 16
    assert not cache.enable_prefix_caching
    assert engine.engine.vllm_config.model_config.enforce_eager


@pytest.mark.vllm
def test_scoring_takes_what_vllm_could_continue_and_refuses_more(engine):
    from trinity.common.rollout import PromptTooLong

    assert len(engine.logprobs(list(range(3, 3 + 47)))) == 46  # max_model_len 48: 47 tokens
    with pytest.raises(PromptTooLong, match="at most max_model_len - 1 = 47"):
        engine.logprobs(list(range(3, 3 + 48)))
    assert engine.logprobs([5]) == []


@pytest.mark.vllm
def test_top_k_alternatives_are_the_models_own(engine, tied_dir):
    """`SamplingParams.logprobs` = k: vLLM's k alternatives per token are the top-k of
    log_softmax of the model's own logits (transformers, a plain forward pass), ranked."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tied_dir).eval()
    params = SamplingParams(n=2, temperature=1.0, max_tokens=5, logprobs=3)
    for s in engine.generate([[5, 6, 7], [9, 10]], params, keys=[1, 2])[0]:
        assert len(s.top_ids) == len(s.top_logprobs) == len(s.response_ids)
        with torch.no_grad():
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = model(ids).logits[0, len(s.prompt_ids) - 1 : -1].double()
        ref_lp, ref_ids = torch.topk(torch.log_softmax(logits, -1), 3, dim=-1)
        torch.testing.assert_close(torch.tensor(s.top_logprobs).double(), ref_lp, atol=2e-3, rtol=0)
        gaps = (ref_lp[:, :-1] - ref_lp[:, 1:]).min(dim=-1).values > 2e-3
        assert torch.tensor(s.top_ids)[gaps].tolist() == ref_ids[gaps].tolist()
    plain = engine.generate([[5, 6, 7]], SamplingParams(n=1, max_tokens=2))[0][0]
    assert plain.top_ids is None


@pytest.mark.vllm
def test_the_shared_method_is_refused_before_anything_is_received(engine):
    with pytest.raises(ValueError, match="vLLM loads weights into its own layout"):
        engine.update_weights("shared", ["not a payload"], 1)
    assert engine.weights_version() == 0


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["memory", "checkpoint", "nccl"])
def test_a_grpo_run_samples_with_the_vllm_engine(tmp_path, tied_dir, method):
    """`trinity run` with `engine_type: vllm` (this venv's Python): the engines are vLLM actors,
    the trainer's weights reach them by `method` every step (on-policy; nccl: a gloo broadcast
    between the trainer's and the engine's processes), and the run ends with exit 0 after 3
    steps."""
    from test_e2e import grpo_config, run_trinity

    cfg = grpo_config(tmp_path, tied_dir)
    sets = [
        f"synchronizer.sync_method={method}",
        "explorer.rollout_model.engine_type=vllm",
        "explorer.rollout_model.enable_prefix_caching=true",
        "model.max_model_len=64",
    ]
    r = run_trinity(cfg, overrides=sets, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"rollout engine\s+vllm", r.stdout), r.stdout[-3000:]
    assert "layout: a process per part" in r.stdout  # the engines are actors of their own
    assert re.search(rf"weight sync method\s+{method}", r.stdout)
    recs = [
        json.loads(x) for x in (tmp_path / "ckpt/e2e/grpo/metrics.jsonl").read_text().splitlines()
    ]
    versions = {r["step"]: r["rollout/model_version"] for r in recs if "rollout/model_version" in r}
    assert versions == {1: 0, 2: 1, 3: 2}  # each step sampled the previous step's weights
    assert all("train/loss" in r for r in recs if r["step"] in versions)


@pytest.mark.vllm
def test_a_lora_grpo_run_serves_the_adapter_on_vllm(tmp_path, tied_dir):
    """`model.lora_configs` with the vLLM engine: every sync moves the adapter only (`sync/bytes`
    below `sync/full_bytes`), the engine serves base + adapter, and the trainer's recomputed
    logprobs agree with the engine's (the adapter did reach it: with the base alone they would
    drift apart as the adapter trains)."""
    from test_e2e import grpo_config, run_trinity

    cfg = grpo_config(tmp_path, tied_dir)
    text = cfg.read_text().replace(
        "max_response_tokens: 4}",
        "max_response_tokens: 4, lora_configs: [{lora_rank: 4, lora_alpha: 8}]}",
    )
    # an entropy bonus trains the adapter even when every reward is 0 (a random tiny model)
    text = text.replace("lr: 1.0e-2", "lr: 5.0e-2")
    cfg.write_text(text)
    sets = ["explorer.rollout_model.engine_type=vllm", "model.max_model_len=64",
            "algorithm.entropy_loss_fn_args.entropy_coef=1.0"]  # fmt: skip
    r = run_trinity(cfg, overrides=sets, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [
        json.loads(x) for x in (tmp_path / "ckpt/e2e/grpo/metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in recs if "train/loss" in r]
    assert len(steps) == 3
    synced = [r for r in recs if "sync/bytes" in r]
    assert synced and all(r["sync/bytes"] < 0.2 * r["sync/full_bytes"] for r in synced)
    assert all(r["off_policy/abs_logprob_diff"] < 1e-3 for r in steps), [
        r["off_policy/abs_logprob_diff"] for r in steps
    ]
    from safetensors.torch import load_file

    adapter = load_file(tmp_path / "ckpt/e2e/grpo/global_step_3/adapter/adapter_model.safetensors")
    assert max(float(t.abs().max()) for k, t in adapter.items() if "lora_B" in k) > 1e-2


@pytest.mark.vllm
def test_as_a_ray_actor_the_engine_streams_and_its_knobs_reach_vllm(engine, tied_dir):
    """The explorer's calls to an engine actor (one vLLM engine per process, as in a run):
    `generate_stream` with Ray's streaming returns (the OpenAI endpoint's path), `generate` and
    `weights_version`. Its pool knobs are vLLM's settings there (prefix caching on, which
    changes no sample: the same as the engine in this process, without it, cold and cached)."""
    import ray

    from trinity.common.rollout import Progress
    from trinity.explorer.vllm_engine import VLLMRolloutEngine

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(VLLMRolloutEngine).remote(
            str(tied_dir), seed=0, max_model_len=48, max_batch_size=16, num_threads=1,
            enable_prefix_caching=True, enforce_eager=True,
        )  # fmt: skip
        config = ray.get(actor.__ray_call__.remote(lambda e: e.engine.vllm_config))
        assert config.cache_config.enable_prefix_caching and config.model_config.enforce_eager
        p = engine.chat_prompt_ids([{"role": "user", "content": "7+8="}])
        params = SamplingParams(n=2, temperature=1.0, max_tokens=5)
        call = actor.generate_stream.options(num_returns="streaming")
        items = [ray.get(ref) for ref in call.remote([p], params, [21], [True])]
        *steps, answer = items
        assert steps and all(isinstance(x, Progress) for x in steps)
        here = [s.response_ids for s in engine.generate([p], params, keys=[21])[0]]
        assert [s.response_ids for s in answer[0]] == here
        for _ in range(2):  # the prompt is in the actor's prefix cache now
            there = ray.get(actor.generate.remote([p], params, [21]))
            assert [s.response_ids for s in there[0]] == here
        assert ray.get(actor.weights_version.remote()) == 0
    finally:
        ray.shutdown()
