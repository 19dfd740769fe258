"""A model call's arguments and what ends its reply: shared by the rollout model's handles
(`model_client`) and the auxiliary models' (`auxiliary`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trinity.common.rollout import Sample, SamplingParams


class TemplateError(ValueError):
    """The chat template failed on a message list (a message shape it does not handle)."""


def sampling_params(
    defaults: SamplingParams, sampling: dict[str, Any]
) -> tuple[SamplingParams, tuple[str, ...], int | None]:
    """A call's sampling arguments (SamplingParams fields over `defaults`, plus `stop` and
    `seed`) as (params, stop strings, seed); TypeError naming an unknown argument."""
    sampling = dict(sampling)
    stop, seed = tuple(sampling.pop("stop", ()) or ()), sampling.pop("seed", None)
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(sampling) - known
    if unknown:
        raise TypeError(f"unknown sampling args {sorted(unknown)}; valid: {sorted(known)}")
    return dataclasses.replace(defaults, **sampling), stop, seed


def cut_at_stop(
    sample: Sample, stops: tuple[str, ...], decode: Callable[[list[int]], str]
) -> Sample:
    """`sample` ended at the first token whose text completes one of `stops` (finish_reason
    "stop", `info["stop"]` the string), as an engine that checks stop strings while decoding
    would have ended it; unchanged if its text holds none. The tokens sampled after that one
    were never part of the reply, so they are neither returned nor trained on."""

    def hit(k: int) -> str | None:
        text = decode(sample.response_ids[:k])
        return min((s for s in stops if s in text), key=text.find, default=None)

    n = len(sample.response_ids)
    if hit(n) is None:
        return sample
    lo, hi = 1, n  # the shortest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hit(mid) is not None else (mid + 1, hi)
    return dataclasses.replace(
        sample,
        response_ids=sample.response_ids[:lo],
        logprobs=sample.logprobs[:lo],
        finish_reason="stop",
        info={**sample.info, "stop": hit(lo)},
    )
