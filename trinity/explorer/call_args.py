"""A model call's arguments and what ends its reply: shared by the rollout model's handles
(`model_client`) and the auxiliary models' (`auxiliary`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trinity.common.rollout import SamplingParams


class TemplateError(ValueError):
    """The chat template failed on a message list (a message shape it does not handle)."""


def sampling_params(
    defaults: SamplingParams, sampling: dict[str, Any]
) -> tuple[SamplingParams, int | None]:
    """A call's sampling arguments (SamplingParams fields over `defaults`, `stop` a string or
    a list of them, plus `seed`) as (params, seed); TypeError naming an unknown argument."""
    sampling = dict(sampling)
    seed = sampling.pop("seed", None)
    if "stop" in sampling:
        stop = sampling["stop"] or ()
        sampling["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(sampling) - known
    if unknown:
        raise TypeError(f"unknown sampling args {sorted(unknown)}; valid: {sorted(known)}")
    return dataclasses.replace(defaults, **sampling), seed
