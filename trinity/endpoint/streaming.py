"""Server-sent event bodies: replies streamed token by token as the engine samples them.

A streamed call is sampled with a `Heard` as its watch (`BatchingClient.generate`): the engine's
`generate_stream` sends each decode step's tokens and their text (`explorer/detokenize.py`), and
`live_chunks` writes a chunk per choice as its text grows, so the first chunk leaves after the
prefill and the first decode step, and the event loop all sessions share only appends text.

- The deltas of a choice join to exactly its non-streamed content: text that may be the start of
  a stop string is held back until it is known not to be one, nothing from a stop string on is
  sent, and once the call is done the rest of the content (as the non-streamed body has it) goes
  in the last delta.
- With `logprobs`, each chunk carries the tokens heard since the choice's previous chunk, the
  finish chunk the rest: joined, they are the non-streamed logprobs, token for token.
- A call whose replies are parsed for tool calls or reasoning (`reasoning_parser`), or a
  completion of several prompts, is answered when it is done, then streamed from its samples
  (`chat_chunks`, `completion_chunks`): a tool call's arguments are only known whole. A split
  reply streams its `reasoning_content` in one delta, then its content in one (with every
  token's logprobs).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from trinity.common.rollout import Sample
from trinity.endpoint.bodies import Choice, chat_logprobs, completion_logprobs, usage
from trinity.explorer.model_client import TaskModelHandle

DONE = "data: [DONE]\n\n"
DIVERGED = (  # the stream's last event when a resent call sampled other tokens (`Heard`)
    'data: {"error": {"message": "an engine was restarted mid-reply and sampled it again with '
    'other weights: the text sent so far is not the reply; call again", "type": '
    '"server_error", "param": null, "code": "diverged"}}\n\n'
)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class Heard:
    """What the engine has sampled so far for one call's `n` samples: the `Watch` the call is
    made with. `first` resolves with the first token."""

    def __init__(self, n: int) -> None:
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.text = [""] * n
        self.version: int | None = None
        self.diverged = False  # a resent call sampled other tokens than those already sent
        self.first: asyncio.Future = asyncio.get_running_loop().create_future()
        self._news = asyncio.Event()

    def __call__(self, version: int, tokens: list[tuple[int, int, int, float, str]]) -> None:
        for j, position, token, logprob, text in tokens:
            if position < len(self.ids[j]):  # sent again after an engine crash: heard already
                # (the same token, its key being the same, unless the weights changed between)
                self.diverged |= self.ids[j][position] != token
                continue
            self.ids[j].append(token)
            self.logprobs[j].append(logprob)
            self.text[j] += text
        if self.version is None:
            self.version = version
        if not self.first.done():
            self.first.set_result(None)
        self._news.set()

    async def news(self, work: asyncio.Future) -> None:
        """Return once more tokens were heard since the last return, or `work` is done."""
        waiter = asyncio.ensure_future(self._news.wait())
        try:
            await asyncio.wait({waiter, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self._news.clear()


def releasable(text: str, stops: tuple[str, ...]) -> str:
    """The part of a reply's text so far that may be sent: up to the first stop string in it,
    else all but its longest end that is the start of a stop string."""
    found = [text.find(s) for s in stops if s in text]
    if found:
        return text[: min(found)]
    held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[: len(text) - held]


async def live_chunks(
    kind: str,
    head: dict[str, Any],
    heard: Heard,
    work: asyncio.Future,
    handle: TaskModelHandle,
    *,
    stops: tuple[str, ...],
    logprobs: bool,
    include_usage: bool,
    finish: Callable[[list[Sample]], list[tuple[str, str]]],
) -> AsyncIterator[str]:
    """The SSE body of a call (`kind` "chat" or "completion") streamed as `work` samples it
    (module doc). `finish(samples)`: each choice's (content, finish reason) as the
    non-streamed body gives them; it may raise an `APIError`, sent as the stream's error."""
    chat = kind == "chat"
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    n = len(heard.ids)
    sent, sent_tokens = [""] * n, [0] * n

    def chunk(j: int, text: str, ids: list[int], lps: list[float], end: str | None = None) -> str:
        lp = None
        if logprobs and ids:
            lp = (chat_logprobs if chat else completion_logprobs)(ids, lps, handle)
        if not chat:
            choice = {"index": j, "text": text, "logprobs": lp, "finish_reason": end}
            return sse({**head, "choices": [choice]})
        delta = {"content": text} if text else {}
        choice = {"index": j, "delta": delta, "logprobs": lp, "finish_reason": end}
        return sse({**head, "choices": [choice], **({"usage": None} if include_usage else {})})

    if chat:
        for j in range(n):
            yield sse({**head, "choices": [_role(j)], **({"usage": None} if include_usage else {})})
    while True:
        over = work.done()
        if heard.diverged:  # before any of the other sampling's text is sent
            yield DIVERGED
            return
        for j in range(n):
            text = releasable(heard.text[j], stops)
            if len(text) > len(sent[j]):
                lo, hi = sent_tokens[j], len(heard.ids[j])
                yield chunk(j, text[len(sent[j]) :], heard.ids[j][lo:hi], heard.logprobs[j][lo:hi])
                sent[j], sent_tokens[j] = text, hi
        if over:
            break
        await heard.news(work)
    try:
        samples = work.result()
        ends = finish(samples)
    except Exception as e:  # after the first chunk, a failure is the stream's last event
        yield sse({"error": _error_body(e)})
        return
    if heard.diverged or any(not c.startswith(sent[j]) for j, (c, _) in enumerate(ends)):
        yield DIVERGED
        return
    for j, (s, (content, reason)) in enumerate(zip(samples, ends, strict=True)):
        ids, lps = s.response_ids[sent_tokens[j] :], s.logprobs[sent_tokens[j] :]
        rest = content[len(sent[j]) :]
        if rest:
            yield chunk(j, rest, ids, lps)
            ids, lps = [], []
        yield chunk(j, "", ids, lps, reason)
    if include_usage:
        yield sse({**head, "choices": [], "usage": _usage_of(samples)})
    yield DONE


def _role(j: int) -> dict[str, Any]:
    return {
        "index": j,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }


def _usage_of(samples: list[Sample]) -> dict[str, int]:
    return usage(len(samples[0].prompt_ids), samples)


def _error_body(e: Exception) -> dict[str, Any]:
    body = getattr(e, "body", None)
    if callable(body):  # an APIError: its own OpenAI error body
        return body()["error"]
    return {"message": f"the engines failed: {e}", "type": "server_error", "code": None}


def pieces(s: Sample, content: str, handle: TaskModelHandle) -> list[tuple[str, int, int]]:
    """`content` cut where its tokens end: (text, first token, end token) per piece, so a
    stream's deltas join to exactly the non-streamed content and carry their tokens' logprobs."""
    out, sent, last = [], 0, 0
    for k in range(1, len(s.response_ids) + 1):
        prefix = handle.decode(s.response_ids[:k])
        if prefix.endswith("\ufffd"):  # a character cut between tokens: wait for its end
            continue
        end = min(len(prefix), len(content))
        if content.startswith(prefix[:end]) and end > sent:
            out.append((content[sent:end], last, k))
            sent, last = end, k
    if sent < len(content):
        out.append((content[sent:], last, len(s.response_ids)))
    return out


async def chat_chunks(
    head: dict[str, Any],
    choices: list[Choice],
    samples: list[Sample],
    handle: TaskModelHandle,
    logprobs: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE body of a chat call answered whole (tool calls: module doc)."""
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return sse({**head, "choices": [choice], **({"usage": None} if include_usage else {})})

    def lp_of(s: Sample, lo: int = 0, hi: int | None = None) -> Any:
        return chat_logprobs(s.response_ids[lo:hi], s.logprobs[lo:hi], handle) if logprobs else None

    for c in choices:
        yield chunk(c.index, {"role": "assistant", "content": ""})
        content = c.message["content"] or ""
        reasoning = c.message.get("reasoning_content")
        if reasoning is not None:  # split from the reply: the reasoning, then the rest whole
            yield chunk(c.index, {"reasoning_content": reasoning})
        if "tool_calls" in c.message:
            if content:
                yield chunk(c.index, {"content": content})
            calls = [{"index": j, **call} for j, call in enumerate(c.message["tool_calls"])]
            yield chunk(c.index, {"tool_calls": calls}, lp=lp_of(c.sample))
        elif "reasoning_content" in c.message:
            if content or logprobs:
                yield chunk(c.index, {"content": content}, lp=lp_of(c.sample))
        else:
            for text, lo, hi in pieces(c.sample, content, handle):
                yield chunk(c.index, {"content": text}, lp=lp_of(c.sample, lo, hi))
        yield chunk(c.index, {}, c.finish_reason)
    if include_usage:
        yield sse({**head, "choices": [], "usage": _usage_of(samples)})
    yield DONE


async def completion_chunks(
    head: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, int], include_usage: bool
) -> AsyncIterator[str]:
    """The SSE body of a completion of several prompts, answered whole (module doc)."""
    for c in choices:
        yield sse({**head, "choices": [{**c, "finish_reason": None}]})
        yield sse({**head, "choices": [{**c, "text": "", "logprobs": None}]})
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage})
    yield DONE
