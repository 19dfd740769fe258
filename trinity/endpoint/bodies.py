"""The OpenAI response bodies the endpoint answers with, built from a call's samples."""

from __future__ import annotations

import time
import uuid
from typing import Any

from trinity.common.reasoning import ReasoningParser
from trinity.common.rollout import Sample
from trinity.endpoint.tool_calls import ParsedCalls
from trinity.explorer.model_client import TaskModelHandle


class Choice:
    """One choice of a chat answer: its sample, message and finish reason."""

    def __init__(self, index: int, sample: Sample, message: dict[str, Any], finish: str) -> None:
        self.index, self.sample, self.message, self.finish_reason = index, sample, message, finish


def reply_text(s: Sample, handle: TaskModelHandle) -> str:
    """The reply's text, ending before the stop string that ended it (as OpenAI returns it)."""
    text = handle.decode(s.response_ids)
    stop = s.info.get("stop")
    return text[: text.find(stop)] if stop and stop in text else text


def finish_of(s: Sample) -> str:
    return "length" if s.finish_reason == "length" else "stop"


def chat_choice(
    i: int, s: Sample, handle: TaskModelHandle, parse: Any, reason: ReasoningParser | None = None
) -> Choice:
    """Choice `i`: with `reason` (a reasoning parser), the reply's reasoning goes to the
    message's `reasoning_content` and the tool-call parser `parse` reads the answer alone, as
    in vLLM; the sampled tokens are unchanged either way."""
    text = reply_text(s, handle)
    reasoning = None
    if reason is not None:
        split = reason(text)
        reasoning, text = split.reasoning, split.content or ""
    parsed: ParsedCalls = parse(text) if parse else ParsedCalls("none", text)
    if parse is not None:
        s.info["tool_call_status"] = parsed.status
        if parsed.error:
            s.info["tool_call_error"] = parsed.error
        if "call_id" in s.info:  # the ledger keeps it for the experience
            handle.note_tool_calls(s.info["call_id"], parsed.status, parsed.error or "")
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if reason is not None:
        message["reasoning_content"] = reasoning
        if not parsed.content:  # all reasoning: no answer (vLLM's None)
            message["content"] = None
    finish = finish_of(s)
    if parsed.status == "ok":
        message["tool_calls"] = [c.to_openai() for c in parsed.calls]
        finish = "tool_calls"
        if "call_id" in s.info:  # the ledger's record: its reply comes back as these calls
            handle.bind_reply(s.info["call_id"], [c.id for c in parsed.calls])
    return Choice(i, s, message, finish)


def head(prefix: str, obj: str, model: str, version: int) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"trinity-v{version}",
        "model_version": version,
    }


def usage(prompt_tokens: int, samples: list[Sample]) -> dict[str, int]:
    completion = sum(len(s.response_ids) for s in samples)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def token_entry(token_id: int, logprob: float, handle: TaskModelHandle) -> dict[str, Any]:
    token = handle.decode([token_id])
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode("utf-8")),
        "top_logprobs": [],
    }


def chat_logprobs(ids: list[int], lps: list[float], handle: TaskModelHandle) -> dict[str, Any]:
    """A chat choice's `logprobs` for tokens `ids` sampled with logprobs `lps`."""
    return {"content": [token_entry(t, lp, handle) for t, lp in zip(ids, lps, strict=True)]}


def completion_logprobs(
    ids: list[int], lps: list[float], handle: TaskModelHandle
) -> dict[str, Any]:
    """A completion choice's `logprobs` for tokens `ids` sampled with logprobs `lps`."""
    return {"tokens": [handle.decode([t]) for t in ids], "token_logprobs": list(lps)}
