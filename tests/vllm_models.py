"""Tiny models for the engine contract tests on both engines: head_dim 64, as most real models
(vLLM's CPU attention takes 32 or 64 and refuses 16), random init, offline, with the tiny
models' tokenizer (`trinity.models.tiny`). One with tied embeddings (Qwen2-shaped, as our
presets) and one without (Llama-shaped): a weight reload treats the two differently."""

from __future__ import annotations

from pathlib import Path

from trinity.models.tiny import ENDOFTEXT, IM_END, build_tokenizer, model_vocab_size

SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 64
    num_key_value_heads=1,
    max_position_embeddings=512,
)


def build_h64_model(out: Path, *, tied: bool, seed: int = 0) -> Path:
    """A ~0.3M-parameter float32 model + tokenizer in `out`: Qwen2 with tied embeddings, or
    Llama with an output head of its own. Deterministic for (tied, seed)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, Qwen2Config

    if (out / "config.json").exists():
        return out
    tokenizer = build_tokenizer()
    im_end, endoftext = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    kind = Qwen2Config if tied else LlamaConfig
    config = kind(
        vocab_size=model_vocab_size(),
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        torch_dtype="float32",
        **SHAPE,
    )
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
        # random init's small std makes every distribution near-uniform: scale the weights up
        # so that sampling, greedy decoding and logprobs have structure to get right
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, endoftext], pad_token_id=endoftext, bos_token_id=None
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
