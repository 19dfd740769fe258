"""Where an external model is served and how its answers read (`model.external_model`).

    endpoint = endpoint_of(cfg.model.external_model)   # the URL and key, from the config or env
    served = probe(endpoint)                           # GET /v1/models: reachable, key taken

Every failure to reach the endpoint becomes an `EndpointError` whose message names the URL and
what went wrong: unreachable (connection refused, DNS, a timeout), 401 (the key, and where it was
read from, never the key itself), another status with the server's message, or an answer that is
not an OpenAI completion. The `openai` client does the HTTP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trinity.common.rollout import Sample

NO_KEY = "EMPTY"
"""The key sent when none is configured (as Trinity-RFT sends): a server without keys takes any."""


class EndpointError(RuntimeError):
    """The external model's endpoint could not be used; the message says which and why."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint: `base_url` ends where `/completions` is appended (…/v1)."""

    base_url: str
    model_name: str
    api_key: str = field(default=NO_KEY, repr=False)
    key_from: str = "no key configured"  # where the key was read, for error messages
    timeout: float = 600.0


def endpoint_of(ext: Any) -> Endpoint:
    """The endpoint `model.external_model` names: `base_url` / `api_key` when set, else the
    environment variables `base_url_env` / `api_key_env` (a missing key is `NO_KEY`)."""
    url, url_from = ext.base_url, "model.external_model.base_url"
    if not url:
        url, url_from = os.environ.get(ext.base_url_env, ""), f"${ext.base_url_env}"
    if not url.strip():
        raise EndpointError(
            f"model.external_model: no endpoint URL: set the environment variable "
            f"{ext.base_url_env} (model.external_model.base_url_env) or base_url, e.g. "
            "http://127.0.0.1:8010/v1"
        )
    if not url.startswith(("http://", "https://")):
        raise EndpointError(
            f"model.external_model: the endpoint URL from {url_from} is {url!r}: it must start "
            "with http:// or https://"
        )
    key, key_from = ext.api_key, "model.external_model.api_key"
    if not key and os.environ.get(ext.api_key_env):
        key, key_from = os.environ[ext.api_key_env], f"${ext.api_key_env}"
    if not key:
        key, key_from = NO_KEY, f"no key (${ext.api_key_env} is unset)"
    return Endpoint(url.rstrip("/"), ext.model_name or "", key, key_from, ext.request_timeout)


def endpoint_env(model: Any) -> dict[str, str]:
    """The environment variables `model.external_model` reads that this process has, for the
    processes of a joined Ray cluster (which never see this one's environment)."""
    ext = model.external_model
    if not ext.enable:
        return {}
    names = (ext.base_url_env, ext.api_key_env)
    return {name: os.environ[name] for name in names if name and name in os.environ}


def client(ep: Endpoint, max_retries: int = 2) -> Any:
    """The `openai` client of `ep` (it retries a failed connection `max_retries` times)."""
    import openai

    return openai.OpenAI(
        base_url=ep.base_url, api_key=ep.api_key, timeout=ep.timeout, max_retries=max_retries
    )


def explain(ep: Endpoint, e: Exception) -> EndpointError:
    """`e`, raised by the `openai` client calling `ep`, as an `EndpointError` naming the cause."""
    import openai

    if isinstance(e, openai.APITimeoutError):
        return EndpointError(f"the endpoint {ep.base_url} did not answer within {ep.timeout:g} s")
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e
        return EndpointError(f"cannot reach the endpoint {ep.base_url}: {cause}")
    if isinstance(e, openai.AuthenticationError):
        return EndpointError(
            f"the endpoint {ep.base_url} refused the API key (401 Unauthorized; key from "
            f"{ep.key_from}): {_message(e)}"
        )
    if isinstance(e, openai.PermissionDeniedError):
        return EndpointError(
            f"the endpoint {ep.base_url} denied access (403 Forbidden; key from {ep.key_from}): "
            f"{_message(e)}"
        )
    if isinstance(e, openai.APIStatusError):
        return EndpointError(
            f"the endpoint {ep.base_url} answered {e.status_code} for model "
            f"{ep.model_name!r}: {_message(e)}"
        )
    if isinstance(e, openai.APIResponseValidationError | ValueError | TypeError | KeyError):
        return EndpointError(f"malformed answer from the endpoint {ep.base_url}: {e}")
    return EndpointError(f"the endpoint {ep.base_url} failed: {type(e).__name__}: {e}")


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(e, "message", e))


def probe(ep: Endpoint, max_retries: int = 0) -> list[str]:
    """The model names `ep` serves (GET /models); raises `EndpointError` when it cannot be
    reached, refuses the key, answers something else, or does not serve `ep.model_name`."""
    try:
        page = client(ep, max_retries).models.list()
        names = [m.id for m in page.data]
    except Exception as e:  # every failure is re-raised, explained
        raise explain(ep, e) from e
    if ep.model_name not in names:
        raise EndpointError(
            f"the endpoint {ep.base_url} does not serve model {ep.model_name!r} "
            f"(model.external_model.model_name); it serves {sorted(names)}"
        )
    return names


def completion_request(
    ep: Endpoint, prompt: list[int], n: int, temperature: float, top_p: float, top_k: int,
    max_tokens: int, stop: tuple[str, ...], seed: int | None,
) -> dict[str, Any]:  # fmt: skip
    """The keyword arguments of `client.completions.create` for one token-id prompt: the
    sampled tokens' logprobs asked for (`logprobs: 0`); top_k (not OpenAI's) only when set."""
    args: dict[str, Any] = {
        "model": ep.model_name,
        "prompt": list(prompt),
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "logprobs": 0,
    }
    if stop:
        args["stop"] = list(stop)
    if seed is not None:
        args["seed"] = seed
    if top_k > 0:
        args["extra_body"] = {"top_k": top_k}
    return args


def chat_request(
    ep: Endpoint, chat: tuple[list[dict[str, Any]], list[dict[str, Any]] | None], n: int,
    temperature: float, top_p: float, top_k: int, max_tokens: int, stop: tuple[str, ...],
    seed: int | None, logprobs: bool,
) -> dict[str, Any]:  # fmt: skip
    """The keyword arguments of `client.chat.completions.create` for one chat call's (messages,
    tools); the sampled tokens' logprobs asked for when `logprobs`; top_k only when set."""
    messages, tools = chat
    args: dict[str, Any] = {
        "model": ep.model_name,
        "messages": messages,
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "max_completion_tokens": max_tokens,
    }
    if logprobs:
        args["logprobs"] = True
    if tools:
        args["tools"] = tools
    if stop:
        args["stop"] = list(stop)
    if seed is not None:
        args["seed"] = seed
    if top_k > 0:
        args["extra_body"] = {"top_k": top_k}
    return args


def _choices(answer: Any, n: int) -> list[Any]:
    choices = getattr(answer, "choices", None)
    if not isinstance(choices, list) or len(choices) != n:
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise ValueError(f"expected {n} choices, got {got}")
    return sorted(choices, key=lambda c: c.index or 0)


def _aligned(lps: Any, ids: list[int], info: dict[str, Any]) -> list[float]:
    """`lps` where they are one per id, else zeros with `info["logprobs"] = "absent"`."""
    if isinstance(lps, list) and len(lps) == len(ids) and None not in lps:
        return [float(x) for x in lps]
    info["logprobs"] = "absent"
    return [0.0] * len(ids)


def chat_samples_of(
    answer: Any, prompt: list[int], n: int, encode: Any, version: int = 0
) -> list[Sample]:
    """The `n` samples of a chat completion `answer` for our rendering `prompt` of its messages:
    each reply's content encoded with our tokenizer (`encode`; a chat API sends no token ids),
    the server's per-token logprobs where they align with those ids, else zeros (as
    `samples_of`). Tool calls the server parsed out of a reply are in `info["tool_calls"]`,
    not in its ids. Raises `ValueError` for an answer that is not `n` chat choices."""
    samples = []
    for c in _choices(answer, n):
        message = getattr(c, "message", None)
        text = getattr(message, "content", None)
        calls = getattr(message, "tool_calls", None)
        if message is None or not (isinstance(text, str) or calls):
            raise ValueError(f"choice {c.index} has no message content")
        ids = list(encode(text or ""))
        info: dict[str, Any] = {"token_ids": "tokenizer"}
        if calls:
            info["tool_calls"] = [call.model_dump() for call in calls]
        entries = getattr(getattr(c, "logprobs", None), "content", None)
        lps = [e.logprob for e in entries] if isinstance(entries, list) else None
        logprobs = _aligned(lps, ids, info)
        finish = "length" if c.finish_reason == "length" else "stop"
        samples.append(Sample(list(prompt), ids, logprobs, finish, version, info))
    return samples


def samples_of(
    answer: Any, prompt: list[int], n: int, encode: Any, version: int = 0
) -> list[Sample]:
    """The `n` samples of a completion `answer` (the openai client's object) for `prompt`.

    Response ids: the choice's `token_ids` where the server sends them (vLLM does when asked),
    else the reply's text encoded with our tokenizer (`encode`). Logprobs: the server's
    `token_logprobs` where they align with those ids one to one, else zeros, and
    `info["logprobs"] = "absent"` says so. finish_reason "length" stays, anything else is "stop".
    Raises `ValueError` for an answer that is not `n` completion choices.
    """
    samples = []
    for c in _choices(answer, n):
        text = c.text
        if not isinstance(text, str):
            raise ValueError(f"choice {c.index} has no text")
        extra = getattr(c, "model_extra", None) or {}
        ids = extra.get("token_ids")
        from_server = isinstance(ids, list) and all(isinstance(t, int) for t in ids)
        ids = list(ids) if from_server else list(encode(text))
        lps = getattr(getattr(c, "logprobs", None), "token_logprobs", None)
        info: dict[str, Any] = {"token_ids": "endpoint" if from_server else "tokenizer"}
        logprobs = _aligned(lps, ids, info)
        stop = extra.get("stop_reason")
        if isinstance(stop, str):
            info["stop"] = stop
        finish = "length" if c.finish_reason == "length" else "stop"
        samples.append(Sample(list(prompt), ids, logprobs, finish, version, info))
    return samples
