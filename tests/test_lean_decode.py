"""The lean decode path against the model's own forward (`HFDecoder`), family by family.

The reference is transformers' forward with its `DynamicCache`: the same prompts (left-padded to
different lengths), the same fan-out to n rows, the same tokens fed at each step and the same
rows leaving the batch; every step's logits must agree to float rounding.
"""

from __future__ import annotations

import pytest
import torch

from trinity.models import lean_decode
from trinity.models.forward import cache_kwarg
from trinity.models.lean_decode import HFDecoder, LeanDecoder, decoder_for, lean_support
from trinity.models.packed_weights import packed_layers

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=97)


def _model(family: str, **extra):
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gpt2": transformers.GPT2Config,
    }[family]
    kw = dict(SIZES)
    if family == "gpt2":
        kw = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=97)
    else:
        kw.update(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    kw.update(extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cls(**kw), dtype=torch.float32)
    with torch.no_grad():  # norm weights other than ones, so that folding them in is checked
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


def _prompts(lengths=(5, 2, 7)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three prompts of 5, 2 and 7 tokens, left-padded with 0: ids, attention, positions."""
    width = max(lengths)
    g = torch.Generator().manual_seed(1)
    ids = torch.zeros(3, width, dtype=torch.long)
    attention = torch.zeros(3, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(1, 97, (n,), generator=g)
        attention[i, width - n :] = 1
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def _run(dec, steps: int, n: int, drops: dict[int, list[int]], lengths=(5, 2, 7)) -> list:
    """Prefill, then `steps` greedy steps; at step t keep only the rows `drops[t]`."""
    ids, attention, positions = _prompts(lengths)
    out = [dec.prefill(ids, attention, positions, n)]
    for t in range(steps):
        tok = out[-1].argmax(-1)
        if t in drops:
            rows = torch.tensor(drops[t])
            dec.keep(rows)
            tok = tok[rows]
        out.append(dec.step(tok))
    return out


@pytest.mark.parametrize(
    "family,extra",
    [
        ("qwen2", {}),
        ("llama", {}),
        ("llama", {"num_key_value_heads": 4}),  # no grouping
        ("llama", {"attention_bias": True, "mlp_bias": True}),  # every projection biased
        ("qwen3", {"head_dim": 32}),  # q_norm / k_norm, head_dim != hidden / heads
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["modules", "packed"])
def test_lean_logits_match_the_models_forward(family, extra, packed):
    """Both step paths: through the model's modules, and from its packed weights."""
    model = _model(family, **extra)
    assert lean_support(model) is None
    drops = {2: [0, 2, 3, 5, 6, 8], 5: [1, 4, 5]}  # 9 rows (3 prompts x 3), then 6, then 3
    with torch.inference_mode():
        packs = packed_layers(model) if packed else None
        lean = _run(LeanDecoder(model, room=12, packs=packs), 10, 3, drops)
        ref = _run(HFDecoder(model, cache_kwarg(model)), 10, 3, drops)
    assert [t.shape for t in lean] == [t.shape for t in ref]
    assert [t.shape[0] for t in lean] == [9, 9, 9, 6, 6, 6, 3, 3, 3, 3, 3]
    for step, (a, b) in enumerate(zip(lean, ref, strict=True)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"step {step}")


@pytest.mark.parametrize("packed", [False, True], ids=["modules", "packed"])
def test_prompts_of_one_length_need_no_mask(packed):
    """No row has padding: the steps attend without a mask, to the same logits."""
    model = _model("qwen2")
    with torch.inference_mode():
        dec = LeanDecoder(model, room=8, packs=packed_layers(model) if packed else None)
        lean = _run(dec, 6, 2, {3: [0, 3, 4]}, lengths=(4, 4, 4))
        ref = _run(HFDecoder(model, cache_kwarg(model)), 6, 2, {3: [0, 3, 4]}, lengths=(4, 4, 4))
    assert not dec.padded
    for a, b in zip(lean, ref, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["modules", "packed"])
def test_the_cache_grows_past_its_first_block(monkeypatch, packed):
    monkeypatch.setattr(lean_decode, "GROW", 3)  # capacity: prompt + 3, then + 3 at a time
    model = _model("qwen2")
    with torch.inference_mode():
        dec = LeanDecoder(model, room=20, packs=packed_layers(model) if packed else None)
        lean = _run(dec, 11, 2, {4: [1, 2, 5]})
        ref = _run(HFDecoder(model, cache_kwarg(model)), 11, 2, {4: [1, 2, 5]})
    assert dec.mask.shape[1] == 7 + 12  # width 7, grown four times by 3 for 11 tokens
    assert dec.length == 7 + 11
    for a, b in zip(lean, ref, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_layouts_it_does_not_know_take_the_models_forward():
    gpt2 = _model("gpt2")
    assert "model_type 'gpt2'" in lean_support(gpt2)
    assert isinstance(decoder_for(gpt2, cache_kwarg(gpt2), room=4), HFDecoder)
    windowed = _model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert lean_support(windowed) == "sliding-window attention"
    qwen2 = _model("qwen2")
    assert isinstance(decoder_for(qwen2, cache_kwarg(qwen2), room=4), LeanDecoder)
    assert isinstance(decoder_for(qwen2, cache_kwarg(qwen2), room=4, lean=False), HFDecoder)


def test_engine_samples_the_same_tokens_either_way(tiny_model_dir):
    """The engine's sampled tokens, finish reasons and logprobs with the lean path and without
    it, for keyed sampling (each draw fixed by its key, so the paths see the same uniforms)."""
    from trinity.explorer.engine import HFRolloutEngine, SamplingParams

    lean, plain = (
        HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1, lean_decode=flag)
        for flag in (True, False)
    )
    prompts = [lean.chat_prompt_ids([{"role": "user", "content": q}]) for q in ("1+2?", "a")]
    params = SamplingParams(n=4, max_tokens=24, temperature=1.0)
    a = lean.generate(prompts, params, keys=[7, 8])
    b = plain.generate(prompts, params, keys=[7, 8])
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.response_ids == y.response_ids
            assert x.finish_reason == y.finish_reason
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
