"""Per-token top-k logprobs (`rollout_args.logprobs`): the engine's k alternatives are the top-k
of log_softmax of the model's own logits at the sampled positions, they travel on the Sample and
the Experience (and through its dict and pickle forms), and the config carries k to the engine."""

from __future__ import annotations

import pickle

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.common.experience import Experience
from trinity.common.rollout import Sample
from trinity.explorer.engine import HFRolloutEngine, SamplingParams


def reference_topk(model, s: Sample, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of log_softmax of a plain forward pass over prompt + response, at the positions
    that predict each response token: [R, k] logprobs and ids."""
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(s.prompt_ids) - 1 : -1]  # [R, V]
    return torch.topk(torch.log_softmax(logits.double(), -1), k, dim=-1)


def test_the_engines_top_k_is_the_models_own(tiny_model_dir) -> None:
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": t}]) for t in ("1+2=", "30+4=")]
    # temperature 0.7 and top-k 5 filter the draw; the alternatives are the raw policy's
    params = SamplingParams(n=2, temperature=0.7, top_k=5, max_tokens=6, logprobs=4)
    for s in [s for group in engine.generate(prompts, params) for s in group]:
        assert s.top_ids is not None and s.top_logprobs is not None
        assert len(s.top_ids) == len(s.top_logprobs) == len(s.response_ids)
        ref_lp, ref_ids = reference_topk(model, s, 4)
        torch.testing.assert_close(
            torch.tensor(s.top_logprobs, dtype=torch.float64), ref_lp, atol=1e-4, rtol=0
        )
        # ids agree where the logprobs are not tied within the tolerance
        gaps = (ref_lp[:, :-1] - ref_lp[:, 1:]).abs().min(dim=-1).values > 1e-4  # [R]
        assert torch.tensor(s.top_ids)[gaps].tolist() == ref_ids[gaps].tolist()
        # the sampled token's logprob is no larger than the best alternative's
        assert all(lp <= top[0] + 1e-5 for lp, top in zip(s.logprobs, s.top_logprobs, strict=True))
    # k = 0 (the default): none
    plain = engine.generate(prompts[:1], SamplingParams(n=1, max_tokens=3))[0][0]
    assert plain.top_ids is None and plain.top_logprobs is None


def test_an_experience_keeps_its_top_k_through_dict_and_pickle() -> None:
    from trinity.workflows.math_workflow import top_logprobs

    s = Sample([1, 2], [5, 6, 7], [-0.1, -0.2, -0.3], "stop", 0,
               top_ids=[[5, 9], [6, 8], [7, 3]],
               top_logprobs=[[-0.1, -2.0], [-0.2, -1.9], [-0.3, -1.5]])  # fmt: skip
    exp = Experience(tokens=torch.tensor([1, 2, 5, 6, 7]), prompt_length=2, **top_logprobs(s))
    assert exp.topk_ids.shape == (3, 2) and exp.topk_ids.dtype == torch.long
    d = exp.to_dict()
    assert d["topk_ids"] == [[5, 9], [6, 8], [7, 3]]
    back = Experience.from_dict(d)
    assert back.to_dict()["topk_logprobs"] == d["topk_logprobs"]  # float32 both ways: exact
    assert back.topk_ids.tolist() == [[5, 9], [6, 8], [7, 3]]
    again = pickle.loads(pickle.dumps(Experience.from_dict(d)))
    torch.testing.assert_close(again.topk_logprobs, exp.topk_logprobs)
    # without top-k the dict has no such keys (its form is unchanged)
    assert "topk_ids" not in Experience(tokens=torch.tensor([1, 2]), prompt_length=1).to_dict()
    with pytest.raises(ValueError, match="topk_ids has length 2"):
        Experience.from_dict({**d, "topk_ids": [[5, 9], [6, 8]]})
    with pytest.raises(ValueError, match="rows of different lengths"):
        Experience.from_dict({**d, "topk_ids": [[5, 9], [6], [7, 3]]})


def test_the_config_carries_k_to_the_sampling_params(tmp_path) -> None:
    from trinity.config import load_config
    from trinity.explorer.explorer import task_sampling
    from trinity.tasks import load_taskset

    p = tmp_path / "cfg.yaml"
    p.write_text(
        "model: {model_path: 'tiny://1m', logprobs: 3}\n"
        "buffer:\n  batch_size: 2\n  explorer_input:\n"
        "    taskset: {storage_type: file, path: tests/data/gsm8k_tiny, "
        "format: {prompt_key: question, response_key: answer}, rollout_args: {logprobs: 7}}\n"
        "    eval_tasksets: [{name: e, storage_type: file, path: tests/data/gsm8k_tiny, "
        "split: test, format: {prompt_key: question, response_key: answer}}]\n"
    )
    cfg = load_config(p)
    inp = cfg.buffer.explorer_input
    train = load_taskset(inp.taskset)[0]
    test = load_taskset(inp.eval_tasksets[0], is_eval=True)[0]
    assert task_sampling(cfg, train, evaluating=False).logprobs == 7  # the taskset's own
    assert task_sampling(cfg, test, evaluating=True).logprobs == 3  # model.logprobs


def test_vllm_refuses_more_than_its_cap(tmp_path) -> None:
    from trinity.config.checks import check_config
    from trinity.config.schema import TrinityConfig

    cfg = TrinityConfig.model_validate(
        {
            "model": {"model_path": "tiny://1m", "logprobs": 21},
            "explorer": {"rollout_model": {"engine_type": "vllm"}},
            "buffer": {
                "explorer_input": {"taskset": {"path": "x", "rollout_args": {"logprobs": 20}}}
            },
        }
    )
    found = [p for p in check_config(cfg) if "alternatives per token" in p.message]
    assert [p.path for p in found] == ["model.logprobs"]
