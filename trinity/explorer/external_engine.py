"""Rollout engine over an OpenAI-compatible endpoint (engine_type `external`): mode bench of a
model served elsewhere, through the `openai` client.

    mode: bench
    model: {model_path: <the served model's tokenizer>, external_model: {enable: true,
            model_name: policy, base_url_env: OPENAI_BASE_URL, api_key_env: OPENAI_API_KEY}}

The `RolloutEngine` contract is token-in, token-out, so workflows, evaluation and bench run
unchanged: every prompt is rendered by our tokenizer's chat template as for a local engine.
`external_model.api` says what the endpoint is sent, one request per prompt (per 16 samples of
it) with `n`, `temperature`, `top_p`, max tokens, `stop`, the prompt's sampling key as `seed`,
and the sampled tokens' logprobs asked for:

- `chat` (default, as Trinity-RFT): `POST {base_url}/chat/completions` with the messages and
  tools of the chat call the prompt was rendered from (`takes_messages`: the request batcher
  passes them beside the ids, `chats`); the server renders them with its own template. A prompt
  that came from token ids (`model.generate`) has no messages and gets a `BadPrompt`. A server
  that refuses `logprobs` is asked again without.
- `completions`: `POST {base_url}/completions` with the prompt as token ids: exactly the prompt
  a local engine would sample from (trinity serve, vLLM, SGLang take them).

What comes back is read by `external_endpoint.samples_of` / `chat_samples_of`: the reply's text,
encoded with our tokenizer unless the server sends its token ids. So `model.model_path` must hold
the served model's tokenizer.

There are no weights: `update_weights` and `logprobs` (scoring) raise, `sleep`/`wake_up` move
nothing. A prompt with no room under `max_model_len` gets a `PromptTooLong` in its place, a
prompt the server refuses with a 400 naming the prompt (or the messages) a `BadPrompt`; any
other failure (the endpoint unreachable, a 401, a malformed answer) raises an `EndpointError`
naming the URL and the cause, and the tasks of that call fail (counted as wrong,
`explorer/evaluation.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trinity.common.rollout import (
    ENGINE,
    BadPrompt,
    Peers,
    Progress,
    PromptTooLong,
    Sample,
    SamplingParams,
)
from trinity.common.startup import StartupMarks
from trinity.explorer.external_endpoint import (
    Endpoint,
    EndpointError,
    chat_request,
    chat_samples_of,
    client,
    completion_request,
    endpoint_of,
    explain,
    samples_of,
)

Chat = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]  # a chat call's (messages, tools)
MAX_IN_FLIGHT = 32
"""Requests one engine has open at once (each is one prompt's `n` samples)."""
MAX_N = 16
"""Samples asked for in one request (trinity serve's limit of `n`); more are several requests, the
k-th with seed key + 16k."""
SEED_MASK = 2**63 - 1  # a sampling key as an OpenAI `seed` (a signed 64-bit integer)


@ENGINE.register("external")
class ExternalEngine:
    """The endpoint of `model.external_model` behind the `RolloutEngine` contract. Thread-safe."""

    @staticmethod
    def run_kwargs(cfg: Any) -> dict[str, Any]:
        """What the engine takes from the run's config besides the contract's arguments."""
        return {"external_model": cfg.model.external_model}

    @staticmethod
    def takes_messages(cfg: Any) -> bool:
        """The chat API samples from a chat call's messages (`common.rollout.takes_messages`)."""
        return cfg.model.external_model.api == "chat"

    def __init__(
        self,
        model_path: str,
        *,
        external_model: Any,
        seed: int = 42,
        max_model_len: int | None = None,
        custom_chat_template: str | None = None,
        **local_engine_args: Any,
    ) -> None:
        """`external_model`: the `model.external_model` section; `model_path`: the tokenizer of
        the served model. `local_engine_args` (dtype, threads, batch size, idle trims) are a
        local engine's and mean nothing here."""
        from trinity.models import load_tokenizer, resolve_model_path

        del seed, local_engine_args  # the endpoint samples; keys go as request seeds
        self.startup = StartupMarks("engine")
        self.endpoint: Endpoint = endpoint_of(external_model)
        self.tokenizer = load_tokenizer(
            resolve_model_path(model_path), custom_chat_template=custom_chat_template
        )
        self.client = client(self.endpoint)
        self.api = external_model.api
        self.chat_logprobs = True  # asked for until the server refuses the parameter
        self.max_model_len = max_model_len
        self.model_version = 0
        self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="external")
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "generated_tokens": 0, "generate_seconds": 0.0}
        self.startup.mark("engine_ready")

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        chats: list[Chat | None] | None = None,
    ) -> list[list[Sample] | BadPrompt]:
        """One request per prompt, `MAX_IN_FLIGHT` at once (the contract's `generate`);
        `chats`: each prompt's (messages, tools), which the chat API samples from."""
        t0 = time.perf_counter()
        keys = keys or [None] * len(prompts)
        chats = chats or [None] * len(prompts)
        answers = list(self._pool.map(self._one, prompts, keys, [params] * len(prompts), chats))
        with self._lock:
            self.stats["requests"] += len(prompts)
            self.stats["generate_seconds"] += time.perf_counter() - t0
            self.stats["generated_tokens"] += sum(
                len(s.response_ids) for a in answers if isinstance(a, list) for s in a
            )
        return answers

    def _one(
        self, prompt: list[int], key: int | None, params: SamplingParams, chat: Chat | None
    ) -> list[Sample] | BadPrompt:
        if not prompt:
            return BadPrompt("empty prompt")
        if self.api == "chat" and chat is None:
            return BadPrompt(
                "the endpoint's chat API (model.external_model.api: chat) samples from "
                "messages, and this call sent token ids (model.generate): use api: completions"
            )
        max_tokens = params.max_tokens
        if self.max_model_len is not None:
            room = self.max_model_len - len(prompt)
            if room <= 0:
                return PromptTooLong(
                    f"prompt of {len(prompt)} tokens leaves no room for a response under "
                    f"max_model_len {self.max_model_len}"
                )
            max_tokens = min(max_tokens, room)
        samples: list[Sample] = []
        for first in range(0, params.n, MAX_N):  # requests of at most MAX_N samples
            n = min(MAX_N, params.n - first)
            seed = None if key is None else (key + first) & SEED_MASK
            got = (
                self._request(prompt, n, max_tokens, params, seed)
                if chat is None
                else self._chat(prompt, chat, n, max_tokens, params, seed)
            )
            if isinstance(got, BadPrompt):
                return got
            samples += got
        return samples

    def _request(
        self, prompt: list[int], n: int, max_tokens: int, params: SamplingParams, seed: int | None
    ) -> list[Sample] | BadPrompt:
        ep = self.endpoint
        args = completion_request(
            ep, prompt, n, params.temperature, params.top_p, params.top_k, max_tokens,
            params.stop, seed,
        )  # fmt: skip
        try:
            answer = self.client.completions.create(**args)
        except Exception as e:  # re-raised explained, or the prompt refused
            if _refuses(e, "prompt"):
                return BadPrompt(f"the endpoint {ep.base_url} refused the prompt: {e}")
            raise explain(ep, e) from e
        try:
            return samples_of(answer, prompt, n, self._encode, self.model_version)
        except (ValueError, TypeError, AttributeError) as e:
            raise EndpointError(f"malformed answer from the endpoint {ep.base_url}: {e}") from e

    def _chat(
        self, prompt: list[int], chat: Chat, n: int, max_tokens: int, params: SamplingParams,
        seed: int | None,
    ) -> list[Sample] | BadPrompt:  # fmt: skip
        ep = self.endpoint
        while True:
            args = chat_request(
                ep, chat, n, params.temperature, params.top_p, params.top_k, max_tokens,
                params.stop, seed, self.chat_logprobs,
            )  # fmt: skip
            try:
                answer = self.client.chat.completions.create(**args)
                break
            except Exception as e:  # re-raised explained; logprobs refused: asked again without
                if self.chat_logprobs and _refuses(e, "logprobs"):
                    self.chat_logprobs = False
                    continue
                if _refuses(e, "messages"):
                    return BadPrompt(f"the endpoint {ep.base_url} refused the messages: {e}")
                raise explain(ep, e) from e
        try:
            return chat_samples_of(answer, prompt, n, self._encode, self.model_version)
        except (ValueError, TypeError, AttributeError) as e:
            raise EndpointError(f"malformed answer from the endpoint {ep.base_url}: {e}") from e

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        watch: list[bool] | None = None,
        chats: list[Chat | None] | None = None,
    ) -> Iterator[Progress | list[list[Sample] | BadPrompt]]:
        """`generate`'s answer as the only item: no `Progress` is heard (the requests are not
        streamed), the samples are the same."""
        del watch
        yield self.generate(prompts, params, keys, chats)

    def logprobs(self, tokens: list[int]) -> list[float]:
        raise NotImplementedError(
            f"an external model ({self.endpoint.base_url}) cannot score given tokens: the "
            "OpenAI API has no call for a sequence's logprobs"
        )

    def update_weights(
        self, method: str, payload: list[Any], version: int, peers: Peers | None = None
    ) -> int:
        raise RuntimeError(
            f"an external model ({self.endpoint.base_url}) has no weights here to load "
            f"(sync method {method}, version {version}); model.external_model is mode bench only"
        )

    def weights_version(self) -> int:
        return self.model_version

    def sleep(self, level: int = 1) -> int:
        return 0  # nothing on this machine's device

    def wake_up(self) -> int:
        return 0

    def get_stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self.stats)

    def startup_marks(self) -> dict[str, float]:
        return dict(self.startup.marks)

    def set_num_threads(self, num_threads: int) -> None:
        """No local compute: nothing to set."""

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _refuses(e: Any, param: str) -> bool:
    """Whether `e` is a 400 whose OpenAI error body names `param` as the bad parameter (a
    prompt over the server's context is refused so: trinity serve and vLLM say `param:
    prompt`, or `messages` for a chat call)."""
    if getattr(e, "status_code", None) != 400:
        return False
    body = getattr(e, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    return isinstance(err, dict) and err.get("param") == param
