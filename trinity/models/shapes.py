"""A model's shape as its config states it, read without torch or its weights (pre-flight).

shape = model_shape("tiny://1m?seed=0")   # {"num_attention_heads": 4, ...}, or None
divisibility_problem(shape, 2)            # None: 2 tensor-parallel ranks can split it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TP_KEY = "tensor_parallel_size"


def model_shape(model_path: str) -> dict[str, Any] | None:
    """The config of the model at `model_path` as a dict: a `tiny://` preset's shape, or a
    folder's config.json; None where it is not at hand without building or importing it (a
    `gguf://` or `pkg://` model, a missing folder)."""
    from trinity.models.imported import is_import_url
    from trinity.models.loading import TINY_SCHEME, parse_tiny_url

    if is_import_url(model_path):
        return None
    if model_path.startswith(TINY_SCHEME):
        from trinity.models.tiny import PRESETS

        try:
            return dict(PRESETS[parse_tiny_url(model_path)[0]])
        except ValueError:
            return None
    config = Path(model_path).expanduser() / "config.json"
    try:
        return dict(json.loads(config.read_text()))
    except (OSError, ValueError):
        return None


def divisibility_problem(config: Any, world: int, key: str = TP_KEY) -> str | None:
    """Why `world` tensor-parallel ranks cannot split the model of `config` (a transformers
    config, or its config.json as a dict), or None: its attention heads, KV heads and MLP
    intermediate size must each be a multiple of `world`. `key`: the config key to name."""

    def get(name: str) -> Any:
        return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

    heads = get("num_attention_heads")
    sizes = {
        "attention heads (num_attention_heads)": heads,
        "KV heads (num_key_value_heads)": get("num_key_value_heads") or heads,
        "MLP intermediate size (intermediate_size)": get("intermediate_size"),
    }
    bad = [f"{what} {n}" for what, n in sizes.items() if isinstance(n, int) and n % world]
    if not bad:
        return None
    return (
        f"{key}={world} must divide the model's attention heads, KV heads and MLP intermediate "
        f"size: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not divisible by {world}"
    )
