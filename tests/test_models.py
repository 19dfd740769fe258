"""Tiny model builds and model loading: determinism, HF compatibility, tokenizer, tiny:// cache."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from trinity.models import (
    PRESETS,
    count_parameters,
    create_tiny_model,
    load_model,
    load_tokenizer,
    parse_tiny_url,
    preset_config,
    resolve_dtype,
    resolve_model_path,
    tiny,
)
from trinity.models.tiny import IM_END, IM_START, builder_fingerprint, tokenizer_corpus

# Range each preset's name promises.
PRESET_RANGES = {
    "1m": (0.8e6, 1.2e6),
    "5m": (4e6, 6e6),
    "10m": (8e6, 12e6),
    "20m": (16e6, 24e6),
    "50m": (40e6, 60e6),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _qwen2_params(cfg) -> int:
    """Qwen2 parameter count by hand: tied embedding + per layer (q/k/v with bias, o without,
    gated MLP, two RMSNorms) + final norm."""
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads
    kv_dim = kv * h // cfg.num_attention_heads
    attn = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h
    layer = attn + 3 * h * i + 2 * h
    return cfg.vocab_size * h + cfg.num_hidden_layers * layer + h


# -- build ---------------------------------------------------------------------------------------


def test_same_seed_builds_identical_bytes(tiny_model_dir, tmp_path):
    again = create_tiny_model(tmp_path / "again", preset="1m", seed=0)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert _sha(again / name) == _sha(tiny_model_dir / name), name
    other = create_tiny_model(tmp_path / "other", preset="1m", seed=1)
    assert _sha(other / "model.safetensors") != _sha(tiny_model_dir / "model.safetensors")
    assert _sha(other / "tokenizer.json") == _sha(tiny_model_dir / "tokenizer.json")
    # atomic build: no temp folders left beside the outputs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]


def test_existing_folder_rules(tiny_model_dir, tmp_path):
    assert create_tiny_model(tiny_model_dir, preset="1m", seed=0) == tiny_model_dir  # reuse
    with pytest.raises(FileExistsError):
        create_tiny_model(tiny_model_dir, preset="1m", seed=3)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        create_tiny_model(junk)
    create_tiny_model(junk, preset="1m", seed=2, overwrite=True)
    assert not (junk / "notes.txt").exists()
    assert json.loads((junk / "trinity_tiny.json").read_text())["seed"] == 2
    with pytest.raises(ValueError, match="valid: 1m"):
        create_tiny_model(tmp_path / "x", preset="2m")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_param_counts(preset):
    n = count_parameters(preset)  # meta device: nothing allocated
    assert n == _qwen2_params(preset_config(preset))
    lo, hi = PRESET_RANGES[preset]
    assert lo <= n <= hi, f"{preset}: {n:,}"


def test_built_model_matches_its_preset(tiny_model_dir):
    model = load_model(tiny_model_dir)
    assert sum(p.numel() for p in model.parameters()) == count_parameters("1m")
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# -- Hugging Face compatibility ------------------------------------------------------------------


def test_auto_classes_load_unchanged(tiny_model_dir):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == IM_END and tok.pad_token == "<|endoftext|>"
    # AutoTokenizer's class encodes exactly like the saved tokenizer.json
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    samples = [*tokenizer_corpus()[::25], "  12 +  34 = 46\n\n", "cafe\u0301 ½ 𝜋", "x\t\ty"]
    for s in samples:
        assert tok.encode(s, add_special_tokens=False) == raw.encode(s).ids, repr(s)


def test_chat_template_renders_chatml(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2="}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n1+2=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert list(ids).count(tok.convert_tokens_to_ids(IM_START)) == 2  # one token each


def test_digits_are_single_tokens_and_round_trip(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    ids = tok.encode("12+34=46", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces == ["1", "2", "+", "3", "4", "=", "4", "6"]
    for text in ("12+34=46", "Use 3 5 7 to make 22", "-905 * 17", "#### 1,234"):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert 512 <= len(tok) <= 1024


def test_generate_stops_at_im_end(tiny_model_dir):
    from transformers import LogitsProcessor, LogitsProcessorList

    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert im_end in model.generation_config.eos_token_id

    class EndAtThird(LogitsProcessor):  # the random model won't emit <|im_end|> on its own
        def __init__(self, prompt_len: int) -> None:
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] - self.prompt_len == 2:
                scores[:] = -float("inf")
                scores[:, im_end] = 0.0
            return scores

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt = prompt["input_ids"] if not torch.is_tensor(prompt) else prompt
    torch.manual_seed(0)
    out = model.generate(
        prompt,
        do_sample=True,
        max_new_tokens=20,
        logits_processor=LogitsProcessorList([EndAtThird(prompt.shape[1])]),
    )
    new = out[0, prompt.shape[1] :].tolist()
    assert len(new) == 3 and new[-1] == im_end


# -- loading -------------------------------------------------------------------------------------


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="not a Hugging Face model folder"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")


def test_load_tokenizer_options(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir, custom_chat_template="{{ messages[0]['content'] }}!")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi!"
    assert tok.padding_side == "right"  # as saved; left padding is the engine's business
    # a tokenizer without a pad token gets eos
    raw = load_tokenizer(tiny_model_dir)
    raw.pad_token = None
    raw.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).pad_token == IM_END


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float7", "cpu")


def test_resolve_plain_paths():
    assert resolve_model_path("/a/b") == "/a/b"
    assert resolve_model_path("~/m") == os.path.expanduser("~/m")


def test_parse_tiny_url():
    assert parse_tiny_url("tiny://1m") == ("1m", None)  # a run config adds its global seed
    assert parse_tiny_url("tiny://5m?seed=7") == ("5m", 7)
    for bad in ("tiny://3m", "tiny://1m?seed=x", "tiny://1m?sed=1", "tiny://"):
        with pytest.raises(ValueError, match="tiny"):
            parse_tiny_url(bad)


def test_resolve_tiny_builds_once_under_a_lock(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("TRINITY_CACHE_DIR", str(tmp_path))
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_model_path("tiny://1m?seed=0")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = tmp_path / "models" / f"qwen2-1m-seed0-{builder_fingerprint()}"
    assert results == [str(expected)] * 2
    weights = expected / "model.safetensors"
    assert _sha(weights) == _sha(tiny_model_dir / "model.safetensors")
    mtime = weights.stat().st_mtime_ns
    assert resolve_model_path("tiny://1m") == str(expected)  # seed defaults to 0; cached
    assert weights.stat().st_mtime_ns == mtime
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_builder_fingerprint_follows_what_the_build_reads(monkeypatch):
    before = builder_fingerprint()
    assert builder_fingerprint() == before  # stable within a process (and cached)
    builder_fingerprint.cache_clear()
    monkeypatch.setattr(tiny, "tokenizer_corpus", lambda: [*tokenizer_corpus(), "new text"])
    changed_corpus = builder_fingerprint()
    builder_fingerprint.cache_clear()
    monkeypatch.undo()
    monkeypatch.setitem(tiny.PRESETS, "1m", {**tiny.PRESETS["1m"], "num_hidden_layers": 5})
    changed_preset = builder_fingerprint()
    builder_fingerprint.cache_clear()
    monkeypatch.undo()
    assert builder_fingerprint() == before
    assert len({before, changed_corpus, changed_preset}) == 3


def test_a_build_by_another_builder_is_not_reused(tmp_path, monkeypatch, tiny_model_dir):
    """A cached folder whose marker names another fingerprint is stale: never taken as current."""
    stale = tmp_path / "stale"
    stale.mkdir()
    marker = json.loads((tiny_model_dir / tiny.MARKER).read_text())
    assert marker["fingerprint"] == builder_fingerprint()
    (stale / tiny.MARKER).write_text(json.dumps({**marker, "fingerprint": "0" * 12}))
    assert tiny.is_tiny_model_dir(tiny_model_dir, marker["preset"], marker["seed"])
    assert not tiny.is_tiny_model_dir(stale, marker["preset"], marker["seed"])


def test_loading_a_model_prints_no_progress_bar(tiny_model_dir):
    # a fresh process, as a Ray actor is: transformers' "Loading weights" tqdm bar (on stderr,
    # forwarded by Ray to the driver's console) must not appear; a warning would still show
    import subprocess
    import sys

    code = (
        "from trinity.models import load_model, load_tokenizer\n"
        f"load_tokenizer({str(tiny_model_dir)!r}); load_model({str(tiny_model_dir)!r})\n"
        "print('loaded')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "loaded", r.stderr
    assert "Loading weights" not in r.stderr and "it/s" not in r.stderr, r.stderr
