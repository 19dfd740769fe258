"""Sample strategies (`algorithm.sample_strategy`, args in `sample_strategy_args`).

One signature: ``fn(experiences: list, **args) -> list`` selects and/or reorders the experiences
that one train step uses (e.g. mixing in an auxiliary SFT buffer, dropping stale ones). It must
not mutate its input list.
"""

from __future__ import annotations

from typing import Any

from trinity.common.registry import Registry

SAMPLE_STRATEGY: Registry = Registry("sample_strategy")


@SAMPLE_STRATEGY.register("default")
def default_sample_strategy(experiences: list[Any]) -> list[Any]:
    """Identity: every experience, in order (a new list)."""
    return list(experiences)
