"""What the rollout model's and the auxiliary models' handles share: text to ids and back, and
OpenAI clients bound to the handle's session on its endpoint.

    client = handle.openai_client()          # blocking: a SyncWorkflow's thread
    client = handle.async_openai_client()    # async def run

A handle says where its clients go (`_client_endpoint`: the base URL and the model name, or an
error naming the key that serves it). The blocking client refuses a call from a thread that runs
an event loop: made from `async def run`, it would hold the loop that serves it (the explorer's)
until its timeout, so it raises at once, naming the async client.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any


class ModelCalls:
    """Mixin: `decode`, `encode`, `openai_client`, `async_openai_client` over `self.tokenizer`
    and `_client_endpoint()`."""

    tokenizer: Any

    def _client_endpoint(self) -> tuple[str, str]:
        """(base URL ending in /v1, model name) of this handle's session; RuntimeError naming
        what to set where it has none."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def openai_client(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client whose calls sample in this handle's session (a blocking
        client: for `SyncWorkflow`s, which run in a thread). Its `model_path` attribute is the
        model name to pass (as in Trinity-RFT). A call made on a thread that runs an event loop
        (an `async def run`) raises at once, naming `async_openai_client` (module doc)."""
        return self._bound(_blocking_client_class(), kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client for this handle's session (for `async def run`)."""
        import openai

        return self._bound(openai.AsyncOpenAI, kwargs)

    def _bound(self, cls: Any, kwargs: dict[str, Any]) -> Any:
        url, name = self._client_endpoint()
        client = cls(**{"base_url": url, "api_key": "-", "max_retries": 0, **kwargs})
        client.model_path = name
        return client


@functools.cache
def _blocking_client_class() -> type:
    """`openai.OpenAI`, refusing a call from a thread that runs an event loop (`openai_client`)."""
    import openai

    class BlockingOpenAI(openai.OpenAI):
        def request(self, *args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # a thread without a loop (a SyncWorkflow's): as openai does
                return super().request(*args, **kwargs)
            raise RuntimeError(
                "model.openai_client() is a blocking client, called here from a coroutine "
                "(async def run): the call would hold the event loop that serves it until the "
                "client's timeout. Use model.async_openai_client() and await its calls (or "
                "call the blocking client from a thread: asyncio.to_thread)"
            )

    return BlockingOpenAI
