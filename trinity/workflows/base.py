"""The Workflow contract: `async run(task, model) -> list[Experience]`.

A workflow turns one task into experiences by talking to the rollout model through a `ModelHandle`
(`chat`, `generate`, `logprobs`). Sampling arguments are `SamplingParams` fields, plus `stop`
(strings that end a reply) and `seed` (the call's samples depend on it alone). Every call is
recorded token for token in the handle's ledger: a multi-turn workflow appends the sampled reply
and the next turn's messages to its message list and calls `chat` again (the prompt is the
sampled tokens + the new turn's delta, never a re-rendering), then returns
`model.extract_experiences(reward)`: one MULTI_TURN experience per trajectory, tool/environment/
user tokens masked out (docs/agentic.md). Workflows are registered by name; any dotted path
`package.module.Class` resolves too:

    buffer.explorer_input.default_workflow_type: math_workflow
    buffer.explorer_input.default_workflow_type: my_pkg.workflows.MyWorkflow

Write `async def run` (preferred); a workflow that must block (a synchronous environment, a
library without asyncio) subclasses `SyncWorkflow` and writes `run_sync(task, model)` with the
synchronous handle it is given.

Auxiliary models (`explorer.auxiliary_models`: a judge, a simulated user) are reached through
`model.auxiliary(0)` or `model.auxiliary("judge")`: the same `chat` / `generate` / `logprobs`,
plus `openai_client()` / `async_openai_client()` when that model has `enable_openai_api`; their
calls are never recorded nor trained (Trinity-RFT hands workflows these as a list of OpenAI
clients, `self.auxiliary_models`). A workflow that must keep a group of its experiences out of
training (a judge that contradicts itself) marks them with `exclude_from_training`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trinity.common.experience import Experience, exclude_from_training  # noqa: F401 (workflows use it)
from trinity.common.lazy import lazy_module
from trinity.common.registry import Registry
from trinity.common.rollout import Sample, SamplingParams

if TYPE_CHECKING:
    import torch
else:  # the driver imports this module's users without torch (`common.lazy`)
    torch = lazy_module("torch")

WORKFLOW: Registry[type] = Registry("workflow")


class _Sampling(Protocol):
    """What every model handle offers: sampling, scoring, tokenising and OpenAI clients."""

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **sampling: Any,
    ) -> list[Sample]: ...

    async def generate(self, prompt: str | list[int], **sampling: Any) -> list[Sample]: ...

    async def logprobs(self, tokens: list[int]) -> list[float]: ...

    def decode(self, ids: list[int]) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def openai_client(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client bound to this model (needs its `enable_openai_api`);
        `client.model_path` is the model name to pass."""
        ...

    def async_openai_client(self, **kwargs: Any) -> Any:
        """The same as an `openai.AsyncOpenAI` client (for `async def run`)."""
        ...


@runtime_checkable
class AuxiliaryModelHandle(_Sampling, Protocol):
    """An auxiliary model as a workflow sees it (`ModelHandle.auxiliary`): nothing recorded."""

    name: str | None
    model_path: str  # the model name its OpenAI clients pass


@runtime_checkable
class ModelHandle(_Sampling, Protocol):
    """What a workflow may ask of the rollout model. Every call is batched with concurrent ones,
    and every call (its OpenAI clients' too) is recorded in this session's ledger."""

    model_version: int
    defaults: SamplingParams  # the task's sampling: n samples (episodes) per task, temperature...

    def session(self) -> ModelHandle:
        """A new session (own ledger and conversation state), e.g. one per concurrent episode."""
        ...

    def auxiliary(self, key: int | str) -> AuxiliaryModelHandle:
        """Auxiliary model `key`: its position in `explorer.auxiliary_models` or its `name`."""
        ...

    def episode_of(self, sample: Sample) -> int:
        """The episode (`EID.run` of its experience) a returned sample belongs to."""
        ...

    def extract_experiences(
        self, reward: float | Mapping[int, float] | None = None, **kwargs: Any
    ) -> list[Experience]:
        """The session's recorded trajectories as MULTI_TURN experiences."""
        ...


class Workflow:
    """Base class: store the workflow args; subclasses implement `async run`.

    `takes_reply_prefix`: the workflow samples `task.prompt_messages()`, which end with the
    taskset's `format.reply_prefix` (pre-flight refuses a reply prefix for a workflow without
    it, which would not apply it)."""

    takes_reply_prefix: bool = False

    def __init__(self, **workflow_args: Any) -> None:
        self.args = workflow_args

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} must implement `async def run`")


class _BlockingView:
    """What both blocking views share: each model call is run on the explorer's loop while the
    calling worker thread waits."""

    def __init__(self, handle: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = handle
        self._loop = loop

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **sampling: Any,
    ) -> list[Sample]:
        return self._call(self._handle.chat(messages, tools, **sampling))

    def generate(self, prompt: str | list[int], **sampling: Any) -> list[Sample]:
        return self._call(self._handle.generate(prompt, **sampling))

    def logprobs(self, tokens: list[int]) -> list[float]:
        return self._call(self._handle.logprobs(tokens))

    def decode(self, ids: list[int]) -> str:
        return self._handle.decode(ids)

    def encode(self, text: str) -> list[int]:
        return self._handle.encode(text)

    def openai_client(self, **kwargs: Any) -> Any:
        """A blocking `openai.OpenAI` client of this model: its calls are answered by the
        endpoint on the explorer's loop while this thread waits."""
        return self._handle.openai_client(**kwargs)


def built_arg_problems(cls: type, args: dict[str, Any]) -> list[str]:
    """What is wrong with `workflow_args`, found by building the workflow with them (its
    constructor checks every argument's value): for a workflow's `arg_problems` (pre-flight)."""
    try:
        cls(**args)
    except (TypeError, ValueError, KeyError) as e:
        return [str(e)]
    return []


class SyncModelHandle(_BlockingView):
    """Blocking view of a ModelHandle for `SyncWorkflow.run_sync` (runs in a worker thread)."""

    def __init__(self, handle: ModelHandle, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(handle, loop)
        self.model_version = handle.model_version
        self.defaults = handle.defaults

    def session(self) -> SyncModelHandle:
        return SyncModelHandle(self._handle.session(), self._loop)

    def auxiliary(self, key: int | str) -> SyncAuxiliaryHandle:
        return SyncAuxiliaryHandle(self._handle.auxiliary(key), self._loop)

    def episode_of(self, sample: Sample) -> int:
        return self._handle.episode_of(sample)

    def extract_experiences(
        self, reward: float | Mapping[int, float] | None = None, **kwargs: Any
    ) -> list[Experience]:
        return self._handle.extract_experiences(reward, **kwargs)


class SyncAuxiliaryHandle(_BlockingView):
    """Blocking view of an `AuxiliaryModelHandle` (for `SyncWorkflow.run_sync`)."""

    def __init__(self, handle: AuxiliaryModelHandle, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(handle, loop)
        self.name = handle.name
        self.model_path = handle.model_path

    def async_openai_client(self, **kwargs: Any) -> Any:
        return self._handle.async_openai_client(**kwargs)


class SyncWorkflow(Workflow):
    """Adapter for blocking workflows: implement `run_sync(task, model)`; it runs in a thread."""

    def run_sync(self, task: Any, model: SyncModelHandle) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} must implement `run_sync`")

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        sync_model = SyncModelHandle(model, asyncio.get_running_loop())
        return await asyncio.to_thread(self.run_sync, task, sync_model)
