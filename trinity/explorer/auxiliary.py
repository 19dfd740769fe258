"""Auxiliary models: engine pools beside the policy's that workflows call (a judge, a simulated
user), never trained.

    explorer:
      auxiliary_models:
        - {name: judge, model_path: Qwen/Qwen2.5-7B-Instruct, enable_openai_api: true}

    judge = model.auxiliary("judge")             # or model.auxiliary(0): by name or position
    [s] = await judge.chat(messages, temperature=0.0)
    verdict = judge.decode(s.response_ids)
    client = judge.async_openai_client()         # with enable_openai_api (an endpoint of its own)
    r = await client.chat.completions.create(model=client.model_path, messages=messages)

The explorer starts `engine_num` replicas of each (their own dtype, seed and threads; they count
as engines in the core shares, `common/resources.py`) and one `BatchingClient` per model, so a
step's judge calls are batched as the policy's are. Nothing is recorded: a call never enters the
task's ledger, so `model.extract_experiences()` holds the policy's calls alone and no token an
auxiliary model sampled is trained. Each call is rendered whole (no bridging: there is no
trajectory to extend). Calls are keyed like the policy's: the k-th call of a try to model j
samples with a key of (the try's key, j, the model's seed, k), so a judge's verdicts repeat with
the seed whatever shares its batch.

Lengths: `max_model_len`, `max_prompt_tokens`, `max_response_tokens` and `enable_thinking`
default to `model.*` (as Trinity-RFT); a prompt over `max_prompt_tokens` is refused
(`PromptTooLong`), never cut, since a cut judge prompt would judge something else. Sampling
defaults are `model.temperature`, `top_p`, `top_k`, n = 1.

Which models are served: all of them, except `auxiliary_models[0]` under an algorithm whose
record reads its teacher from it (`teacher_from_auxiliary`, on-policy distillation): the trainer
loads that one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trinity.common.keys import stable_key
from trinity.common.reasoning import ReasoningParser, note_split, reasoning_parser
from trinity.common.rollout import PromptTooLong, Sample, SamplingParams
from trinity.explorer.bridging import encode, render_ids, split_reply_prefix
from trinity.explorer.call_args import TemplateError, sampling_params
from trinity.explorer.model_calls import ModelCalls


def served_auxiliary(cfg: Any) -> list[int]:
    """Positions in `explorer.auxiliary_models` of the models the explorer serves (module doc)."""
    from trinity.algorithm.algorithms import known_algorithm

    teacher = getattr(known_algorithm(cfg.algorithm.algorithm_type), "teacher_from_auxiliary", 0)
    return [i for i in range(len(cfg.explorer.auxiliary_models)) if not (teacher and i == 0)]


def auxiliary_engines(cfg: Any) -> int:
    """Engine replicas the explorer starts for auxiliary models (for the core shares)."""
    return sum(cfg.explorer.auxiliary_models[i].engine_num for i in served_auxiliary(cfg))


def auxiliary_limits(cfg: Any, index: int) -> tuple[int | None, int | None, int]:
    """(max_model_len, max_prompt_tokens, max_response_tokens) of auxiliary model `index`:
    its own, else `model.*` (64 response tokens when neither says)."""
    aux, m = cfg.explorer.auxiliary_models[index], cfg.model
    total = aux.max_model_len if aux.max_model_len is not None else m.max_model_len
    prompt = aux.max_prompt_tokens if aux.max_prompt_tokens is not None else m.max_prompt_tokens
    response = next(
        (v for v in (aux.max_response_tokens, m.max_response_tokens) if v is not None), 64
    )
    return total, prompt, response


def label(key: int | str) -> str:
    """`auxiliary_models[i]` or `auxiliary model 'name'`, for messages."""
    return f"auxiliary_models[{key}]" if isinstance(key, int) else f"auxiliary model {key!r}"


@dataclass
class AuxiliaryModel:
    """One served auxiliary model: its engines' client and how calls to it are made."""

    index: int  # position in explorer.auxiliary_models
    name: str | None
    model_path: str  # as configured: the model name its OpenAI endpoint serves
    client: Any  # BatchingClient over its engines
    tokenizer: Any
    defaults: SamplingParams
    template_kwargs: dict[str, Any]
    max_prompt_tokens: int | None
    seed: int
    openai_api: bool = False  # configured: enable_openai_api
    reasoning: ReasoningParser | None = None  # its reasoning_parser: splits its chat replies
    url: str | None = None  # its endpoint's base URL, ".../v1", once served
    sessions: Any = None  # its endpoint's `WorkflowSessions`: the running tries' handles


def auxiliary_model(cfg: Any, index: int, client: Any, tokenizer: Any) -> AuxiliaryModel:
    """Served auxiliary model `index` over `client` (a `BatchingClient` of its engines): its
    sampling defaults, template kwargs and prompt limit from the config (module doc)."""
    from trinity.config import seeds

    aux, m = cfg.explorer.auxiliary_models[index], cfg.model
    _, max_prompt, max_response = auxiliary_limits(cfg, index)
    thinking = aux.enable_thinking if aux.enable_thinking is not None else m.enable_thinking
    defaults = SamplingParams(
        n=1, temperature=m.temperature, top_p=m.top_p, top_k=m.top_k, max_tokens=max_response
    )
    return AuxiliaryModel(
        index=index,
        name=aux.name,
        model_path=aux.model_path,
        client=client,
        tokenizer=tokenizer,
        defaults=defaults,
        template_kwargs={} if thinking is None else {"enable_thinking": thinking},
        max_prompt_tokens=max_prompt,
        seed=seeds.auxiliary_seed(cfg, index),
        openai_api=aux.enable_openai_api,
        reasoning=reasoning_parser(aux.reasoning_parser),
    )


def why_not_served(cfg: Any) -> str:
    """Why a configured auxiliary model is not served (the teacher's case)."""
    return (
        f"algorithm_type {cfg.algorithm.algorithm_type!r} reads its teacher from it, which the "
        "trainer loads"
    )


class AuxiliaryModels:
    """The served auxiliary models, found by position or name; `handles(key, session)` makes a
    try's handles (one per model)."""

    def __init__(self, models: list[AuxiliaryModel], configured: list[Any], why_not: str = ""):
        """`configured`: every `explorer.auxiliary_models` entry (to name the ones not served);
        `why_not`: why a configured model is not served (the teacher's note)."""
        self.models = {m.index: m for m in models}
        self.configured = configured
        self.why_not = why_not

    def __iter__(self) -> Iterator[AuxiliaryModel]:
        return iter(self.models.values())

    def find(self, key: int | str) -> AuxiliaryModel:
        """The model at position `key` (an int) or named `key` (a str); LookupError listing the
        served models otherwise."""
        if isinstance(key, bool) or not isinstance(key, int | str):
            raise TypeError(
                f"an auxiliary model is named by position (int) or name (str), got {key!r}"
            )
        index = key if isinstance(key, int) else self._by_name(key)
        if index is not None and index in self.models:
            return self.models[index]
        if index is not None and 0 <= index < len(self.configured):
            raise LookupError(
                f"explorer.auxiliary_models[{index}] is not served to workflows: {self.why_not}"
            )
        raise LookupError(f"no {label(key)}; {self.listing()}")

    def _by_name(self, name: str) -> int | None:
        return next((i for i, m in enumerate(self.configured) if m.name == name), None)

    def listing(self) -> str:
        if not self.models:
            return "explorer.auxiliary_models serves none to workflows"
        served = [f"{m.index}" + (f" ({m.name!r})" if m.name else "") for m in self]
        return "served: " + ", ".join(served)

    def handles(self, key: int | None, session: str | None) -> dict[int, AuxiliaryHandle]:
        """One handle per served model for one try of a task: keyed by the try's `key` (None:
        the engines' generators), bound to `session` on each model's endpoint."""
        return {m.index: AuxiliaryHandle(m, key, session) for m in self}


class AuxiliaryHandle(ModelCalls):
    """What a workflow holds of one auxiliary model (`model.auxiliary(key)`): `chat`,
    `generate`, `logprobs`, `decode`, `encode` and OpenAI clients, none of them recorded."""

    def __init__(self, model: AuxiliaryModel, key: int | None, session: str | None) -> None:
        self._model = model
        self._key = None if key is None else stable_key(key, "aux", model.index, model.seed)
        self._calls = 0
        self._session = session
        self.tokenizer = model.tokenizer

    @property
    def name(self) -> str | None:
        return self._model.name

    @property
    def model_path(self) -> str:
        """The model name its OpenAI endpoint serves (pass it as `model=`)."""
        return self._model.model_path

    @property
    def model_version(self) -> int:
        return self._model.client.model_version

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        refuse_over_long: bool = True,
        **sampling: Any,
    ) -> list[Sample]:
        """Sample replies to `messages`, rendered whole by this model's chat template.
        `sampling`: SamplingParams fields, plus `stop` and `seed` (as `ModelHandle.chat`).
        `refuse_over_long`: the rollout handle's argument; an auxiliary model always refuses an
        over-long prompt (`check_prompt`)."""
        rest, prefix = split_reply_prefix(messages)  # a reply prefix: its ids end the prompt
        try:
            ids = render_ids(
                self.tokenizer, rest, tools=tools, template_kwargs=self._model.template_kwargs
            )
        except Exception as e:  # the template's own error, whatever its kind
            raise TemplateError(f"the chat template cannot render these messages: {e}") from e
        if prefix is not None:
            ids += encode(self.tokenizer, prefix)
        samples = await self._sample(ids, sampling)
        if self._model.reasoning is not None:  # info: reasoning_content, content
            for s in samples:
                text, stop = self.decode(s.response_ids), s.info.get("stop")
                note_split(
                    self._model.reasoning,
                    text[: text.find(stop)] if stop and stop in text else text,
                    s.info,
                )
        return samples

    async def generate(
        self, prompt: str | list[int], refuse_over_long: bool = True, **sampling: Any
    ) -> list[Sample]:
        """Sample continuations of a text or of token ids (`refuse_over_long`: as `chat`'s)."""
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return await self._sample(ids, sampling)

    def check_prompt(self, ids: list[int]) -> None:
        """Raise `PromptTooLong` for a prompt over this model's max_prompt_tokens."""
        limit = self._model.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            raise PromptTooLong(
                f"a prompt of {len(ids)} tokens for {label(self._key_name())}, over its "
                f"max_prompt_tokens ({limit}: explorer.auxiliary_models[{self._model.index}]."
                "max_prompt_tokens, else model.max_prompt_tokens); auxiliary models refuse a "
                "prompt rather than cut it"
            )

    async def _sample(self, ids: list[int], sampling: dict[str, Any]) -> list[Sample]:
        params, seed = sampling_params(self._model.defaults, sampling)
        self._calls += 1  # counted either way: later calls keep their keys
        key = None if self._key is None else stable_key(self._key, self._calls)
        if seed is not None:
            key = stable_key("seed", seed)
        self.check_prompt(ids)
        return await self._model.client.generate(ids, params, key)

    def _key_name(self) -> int | str:
        return self._model.name or self._model.index

    async def logprobs(self, tokens: list[int]) -> list[float]:
        return await self._model.client.logprobs(tokens)

    def bind_reply(self, call_id: str, tool_call_ids: list[str]) -> None:
        """Nothing to bind: no later call continues an auxiliary reply (the endpoint's hook)."""

    def note_tool_calls(self, call_id: str, status: str, error: str = "") -> None:
        """Nothing to keep: auxiliary replies are not trained (the endpoint's hook)."""

    def _client_endpoint(self) -> tuple[str, str]:
        """This model's session on its endpoint; needs `enable_openai_api: true` on it."""
        m = self._model
        if not m.openai_api:
            raise RuntimeError(
                f"this workflow asks for an OpenAI client of {label(self._key_name())}: "
                f"set explorer.auxiliary_models[{m.index}].enable_openai_api: true"
            )
        if m.url is None or self._session is None:
            raise RuntimeError(
                f"the OpenAI endpoint of {label(self._key_name())} is not served in this "
                "process (the explorer serves it; `trinity debug` does not)"
            )
        return m.url.removesuffix("/v1") + f"/sessions/{self._session}/v1", m.model_path
