"""What a Hugging Face model's forward takes, across transformers releases."""

from __future__ import annotations

import inspect

import torch


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name of the forward's KV-cache argument: transformers >= 5.2x names it `cache` (and
    warns on `past_key_values` at every call); older releases know only `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether any layer recomputes its activations in backward (gradient checkpointing), which
    makes a training forward ignore the KV cache. Any release: the flag is on the layers."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
