"""The model handle workflows talk to, and the request batcher behind it.

Workflows run concurrently as asyncio tasks and each asks for its own samples. `BatchingClient`
collects every request made in the same turn of the event loop and sends them to the engines as
one batched `generate` per distinct set of sampling params, split evenly across `engine_num`
engines. So 16 tasks × 8 samples become one 128-sequence batch, not 16 small ones.

A crashed engine (its process died: `RayActorError`; an exception raised inside an engine method
is not a crash and propagates) is restarted by Ray when the actor was started with
`max_restarts`. The client waits for it to come back, loads the weights every engine holds into it
again (a restarted actor starts from the model it was created with), and resends the call. When
Ray gives up on it, `EngineLost` names the engine and the crash.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ray.exceptions import ActorUnavailableError, RayActorError

from trinity.common import heartbeat
from trinity.common.experience import Experience
from trinity.common.keys import stable_key
from trinity.common.lazy import lazy_module
from trinity.common.reasoning import REASONING_PARSER
from trinity.common.rollout import (
    BadPrompt,
    Peers,
    Progress,
    PromptTooLong,
    Sample,
    SamplingParams,
)
from trinity.common.turns import EnginesTurn
from trinity.explorer.auxiliary import AuxiliaryHandle, AuxiliaryModels
from trinity.explorer.call_args import TemplateError, sampling_params
from trinity.explorer.ledger import LedgerStats, SessionLedger
from trinity.explorer.model_calls import ModelCalls
from trinity.explorer.session import ChatSession, Prepared

if TYPE_CHECKING:
    import torch
else:  # the driver imports this module's users without torch (`common.lazy`)
    torch = lazy_module("torch")


Watch = Callable[[int, list[tuple[int, int, int, float, str]]], None]
"""What a streamed call hears at each decode step: (weights version, [(sample, position, token
id, logprob, text) per live sample]) (`Progress`, for one prompt). A position already heard
comes again when a crashed engine's call is sent again (its key samples the same tokens)."""


Chat = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]
"""A chat call's (messages, tools), for engines that take messages besides the rendered prompt."""


class _Request(NamedTuple):
    """One `generate` call waiting for its batch."""

    prompt: list[int]
    key: int | None
    answer: asyncio.Future
    watch: Watch | None = None
    chat: Chat | None = None


class EngineLost(RuntimeError):
    """A rollout engine's process died and Ray did not bring it back."""


class BatchingClient:
    def __init__(
        self, engines: list[Any], restart_timeout: float = 600.0, messages: bool = False
    ) -> None:
        """`restart_timeout`: seconds to wait for a crashed engine to answer again. `messages`:
        the engines take each chat call's messages besides its rendered prompt (`chats`, an
        external model's chat API: `common.rollout.takes_messages`)."""
        self.messages = messages
        if not engines:
            raise ValueError("no rollout engines")
        self.engines = engines  # Ray actor handles of HFRolloutEngine
        self._pending: list[tuple[SamplingParams, _Request]] = []
        self._flush_task: asyncio.Task | None = None  # gathering the next batch, if any
        self._batches: set[asyncio.Task] = set()  # batches in flight (the loop keeps weak refs)
        self.model_version = 0
        self.restart_timeout = restart_timeout
        self.restarts = 0  # engine crashes recovered from, over the client's life
        self._weights: tuple[str, list[Any], int] | None = None  # what every engine holds
        self._recovering: dict[int, asyncio.Task] = {}
        # colocation: the engines take the device before a call and sleep after a step
        self.turn: EnginesTurn | None = None
        self.service = "explorer"  # whose waits on the engines these are (`common.heartbeat`)

    async def _on_engine(
        self,
        i: int,
        call: Callable[[Any], Any],
        served_with: Callable[[Any, Any], Awaitable[int]] | None = None,
        what: str = "a call",
        on: str | None = None,
    ) -> Any:
        """`await call(engine i)`, recovering from crashes of engine i (see the module doc).

        `served_with(engine, result)`: the weights version the result came from. An answer from
        older weights than the engines were given means the engine was restarted between calls
        (Ray hands calls to the new process without an error): it is recovered and asked again.
        `what` the call is and what it waits `on` (default: `engine i`), for the stall doctor.
        """
        if self.turn is not None:
            await self.turn.hold()
        for _ in range(_MAX_RECOVERIES_PER_CALL):
            engine = self.engines[i]
            try:
                with heartbeat.waiting(self.service, on or f"engine {i}", what):
                    result = await call(engine)
                heartbeat.progress(self.service)
                if served_with is None or self._weights is None:
                    return result
                if await served_with(engine, result) >= self._weights[2]:
                    return result
                crash: BaseException = RuntimeError(
                    f"engine {i} answered with weights older than v{self._weights[2]}"
                )
            except RayActorError as e:
                crash = e
            # one recovery per crash, however many calls were in flight when it died
            task = self._recovering.get(i)
            if task is None or task.done():
                task = asyncio.create_task(self._recover(i, crash))
                self._recovering[i] = task
            await asyncio.shield(task)
        raise EngineLost(f"rollout engine {i} kept crashing: {crash}")

    async def _recover(self, i: int, crash: BaseException) -> None:
        """Wait for Ray to restart engine i, then give it the weights every engine holds."""
        engine, deadline = self.engines[i], time.monotonic() + self.restart_timeout
        while True:
            try:
                held = await engine.weights_version.remote()  # answers once it is up again
                break
            except ActorUnavailableError:  # restarting, or briefly unreachable: ask again
                if time.monotonic() > deadline:
                    raise EngineLost(
                        f"rollout engine {i} crashed and did not come back within "
                        f"{self.restart_timeout:.0f}s: {crash}"
                    ) from crash
                await asyncio.sleep(0.5)
            except RayActorError as e:
                raise EngineLost(
                    f"rollout engine {i} crashed and Ray did not restart it (restarts used up, "
                    f"explorer.rollout_model.max_restarts): {crash}"
                ) from e
        if self._weights is not None and held < self._weights[2]:
            method, payload, version = self._weights
            try:
                await engine.update_weights.remote(
                    method, payload, version, Peers(0, 1, _call_id())
                )
            except Exception as e:
                raise EngineLost(
                    f"rollout engine {i} restarted after a crash but could not load weights "
                    f"v{version} ({method}) again: {e}"
                ) from e
        elif self._weights is not None:
            return  # already given its weights: a late report of a crash recovered from
        self.restarts += 1

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        key: int | None = None,
        watch: Watch | None = None,
        chat: Chat | None = None,
    ) -> list[Sample]:
        """`params.n` samples of `prompt_ids`, batched with the requests made in the same turn
        of the event loop; `key` (`RolloutEngine.generate`) makes them independent of that batch.
        `watch`: called with each decode step's tokens as they are sampled (a streamed reply);
        its batch is then sampled with `generate_stream`. `chat`: the call's messages and tools,
        passed on where the engines take them (`messages`)."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((params, _Request(prompt_ids, key, fut, watch, chat)))
        if self._flush_task is None:
            self._flush_task = asyncio.create_task(self._flush())
            self._batches.add(self._flush_task)
            self._flush_task.add_done_callback(self._batches.discard)
        return await fut

    async def _flush(self) -> None:
        # let every runnable workflow reach its generate call before batching
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        pending, self._pending = self._pending, []
        # a request made from now on (a workflow's next turn, answered while other shards of
        # this batch are still running) gathers the next batch
        self._flush_task = None
        groups: dict[SamplingParams, list[_Request]] = {}
        for params, request in pending:
            groups.setdefault(params, []).append(request)
        await asyncio.gather(*(self._run_group(p, g) for p, g in groups.items()))

    async def _run_group(self, params: SamplingParams, group: list[_Request]) -> None:
        k = len(self.engines)
        shards = [group[i::k] for i in range(k)]
        calls = [
            (shard, asyncio.ensure_future(self._generate(i, shard, params)))
            for i, shard in enumerate(shards)
            if shard
        ]
        for shard, pending in calls:
            try:
                results = await pending
            except BaseException as e:  # hand the failure to every waiting workflow
                for r in shard:
                    if not r.answer.done():
                        r.answer.set_exception(e)
                continue
            for r, samples in zip(shard, results, strict=True):
                if r.answer.done():
                    continue
                if isinstance(samples, BadPrompt):  # this request's alone
                    r.answer.set_exception(samples)
                else:
                    r.answer.set_result(samples)

    async def _generate(
        self, i: int, shard: list[_Request], params: SamplingParams
    ) -> list[list[Sample] | BadPrompt]:
        prompts, keys = [r.prompt for r in shard], [r.key for r in shard]
        chats = {"chats": [r.chat for r in shard]} if self.messages else {}

        async def served_with(engine: Any, result: list[list[Sample] | BadPrompt]) -> int:
            versions = [
                s.model_version
                for samples in result
                if not isinstance(samples, BadPrompt)
                for s in samples
            ]
            if not versions:  # nothing was sampled: ask the engine what it holds
                return await engine.weights_version.remote()
            return min(versions)

        watched = [r.watch is not None for r in shard]
        what = f"generate for {len(prompts)} prompts"
        if not any(watched):
            return await self._on_engine(
                i, lambda e: e.generate.remote(prompts, params, keys, **chats), served_with, what
            )

        async def streamed(engine: Any) -> list[list[Sample] | BadPrompt]:
            result: list[list[Sample] | BadPrompt] = []
            call = engine.generate_stream.options(num_returns="streaming")
            async for ref in call.remote(prompts, params, keys, watched, **chats):
                item = await ref
                if not isinstance(item, Progress):
                    result = item
                    continue
                heard: dict[int, list[tuple[int, int, int, float, str]]] = {}
                for p, *rest in item.tokens:
                    heard.setdefault(p, []).append(tuple(rest))  # type: ignore[arg-type]
                for p, tokens in heard.items():
                    shard[p].watch(item.model_version, tokens)  # type: ignore[misc]
            return result

        return await self._on_engine(i, streamed, served_with, what)

    async def logprobs(self, tokens: list[int]) -> list[float]:
        async def served_with(engine: Any, result: list[float]) -> int:
            return await engine.weights_version.remote()

        return await self._on_engine(
            0, lambda e: e.logprobs.remote(tokens), served_with, f"logprobs of {len(tokens)} tokens"
        )

    async def update_weights(self, method: str, payload: list[Any], version: int) -> None:
        """Every engine loads the weights `payload` stands for (sync method `method`).

        An engine that crashes while loading is restarted and loads them alone (a group of one).
        """
        n, call = len(self.engines), _call_id()

        async def load(i: int) -> None:
            if self._weights is not None:
                held = await self._on_engine(i, lambda e: e.weights_version.remote())
                if held < self._weights[2]:
                    # restarted between calls (no error): counted; the load below replaces what
                    # it lost
                    self.restarts += 1
            first = True

            def send(engine: Any) -> Any:
                nonlocal first
                peers = Peers(i, n, call) if first else Peers(0, 1, _call_id())
                first = False
                return engine.update_weights.remote(method, payload, version, peers)

            await self._on_engine(
                i, send, what=f"engine {i} loading weights v{version} ({method})", on="synchronizer"
            )

        await asyncio.gather(*(load(i) for i in range(n)))
        self._weights = (method, payload, version)
        self.model_version = version


_MAX_RECOVERIES_PER_CALL = 8


def _call_id() -> str:
    return uuid.uuid4().hex


class TaskModelHandle(ModelCalls):
    """What one workflow run sees: the model with this task's default sampling params.

    `key` (a `stable_key` of the run's seed, the step, the task and the try): the k-th generate
    call of the workflow is sampled with key (key, k), so a task's samples are the same however
    its requests were batched; None leaves them to the engines' generators.

    `max_prompt_tokens` (`model.enable_prompt_truncation`, as Trinity-RFT): a prompt longer than
    this is not sampled. Each of its `n` samples is the prompt cut to `max_prompt_tokens` tokens
    plus the next prompt token as a one-token response (logprob 0, finish_reason
    "prompt_truncated"); the cut prompts are kept in `truncated_prompts`, and the explorer zeroes
    the action mask of every experience built on one (`mask_prompt_truncated`). None: prompts are
    sent whole, and one with no room under max_model_len fails its own task (`PromptTooLong`).

    Every call is recorded in the handle's exact-token ledger (`ledger`, `explorer/ledger.py`);
    `chat` continues a conversation from the sampled tokens (`explorer/session.py`), and
    `extract_experiences()` turns the recorded trajectories into MULTI_TURN experiences.
    `session()` opens another session (its own ledger and conversation state: one per episode
    when a workflow runs several at once). `bridging`: a `bridging.BRIDGE` name, None for the
    template check's choice.
    """

    def __init__(
        self,
        client: BatchingClient,
        tokenizer: Any,
        defaults: SamplingParams,
        chat_template_kwargs: dict[str, Any] | None = None,
        key: int | None = None,
        max_prompt_tokens: int | None = None,
        endpoint: tuple[str, str] | None = None,
        *,
        bridging: str | None = None,
        name: str = "s0",
        episodes: Iterator[int] | None = None,
        auxiliary: tuple[AuxiliaryModels, Mapping[int, AuxiliaryHandle]] | None = None,
        publish: Callable[[TaskModelHandle], tuple[str, str]] | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        """`endpoint`: (the base URL of this handle's session on the explorer's OpenAI-compatible
        endpoint, the model name it serves), when `enable_openai_api` is on. `publish`: instead
        of `endpoint`, what registers a handle as a session of that endpoint and returns its
        (base URL, model name) (`endpoint.server.SessionPublisher`); this handle and every
        `session()` opened from it are published, so each session has an OpenAI client.
        `auxiliary`: the served auxiliary models and this try's handles of them
        (`explorer/auxiliary.py`). `reasoning_parser`: a `REASONING_PARSER` name
        (`common/reasoning.py`): each chat sample's `info` gets its reply's
        `reasoning_content` and `content`."""
        self._auxiliary = auxiliary
        self._endpoint = endpoint
        self._publish = publish
        self._client = client
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._key = key
        self._calls = 0  # generate calls made, in the workflow's order
        self.max_prompt_tokens = max_prompt_tokens
        self.truncated_prompts: list[list[int]] = []
        self._bridging = bridging
        self._episodes = episodes if episodes is not None else itertools.count()
        self.ledger = SessionLedger(name, self._episodes)
        self.reasoning_parser = reasoning_parser
        self._chat = ChatSession(
            tokenizer,
            self.ledger,
            self.chat_template_kwargs,
            bridging,
            reasoning=REASONING_PARSER.get(reasoning_parser) if reasoning_parser else None,
        )
        self._sessions: list[TaskModelHandle] = []
        if endpoint is None and publish is not None:
            self._endpoint = publish(self)

    def _next_key(self) -> int | None:
        self._calls += 1
        return None if self._key is None else stable_key(self._key, self._calls)

    @property
    def model_version(self) -> int:
        return self._client.model_version

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        refuse_over_long: bool = False,
        watch: Watch | None = None,
        **sampling: Any,
    ) -> list[Sample]:
        """Sample replies to `messages` rendered by the chat template (with `tools`, the
        function definitions, when given). `sampling`: SamplingParams fields (`stop`: strings
        that end a reply) plus `seed` (the call's samples depend on it alone).
        `refuse_over_long`: a prompt over `max_prompt_tokens` raises `PromptTooLong` and is not
        recorded, instead of being answered from a cut prompt (the OpenAI endpoint's calls).
        `watch`: hears the tokens as they are sampled (`BatchingClient.generate`); the call is
        recorded once it returns.

        A message list that extends an earlier call's messages with one of its sampled replies
        and new messages is sent as that reply's held tokens + the new messages' delta; any other
        is rendered whole (`session.ChatSession.prepare`). Each sample's `info["call_id"]` names
        its ledger record."""
        try:
            prepared = self._chat.prepare(messages, tools)
        except Exception as e:  # the template's own error, whatever its kind (jinja, TypeError)
            raise TemplateError(f"the chat template cannot render these messages: {e}") from e
        try:
            chat = (messages, tools)
            samples = await self._sample(
                prepared.prompt_ids, sampling, refuse_over_long, watch, chat
            )
            self._chat.commit(prepared, messages, tools, samples)
        finally:
            self._chat.release(prepared)
        return samples

    async def generate(
        self,
        prompt: str | list[int],
        refuse_over_long: bool = False,
        watch: Watch | None = None,
        **sampling: Any,
    ) -> list[Sample]:
        """Sample continuations of a text or of token ids (recorded; merged into a trajectory
        when the ids extend one exactly). `refuse_over_long`, `watch`: as `chat`'s."""
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        samples = await self._sample(ids, sampling, refuse_over_long, watch)
        self._chat.commit(Prepared(ids, "tokens"), None, None, samples)
        return samples

    def check_prompt(self, ids: list[int]) -> None:
        """Raise `PromptTooLong` for a prompt over `max_prompt_tokens`: what an OpenAI endpoint
        answers with 400 `context_length_exceeded`, where a workflow's own call is answered from
        the cut prompt (class doc)."""
        m = self.max_prompt_tokens
        if m is not None and len(ids) > m:
            raise PromptTooLong(
                f"a prompt of {len(ids)} tokens, over model.max_prompt_tokens ({m}): refused "
                "rather than answered from a prompt cut to fit"
            )

    async def _sample(
        self,
        ids: list[int],
        sampling: dict[str, Any],
        refuse_over_long: bool = False,
        watch: Watch | None = None,
        chat: Chat | None = None,
    ) -> list[Sample]:
        if refuse_over_long:  # before a key is taken: a refused call changes nothing
            self.check_prompt(ids)
        params, seed = sampling_params(self.defaults, sampling)
        key = self._next_key()  # taken either way: later calls keep their keys
        if seed is not None:
            key = stable_key("seed", seed)
        m = self.max_prompt_tokens
        if m is None or len(ids) <= m:
            streamed: dict[str, Any] = {} if watch is None else {"watch": watch}  # may not stream
            if chat is not None and getattr(self._client, "messages", False):
                streamed["chat"] = chat  # the engines read the messages (an external chat API)
            return await self._client.generate(ids, params, key, **streamed)
        self.truncated_prompts.append(ids[:m])
        return [
            Sample(
                prompt_ids=ids[:m],
                response_ids=ids[m : m + 1],
                logprobs=[0.0],
                finish_reason="prompt_truncated",
                model_version=self.model_version,
                info={"prompt_tokens": len(ids)},
            )
            for _ in range(params.n)
        ]

    async def logprobs(self, tokens: list[int]) -> list[float]:
        return await self._client.logprobs(tokens)

    def auxiliary(self, key: int | str) -> AuxiliaryHandle:
        """Auxiliary model `key` (its position in `explorer.auxiliary_models`, or its `name`):
        chat / generate / OpenAI clients whose calls are not recorded (module
        `explorer/auxiliary.py`). LookupError naming the served models for an unknown key."""
        if self._auxiliary is None:
            raise LookupError(
                f"this workflow asks for auxiliary model {key!r}, but no auxiliary model is "
                "served: set explorer.auxiliary_models"
            )
        models, handles = self._auxiliary
        return handles[models.find(key).index]

    def _client_endpoint(self) -> tuple[str, str]:
        if self._endpoint is None:
            raise RuntimeError(
                "this workflow asks for an OpenAI client: set "
                "explorer.rollout_model.enable_openai_api: true"
            )
        return self._endpoint

    # -- sessions and what they recorded ---------------------------------------------------------

    def session(self) -> TaskModelHandle:
        """A new session on the same model: its own ledger and conversation state, its own
        sampling keys (derived from this handle's key and the session's number, so they do not
        depend on how concurrent sessions interleave), episode numbers shared with this handle;
        its own OpenAI clients when this handle was made with `publish` (one agent per
        episode)."""
        i = len(self._sessions) + 1
        child = TaskModelHandle(
            self._client,
            self.tokenizer,
            self.defaults,
            self.chat_template_kwargs,
            key=None if self._key is None else stable_key(self._key, "session", i),
            max_prompt_tokens=self.max_prompt_tokens,
            bridging=self._bridging,
            name=f"{self.ledger.session}.{i}",
            episodes=self._episodes,
            auxiliary=self._auxiliary,  # the try's auxiliary handles: keys go on, not restart
            publish=self._publish,
            reasoning_parser=self.reasoning_parser,
        )
        child.truncated_prompts = self.truncated_prompts  # one list for the explorer to read
        self._sessions.append(child)
        return child

    def bind_reply(self, call_id: str, tool_call_ids: list[str]) -> None:
        """See `ChatSession.bind_reply`: tool-call ids a parser gave record `call_id`'s reply."""
        self._chat.bind_reply(call_id, tool_call_ids)

    def note_tool_calls(self, call_id: str, status: str, error: str = "") -> None:
        """See `SessionLedger.note_tool_calls`: a parser's status for record `call_id`'s reply,
        kept for its experience and `explorer.malformed_tool_calls`."""
        self.ledger.note_tool_calls(call_id, status, error)

    def episode_of(self, sample: Sample) -> int:
        """The episode (`EID.run` of its experience) of a sample this session returned."""
        record = self.ledger.records[sample.info["call_id"]]
        return self.ledger.trajectories[record.trajectory].episode

    def extract_experiences(
        self,
        reward: float | Mapping[int, float] | None = None,
        **kwargs: Any,
    ) -> list[Experience]:
        """This session's trajectories as MULTI_TURN experiences
        (`SessionLedger.extract_experiences`; sessions opened with `session()` extract their
        own)."""
        return self.ledger.extract_experiences(reward, **kwargs)

    def ledger_stats(self) -> LedgerStats:
        """The ledger counts of this handle and every session opened from it."""
        stats = self.ledger.stats
        for child in self._sessions:
            stats = stats.merged(child.ledger_stats())
        return stats


def mask_prompt_truncated(experiences: list[Experience], prompts: list[list[int]]) -> int:
    """Zero the action mask of every experience whose tokens begin with one of the cut `prompts`
    (`TaskModelHandle.truncated_prompts`): one built on a truncated prompt, single-turn or a
    multi-turn trajectory whose later prompt was cut (it extends the same tokens). They are
    trained on nothing and marked `info["prompt_truncated"]`. Returns how many were masked."""
    masked = 0
    for e in experiences:
        tokens = e.tokens.tolist()
        if any(tokens[: len(p)] == p for p in prompts):
            assert e.action_mask is not None  # filled by Experience.__post_init__
            e.action_mask = torch.zeros_like(e.action_mask)
            e.info["prompt_truncated"] = True
            masked += 1
    return masked
