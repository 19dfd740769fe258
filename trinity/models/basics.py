"""What every user of a model asks of this process: the cache folder, transformers without
progress bars, a torch dtype by name. Imports nothing of the project's (`loading` and
`imported` both use them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """`$TRINITY_CACHE_DIR`, or `~/.cache/trinity`."""
    return Path(os.environ.get("TRINITY_CACHE_DIR") or "~/.cache/trinity").expanduser()


def quiet_transformers() -> None:
    """Switch off transformers' tqdm progress bars (which also switches off the hub's download
    bars) in this process. Its warnings stay on. Idempotent."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def resolve_dtype(dtype: str, device: str) -> Any:
    """A torch dtype: "auto" = float32 on CPU, bfloat16 on CUDA; else a name like "float16"."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16"}
    resolved = getattr(torch, aliases.get(dtype, dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return resolved
