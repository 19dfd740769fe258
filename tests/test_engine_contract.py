"""The `RolloutEngine` contract (`trinity/common/rollout.py`), checked the same way for every
engine type on a model with tied embeddings and one without (head_dim 64: vLLM's CPU build
serves it, `tests/vllm_models.py`). The references are independent of the engines: a plain
transformers forward pass of the same weights, and tokenizer decodes.

The transformers engine's cases run in `make test`; the vLLM engine's are marked `vllm` and run
in `.venv-vllm` (`make test-vllm`), skipped where vLLM is not installed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from trinity.common.rollout import BadPrompt, Peers, Progress, PromptTooLong, SamplingParams
from trinity.models.loading import distinct_tensors
from trinity.sync.method import sync_method

MAX_MODEL_LEN = 48
ENGINES = [
    pytest.param("transformers", id="transformers"),
    pytest.param("vllm", id="vllm", marks=pytest.mark.vllm),
]


@pytest.fixture(scope="module", params=["tied", "untied"])
def model_dir(request, tmp_path_factory) -> Path:
    from vllm_models import build_h64_model

    root = tmp_path_factory.mktemp(f"h64_{request.param}")
    return build_h64_model(root / "model", tied=request.param == "tied")


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, model_dir):
    """One engine per (type, model), shared by the module's tests; a test that loads other
    weights puts the originals back."""
    from trinity.common.rollout import engine_class

    built = engine_class(request.param)(
        str(model_dir), seed=0, max_model_len=MAX_MODEL_LEN, max_batch_size=16, num_threads=2
    )
    yield built
    if hasattr(built, "close"):  # vLLM: shut down before the next engine of this process
        built.close()


def reference_logprobs(model_dir: Path, tokens: list[int], state=None) -> torch.Tensor:
    """log p(tokens[t] | tokens[:t]) for t >= 1 by a plain transformers forward pass in fp32,
    of the folder's weights or of `state` (Hugging Face names)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state, strict=False)
        model.tie_weights()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


def chat(engine, text: str) -> list[int]:
    return engine.chat_prompt_ids([{"role": "user", "content": text}])


def test_sampled_logprobs_are_the_raw_policys_whatever_the_sampling(engine, model_dir):
    """Temperature, top-k and top-p change what is drawn, not the logprob reported: that is the
    policy's at temperature 1 (what the trainer recomputes)."""
    p = chat(engine, "12+34=")
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=20, max_tokens=8)
    (group,) = engine.generate([p], params, keys=[7])
    assert len(group) == 3
    for s in group:
        assert len(s.logprobs) == len(s.response_ids) >= 1
        ref = reference_logprobs(model_dir, p + s.response_ids)[len(p) - 1 :]
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=1e-3, rtol=1e-3)
        scored = engine.logprobs(p + s.response_ids)
        assert len(scored) == len(p) + len(s.response_ids) - 1
        torch.testing.assert_close(
            torch.tensor(scored), reference_logprobs(model_dir, p + s.response_ids), atol=1e-3,
            rtol=1e-3,
        )  # fmt: skip


def test_keyed_samples_depend_on_their_key_alone(engine):
    """A keyed prompt samples the same tokens alone, in a batch, and again (top-p and top-k
    too); its `n` samples differ from each other, and another key samples other tokens."""
    a, b, c = chat(engine, "1+2="), chat(engine, "34+5="), chat(engine, "7+8=")
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, top_k=200, max_tokens=8)

    def ids(groups):
        return [[s.response_ids for s in g] for g in groups]

    alone = ids(engine.generate([a], params, keys=[101]))
    batched = ids(engine.generate([b, a, c, a], params, keys=[202, 101, 303, 101]))
    assert batched[1] == batched[3] == alone[0]
    assert ids(engine.generate([a], params, keys=[101])) == alone
    assert len({tuple(r) for r in alone[0]}) == 3
    assert ids(engine.generate([a], params, keys=[102])) != alone


def test_each_prompt_has_its_own_budget_and_unservable_prompts_fail_alone(engine):
    """min(max_tokens, max_model_len - len(prompt)) new tokens each; an empty prompt gets
    `BadPrompt`, one with no room `PromptTooLong`, in their places, and the others are sampled
    exactly as without them."""
    short = chat(engine, "1+2=")
    long_ = (short * 8)[: MAX_MODEL_LEN - 3]  # room for 3
    full = (short * 8)[:MAX_MODEL_LEN]  # no room
    params = SamplingParams(n=2, temperature=1.0, max_tokens=10)
    out = engine.generate([short, [], long_, full], params, keys=[1, 2, 3, 4])
    assert type(out[1]) is BadPrompt
    assert isinstance(out[3], PromptTooLong) and f"prompt of {MAX_MODEL_LEN} tokens" in str(out[3])
    for group, budget in ((out[0], 10), (out[2], 3)):
        for s in group:
            if s.finish_reason == "length":
                assert len(s.response_ids) == budget
            else:  # an eos ends it early: the eos is kept
                assert s.finish_reason == "stop" and len(s.response_ids) <= budget
    assert [s.finish_reason for s in out[2]] != ["stop", "stop"]  # 3 tokens: eos is rare
    alone = engine.generate([short, long_], params, keys=[1, 3])
    assert [s.response_ids for s in alone[0]] == [s.response_ids for s in out[0]]
    assert [s.response_ids for s in alone[1]] == [s.response_ids for s in out[2]]


def test_a_stop_string_ends_the_reply_at_the_token_that_completes_it(engine):
    p = chat(engine, "12+34=")
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=12)
    free = engine.generate([p], greedy)[0][0].response_ids
    texts = [engine.decode(free[:k]) for k in range(len(free) + 1)]
    # a stop string the greedy reply completes at some token k >= 2, and not before it
    k, stop = next(
        (k, texts[k][-2:])
        for k in range(2, len(free))
        if len(texts[k]) >= 2 and texts[k][-2:] not in texts[k - 1] and texts[k][-2:].strip()
    )
    s = engine.generate([p], SamplingParams(n=1, temperature=0.0, max_tokens=12, stop=(stop,)))
    (sample,) = s[0]
    assert sample.finish_reason == "stop" and sample.info == {"stop": stop}
    assert sample.response_ids == free[:k]


def test_the_stream_reports_each_sampled_token_then_generates_answer(engine):
    a, b = chat(engine, "3+4="), chat(engine, "5+6=")
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6)
    items = list(engine.generate_stream([a, b], params, keys=[5, 6], watch=[True, False]))
    *steps, answer = items
    assert all(isinstance(x, Progress) for x in steps) and steps
    assert [[s.response_ids for s in g] for g in answer] == [
        [s.response_ids for s in g] for g in engine.generate([a, b], params, keys=[5, 6])
    ]
    for j, sample in enumerate(answer[0]):
        mine = [t for step in steps for t in step.tokens if t[:2] == (0, j)]
        assert [t[2] for t in mine] == list(range(len(sample.response_ids)))
        assert [t[3] for t in mine] == sample.response_ids
        torch.testing.assert_close(
            torch.tensor([t[4] for t in mine]), torch.tensor(sample.logprobs)
        )
        assert engine.decode(sample.response_ids).startswith("".join(t[5] for t in mine))
    assert all(t[0] == 0 for step in steps for t in step.tokens)  # prompt 1 is not watched


def test_a_lora_adapter_is_served_merged_into_the_base(engine, model_dir, tmp_path):
    """A LoRA adapter payload (`models/lora_merge.py`: `lora.<module>.lora_A|B`, `lora.scaling`)
    is served as W0 + scaling · B·A, each adapter onto the base, never onto the last merge: a
    second adapter on q_proj only puts v_proj back to W0. The base is put back after. (Before
    the full-weights test: an engine keeps the base its adapters touch, and full weights loaded
    before any adapter leave none to read; a LoRA run's engines only receive adapters.)"""
    from safetensors.torch import load_file

    original = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    scaling = 2.0

    def adapter(modules: list[str]) -> tuple[dict, dict]:
        payload, merged = {"lora.scaling": torch.tensor(scaling)}, {}
        for m in modules:
            w0 = original[f"{m}.weight"]
            a = 0.3 * torch.randn(4, w0.shape[1], generator=g)
            b = 0.3 * torch.randn(w0.shape[0], 4, generator=g)
            payload[f"lora.{m}.lora_A"], payload[f"lora.{m}.lora_B"] = a, b
            merged[f"{m}.weight"] = w0 + scaling * (b @ a)  # by hand
        return payload, merged

    layers = sorted({k.split(".self_attn")[0] for k in original if ".self_attn.q_proj" in k})
    probe = [*chat(engine, "7+8="), 41, 52, 63]
    before = torch.tensor(engine.logprobs(probe))
    first, merged1 = adapter([f"{x}.self_attn.{p}" for x in layers for p in ("q_proj", "v_proj")])
    version = engine.weights_version() + 1
    engine.update_weights("memory", sync_method("memory").send(first, version, tmp_path), version)
    expected = reference_logprobs(model_dir, probe, state={**original, **merged1})
    assert (expected - before).abs().max() > 0.05  # the adapter does change them
    torch.testing.assert_close(torch.tensor(engine.logprobs(probe)), expected, atol=1e-3, rtol=0)
    second, merged2 = adapter([f"{x}.self_attn.q_proj" for x in layers])
    engine.update_weights(
        "memory", sync_method("memory").send(second, version + 1, tmp_path), version + 1
    )
    expected = reference_logprobs(model_dir, probe, state={**original, **merged2})
    torch.testing.assert_close(torch.tensor(engine.logprobs(probe)), expected, atol=1e-3, rtol=0)
    back = sync_method("checkpoint").send(original, version + 2, tmp_path / "back")
    engine.update_weights("checkpoint", back, version + 2)
    torch.testing.assert_close(torch.tensor(engine.logprobs(probe)), before, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["memory", "checkpoint", "nccl"])
def test_weights_of_every_sync_method_load_and_bump_the_version(
    engine, model_dir, method, tmp_path
):
    """New weights sent by the trainer's half of `method` (Hugging Face names, a tied output
    embedding sent once) load into the engine: its logprobs become a forward pass's of the new
    weights, and its samples carry the new version. The originals are put back after."""
    from safetensors.torch import load_file

    original = load_file(str(model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    new = distinct_tensors(
        {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    )
    p = chat(engine, "12+34=")
    probe = [*p, 40, 50, 60, 70]
    before = torch.tensor(engine.logprobs(probe))
    version = engine.weights_version() + 1
    m = sync_method(method)
    payload = m.send(new, version, tmp_path / "sync")
    assert engine.update_weights(method, payload, version, Peers(0, 1, uuid.uuid4().hex)) == version
    try:
        assert engine.weights_version() == version
        expected = reference_logprobs(model_dir, probe, state=new)
        assert (before - expected).abs().max() > 0.1  # the new weights do change them
        torch.testing.assert_close(
            torch.tensor(engine.logprobs(probe)), expected, atol=1e-3, rtol=1e-3
        )
        (group,) = engine.generate([p], SamplingParams(n=1, max_tokens=4), keys=[9])
        assert group[0].model_version == version
        ref = reference_logprobs(model_dir, p + group[0].response_ids, state=new)[len(p) - 1 :]
        torch.testing.assert_close(torch.tensor(group[0].logprobs), ref, atol=1e-3, rtol=1e-3)
    finally:
        back = sync_method("checkpoint").send(original, version + 1, tmp_path / "back")
        engine.update_weights("checkpoint", back, version + 1)
    torch.testing.assert_close(torch.tensor(engine.logprobs(probe)), before, atol=1e-4, rtol=1e-4)
