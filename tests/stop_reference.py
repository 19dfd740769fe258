"""The reference for stop strings: a finished sample cut where its text first holds one.

An engine checks stop strings while it decodes (`SamplingParams.stop`); its samples must equal
those of the same key sampled without stops and cut here afterwards (tests/test_engine.py), and
the scripted engines of the endpoint tests honour `stop` through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trinity.common.rollout import Sample


def cut_at_stop(
    sample: Sample, stops: tuple[str, ...], decode: Callable[[list[int]], str]
) -> Sample:
    """`sample` ended at the first token whose text completes one of `stops` (finish_reason
    "stop", `info["stop"]` the string); unchanged if its text holds none. Decodes every prefix:
    slow and plainly right."""
    for k in range(1, len(sample.response_ids) + 1):
        text = decode(sample.response_ids[:k])
        hits = [s for s in stops if s in text]
        if hits:
            return dataclasses.replace(
                sample,
                response_ids=sample.response_ids[:k],
                logprobs=sample.logprobs[:k],
                finish_reason="stop",
                info={**sample.info, "stop": min(hits, key=text.find)},
            )
    return sample
