"""The rollout-engine contract: what workflows and the explorer may rely on, whatever the engine.

    explorer.rollout_model: {engine_type: transformers, engine_num: 2}

`RolloutEngine` is a Protocol and `ENGINE` its registry keyed by `engine_type`. This module imports
no engine: workflows and the request batcher depend on it alone, and an engine module registers
itself (`trinity/explorer/engine.py` is `transformers`, the portable one;
`trinity/explorer/vllm_engine.py` is `vllm`, where vLLM is installed;
`trinity/explorer/external_engine.py` is `external`, an OpenAI-compatible endpoint, chosen by
`model.external_model`). A new engine is a new module
with a `@ENGINE.register(...)` class and a line in `ENGINE`'s `modules`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trinity.common.registry import Registry


@dataclass(frozen=True)
class Peers:
    """The engines that load one weights payload together (`RolloutEngine.update_weights`): this
    one is `rank` of `world`, in call `call`, an id the same for all of them and new for every load.
    A collective sync method needs it (`trinity.sync.collective`); the others ignore it."""

    rank: int = 0
    world: int = 1
    call: str = field(default_factory=lambda: uuid.uuid4().hex)


# the vLLM engine's cap on `SamplingParams.logprobs` (vLLM's `max_logprobs`); a config check
# refuses more with engine_type vllm
VLLM_MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `n` sequences are drawn per prompt. `stop`: strings that end a reply at
    the token whose text completes one of them (that token is kept: it was sampled and is
    trained on; the reply's text is returned without the string)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    logprobs: int = 0  # top alternatives per token (`Sample.top_ids`); 0 = none


@dataclass(frozen=True)
class Progress:
    """What a `generate_stream` sampled at one decode step for the prompts it was asked to
    watch: one (prompt, sample, position, token id, logprob, text) per live row, `text` being
    what the token adds to that sample's text (empty while a character's bytes are incomplete;
    the pieces join to a prefix of the decoded reply). `model_version`: the weights sampling."""

    model_version: int
    tokens: list[tuple[int, int, int, int, float, str]]


class BadPrompt(ValueError):
    """A prompt an engine cannot sample from (an empty one). An engine puts the error in that
    prompt's place in `generate`'s answer: its batch-mates are served all the same."""


class PromptTooLong(BadPrompt):
    """A prompt leaves no room for a response under the engine's `max_model_len` (or is over a
    `max_prompt_tokens` that refuses rather than cuts); in `generate`'s answer as `BadPrompt`."""


@dataclass
class Sample:
    """One sampled continuation of one prompt."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    # "stop" (eos sampled), "length" (max_tokens or max_model_len reached), "prompt_truncated"
    # (not sampled: the prompt was over max_prompt_tokens, `TaskModelHandle`)
    finish_reason: str
    model_version: int
    info: dict[str, Any] = field(default_factory=dict)
    # with `SamplingParams.logprobs` = k > 0: per response token, the k most likely token ids of
    # the raw policy (the distribution `logprobs` are of), most likely first, and their logprobs
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    """Batched sampling with per-token logprobs on versioned weights (one Ray actor each).

    Constructed as `cls(model_path, *, dtype, seed, max_batch_size, max_model_len, num_threads,
    custom_chat_template)`, plus the pool keys a class names in its `pool_keys` (a tuple of
    `explorer.rollout_model` field names, passed as keyword arguments of the same names) and
    what its `run_kwargs(cfg)` static method returns, if it has one (`run_kwargs`).
    """

    model_version: int

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
    ) -> list[list[Sample] | BadPrompt]:
        """`params.n` samples per prompt (token ids in, token ids + logprobs out).

        `keys`: a 64-bit sampling key per prompt. A keyed prompt's samples depend on its key, its
        params and the weights alone, never on the rest of the batch (`explorer/sampling.py`);
        None leaves the draws to the engine's seeded generator. Each prompt's response budget is
        its own: min(`params.max_tokens`, max_model_len - its length). A prompt with no room
        gets a `PromptTooLong` in its place, an empty one a `BadPrompt`, and the others are
        sampled as if it were not there. A sample that completes one of `params.stop` ends
        there, finish_reason "stop" and `info["stop"]` the string, checked as it is decoded.
        An engine class whose `takes_messages(cfg)` is true is also given `chats=`: per prompt,
        the (messages, tools) of the chat call it was rendered from, or None (`takes_messages`).
        """
        ...

    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        watch: list[bool] | None = None,
    ) -> Iterator[Progress | list[list[Sample] | BadPrompt]]:
        """`generate` as it goes: a `Progress` per decode step for the prompts `watch` marks
        (none: no progress), then `generate`'s answer as the last item, the same samples. A Ray
        actor's is called with `.options(num_returns="streaming")`, so each step reaches the
        caller (an OpenAI client's stream) while the next is sampled."""
        ...

    def logprobs(self, tokens: list[int]) -> list[float]:
        """Logprob of tokens[1:] given their prefixes."""
        ...

    def update_weights(
        self, method: str, payload: list[Any], version: int, peers: Peers | None = None
    ) -> int:
        """Load weights published with sync method `method` (`trinity.sync.method`); `peers`
        places this engine among those loading them in one call (None: on its own)."""
        ...

    def weights_version(self) -> int:
        """The version of the weights loaded (0: those the engine was built with)."""
        ...

    def sleep(self, level: int = 1) -> int:
        """Colocation (`common.turns`): free the device for the trainer until `wake_up` (level 1:
        the weights to host memory, caches freed); sampling and scoring are refused meanwhile.
        Returns the bytes moved, where the engine knows them."""
        ...

    def wake_up(self) -> int:
        """Back on the device after `sleep`; returns the bytes moved."""
        ...

    def get_stats(self) -> dict[str, float]: ...

    def startup_marks(self) -> dict[str, float]:
        """Epoch seconds of `engine_process`, `engine_imports` and `engine_ready` (model
        loaded): the run's start-up timeline (`trinity.common.startup`)."""
        ...

    def set_num_threads(self, num_threads: int) -> None:
        """Compute with this many CPU threads from the next call on (a split run's explorer
        sets it before each step to its part of the run's cores)."""
        ...


ENGINE: Registry[type] = Registry(
    "engine_type",
    modules={
        "transformers": "trinity.explorer.engine",
        "vllm": "trinity.explorer.vllm_engine",
        "external": "trinity.explorer.external_engine",
    },
)


def engine_class(engine_type: str) -> type:
    """The registered engine class for `engine_type` (importing its module on first use)."""
    return ENGINE.get(engine_type)


def pool_kwargs(engine_cls: type, pool: Any) -> dict[str, Any]:
    """An engine pool's (`explorer.rollout_model`, an auxiliary model) values of the keys the
    engine class reads besides the contract's (`pool_keys`: vLLM's knobs; ours has none)."""
    return {key: getattr(pool, key) for key in getattr(engine_cls, "pool_keys", ())}


def run_kwargs(engine_cls: type, cfg: Any) -> dict[str, Any]:
    """What an engine class takes from the run's config besides the contract's arguments and
    its pool keys (its `run_kwargs(cfg)`: the external engine's `model.external_model`)."""
    hook = getattr(engine_cls, "run_kwargs", None)
    return hook(cfg) if hook is not None else {}


def takes_messages(engine_cls: type, cfg: Any) -> bool:
    """Whether the engines of `engine_cls` take each chat call's messages and tools besides its
    rendered prompt (`generate(..., chats=[(messages, tools) or None per prompt])`: an external
    model's chat API, which samples from messages); the class's `takes_messages(cfg)`, else no."""
    hook = getattr(engine_cls, "takes_messages", None)
    return bool(hook(cfg)) if hook is not None else False
