"""The model handle workflows talk to, and the request batcher behind it.

Workflows run concurrently as asyncio tasks and each asks for its own samples. `BatchingClient`
collects every request made in the same turn of the event loop and sends them to the engines as
one batched `generate` per distinct set of sampling params, split evenly across `engine_num`
engines. So 16 tasks × 8 samples become one 128-sequence batch, not 16 small ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from trinity.common.rollout import Peers, Sample, SamplingParams


class BatchingClient:
    def __init__(self, engines: list[Any]) -> None:
        if not engines:
            raise ValueError("no rollout engines")
        self.engines = engines  # Ray actor handles of HFRolloutEngine
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._flush_task: asyncio.Task | None = None
        self.model_version = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Sample]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, params, fut))
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        # let every runnable workflow reach its generate call before batching
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        pending, self._pending = self._pending, []
        groups: dict[SamplingParams, list[tuple[list[int], asyncio.Future]]] = {}
        for prompt, params, fut in pending:
            groups.setdefault(params, []).append((prompt, fut))
        await asyncio.gather(*(self._run_group(p, g) for p, g in groups.items()))

    async def _run_group(
        self, params: SamplingParams, group: list[tuple[list[int], asyncio.Future]]
    ) -> None:
        k = len(self.engines)
        shards = [group[i::k] for i in range(k)]
        calls = [
            (shard, engine.generate.remote([p for p, _ in shard], params))
            for shard, engine in zip(shards, self.engines, strict=True)
            if shard
        ]
        for shard, ref in calls:
            try:
                results = await ref
            except BaseException as e:  # hand the failure to every waiting workflow
                for _, fut in shard:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), samples in zip(shard, results, strict=True):
                if not fut.done():
                    fut.set_result(samples)

    async def logprobs(self, tokens: list[int]) -> list[float]:
        return await self.engines[0].logprobs.remote(tokens)

    async def update_weights(self, method: str, payload: list[Any], version: int) -> None:
        """Every engine loads the weights `payload` stands for (sync method `method`)."""
        n, call = len(self.engines), uuid.uuid4().hex
        calls = (
            e.update_weights.remote(method, payload, version, Peers(i, n, call))
            for i, e in enumerate(self.engines)
        )
        await asyncio.gather(*calls)
        self.model_version = version


class TaskModelHandle:
    """What one workflow run sees: the model with this task's default sampling params."""

    def __init__(
        self,
        client: BatchingClient,
        tokenizer: Any,
        defaults: SamplingParams,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._client = client
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    @property
    def model_version(self) -> int:
        return self._client.model_version

    def _params(self, overrides: dict[str, Any]) -> SamplingParams:
        known = {f.name for f in dataclasses.fields(SamplingParams)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown sampling args {sorted(unknown)}; valid: {sorted(known)}")
        return dataclasses.replace(self.defaults, **overrides)

    async def chat(self, messages: list[dict[str, str]], **sampling: Any) -> list[Sample]:
        ids = self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **self.chat_template_kwargs,
        )
        return await self._client.generate(list(ids), self._params(sampling))

    async def generate(self, prompt: str | list[int], **sampling: Any) -> list[Sample]:
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return await self._client.generate(ids, self._params(sampling))

    async def logprobs(self, tokens: list[int]) -> list[float]:
        return await self._client.logprobs(tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
