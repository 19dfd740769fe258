"""The base class every config section derives from, and the small shared value types.

Every section rejects unknown keys (`extra="forbid"`), so a typo is an error with a suggestion
instead of a silently ignored setting. Numbers given where a string is expected (`name: 2024`) are
accepted as strings, because YAML and `${oc.env:...}` interpolation type them eagerly.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""Floating-point type of weights and activations; "auto" keeps the checkpoint's own dtype."""


class ConfigSection(BaseModel):
    """A strict config section: unknown keys are errors and every field carries a description."""

    model_config = ConfigDict(
        extra="forbid",
        coerce_numbers_to_str=True,
        protected_namespaces=(),
        validate_default=False,
    )

    renamed_keys: ClassVar[dict[str, str]] = {}
    """Deprecated key -> current key of this section (see `aliases.py`)."""
    renamed_values: ClassVar[dict[str, dict[str, str]]] = {}
    """Field -> {deprecated value -> current value} (see `aliases.py`)."""


def _check_top_k(value: int) -> int:
    """Validate a top-k sampling cutoff: -1 disables it, otherwise it must be at least 1."""
    if value != -1 and value < 1:
        raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {value}")
    return value


TopK = Annotated[int, AfterValidator(_check_top_k)]
"""A top-k sampling cutoff: -1 (disabled) or a positive number of tokens."""
