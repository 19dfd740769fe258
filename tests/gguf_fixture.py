"""Write a small GGUF file from a tiny Qwen2 folder, the way llama.cpp's converter lays one out:
architecture metadata, a gpt2-style BPE tokenizer (tokens, token types, merges, special ids, chat
template) and the weights under GGUF tensor names, 2-D matrices quantized to Q8_0 (so the import
path dequantizes, as with a real GGUF) and the rest in F32. About 1 MB; written in under a second.

    path = write_tiny_gguf(tiny_model_dir, tmp_path / "tiny.gguf")
"""

from __future__ import annotations

import json
from pathlib import Path


def write_tiny_gguf(model_dir: Path, out: Path, name: str = "tiny qwen2") -> Path:
    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = model.config
    w = gguf.GGUFWriter(str(out), "qwen2")
    # 1. architecture
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    # 2. tokenizer: every embedding row has a token (the tail past the tokenizer is unused)
    bpe = json.loads(tok.backend_tokenizer.to_str())["model"]
    by_id = {i: t for t, i in bpe["vocab"].items()}
    special = set(tok.all_special_ids)
    tokens, types = [], []
    for i in range(cfg.vocab_size):
        if i < len(tok):
            tokens.append(by_id.get(i) or tok.convert_ids_to_tokens(i))
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[UNUSED{i}]")
            types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in bpe["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tok.chat_template)
    # 3. weights (tied: no output.weight, as in SmolLM2's file)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue
        array = tensor.numpy().astype(np.float32)
        gguf_name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            blocks = gguf.quants.quantize(array, q8)
            w.add_tensor(gguf_name, blocks, raw_shape=blocks.shape, raw_dtype=q8)
        else:
            w.add_tensor(gguf_name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
