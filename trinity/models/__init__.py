"""Models: tiny offline Qwen2 builds and loading of any local Hugging Face folder.

from trinity.models import resolve_model_path, load_model, load_tokenizer
path = resolve_model_path("tiny://1m?seed=0")   # built and cached on first use
model, tok = load_model(path), load_tokenizer(path)
"""

from trinity.models.loading import (
    cache_root,
    load_model,
    load_tokenizer,
    parse_tiny_url,
    resolve_dtype,
    resolve_model_path,
)
from trinity.models.tiny import PRESETS, count_parameters, create_tiny_model, preset_config

__all__ = [
    "PRESETS",
    "cache_root",
    "count_parameters",
    "create_tiny_model",
    "load_model",
    "load_tokenizer",
    "parse_tiny_url",
    "preset_config",
    "resolve_dtype",
    "resolve_model_path",
]
