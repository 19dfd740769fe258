"""The decode steps' packed weights: the same products as the modules, and never stale.

A packed copy that outlived a weight update would decode with the old policy while every number
looked right, so each way the engine's weights change is checked: an in-place update (a trainer
stepping the same tensors), replaced storage (a sync that hands over new tensors), and a sync
that maps the same memory (only the engine's weights version says it changed).
"""

from __future__ import annotations

import pytest
import torch

from trinity.models import packed_weights
from trinity.models.packed_weights import pack, packable, packed_layers


def _model(**extra):
    import transformers

    cfg = transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
        **extra,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def test_a_pack_is_the_linears_side_by_side():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(6, 4), torch.nn.Linear(6, 3, bias=False)
    p = pack(a, b)
    assert p.weight.shape == (6, 7) and p.weight.is_contiguous()
    x = torch.randn(5, 2, 6)
    want = torch.cat([a(x), b(x)], dim=-1)  # b has no bias: zeros in its columns
    torch.testing.assert_close(p(x), want)
    torch.testing.assert_close(p(x[:, 0]), want[:, 0])  # the 2-D path
    assert pack(b).bias is None


def test_packs_are_reused_until_a_weight_changes():
    model = _model()
    first = packed_layers(model, version=3)
    assert packed_layers(model, version=3) is first  # nothing changed: the same copy
    q = model.model.layers[1].self_attn.q_proj

    # 1. in place (a trainer's optimizer step on the same tensors): its version counter moves
    with torch.no_grad():
        q.weight.add_(1.0)
    second = packed_layers(model, version=3)
    assert second is not first
    torch.testing.assert_close(second.layers[1].qkv.weight[:, :64], q.weight.t())

    # 2. replaced storage (a sync that hands over new tensors)
    q.weight.data = torch.zeros_like(q.weight)
    third = packed_layers(model, version=3)
    assert third is not second and not third.layers[1].qkv.weight[:, :64].any()

    # 3. the same memory changed behind the tensors' backs (a mapped segment): only the version
    assert packed_layers(model, version=3) is third
    assert packed_layers(model, version=4) is not third


def test_the_engine_decodes_with_the_weights_it_was_last_given(tiny_model_dir):
    """After `load_state`, greedy decoding from the packs equals a fresh engine's with the new
    weights, and the new weights' decoding differs from the old one's."""
    from trinity.explorer.engine import HFRolloutEngine, SamplingParams

    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1)
    assert packable(engine.model)
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in ("1+2?", "a")]
    greedy = SamplingParams(n=2, max_tokens=12, temperature=0.0)
    before = engine.generate(prompts, greedy)
    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    engine.load_state(new, version=1)
    after = engine.generate(prompts, greedy)
    fresh = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1, lean_decode=False)
    fresh.load_state(new, version=1)
    want = fresh.generate(prompts, greedy)
    ids = [[[s.response_ids for s in g] for g in out] for out in (after, want, before)]
    assert ids[0] == ids[1] != ids[2]


def test_large_models_decode_from_their_own_weights(monkeypatch):
    model = _model()
    assert packable(model)
    monkeypatch.setattr(packed_weights, "MAX_PACKED_BYTES", 1000)
    assert not packable(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_norm_in_front_is_folded_in_fp32_and_kept_otherwise(dtype):
    """pack(q, k, norm=n)(x) = [q(n(x)), k(n(x))]: in fp32 the norm's weight is folded into the
    packed rows and its 1/rms scales the output; other dtypes run the norm module first."""
    model = _model().to(dtype)
    layer = model.model.layers[0]
    norm, q, k = layer.input_layernorm, layer.self_attn.q_proj, layer.self_attn.k_proj
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        p = pack(q, k, norm=norm)
        x = 3 * torch.randn(5, 64, dtype=dtype)
        want = torch.cat([q(norm(x)), k(norm(x))], dim=-1)
    if dtype == torch.float32:
        assert p.eps == norm.variance_epsilon and p.norm is None
        torch.testing.assert_close(p.weight[:, :64], norm.weight[:, None] * q.weight.t())
        torch.testing.assert_close(p(x), want, atol=1e-5, rtol=1e-5)
    else:
        assert p.eps is None and p.norm is norm
        torch.testing.assert_close(p(x), want, atol=2e-2, rtol=2e-2)  # bf16 sums in any order


def test_add_to_is_the_residual_plus_the_projection():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4)
    x, base = torch.randn(3, 6), torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(pack(lin).add_to(base, x), base + lin(x))


def test_a_norm_weight_update_repacks():
    """The folded norm weights are sources too: a step on them makes a new pack."""
    model = _model()
    first = packed_layers(model, version=0)
    with torch.no_grad():
        model.model.layers[0].post_attention_layernorm.weight.mul_(2.0)
    second = packed_layers(model, version=0)
    assert second is not first
    torch.testing.assert_close(second.layers[0].gate_up.weight, 2 * first.layers[0].gate_up.weight)
