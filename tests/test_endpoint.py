"""The OpenAI-compatible endpoint, driven by the real `openai` client over real HTTP (uvicorn).

Two engines stand behind it: the tiny transformers engine (real sampling, logprobs, seeds) and a
scripted one that replies with text chosen by the test (tool calls, stop strings), each behind a
Ray-handle-shaped facade so no Ray is needed. The server runs on an event loop of its own thread,
as it runs on the explorer's loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import types
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.stop_reference import cut_at_stop
from trinity.common.rollout import Progress, Sample, SamplingParams
from trinity.endpoint.app import build_app
from trinity.endpoint.feedback import FeedbackBook
from trinity.endpoint.server import EndpointServer, EngineSessions, WorkflowSessions
from trinity.explorer.detokenize import TextStream
from trinity.explorer.engine import HFRolloutEngine
from trinity.explorer.in_process import InProcess, InThread
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.models import load_tokenizer


class ScriptedEngine:
    """Replies with `self.reply` (tokenised), logprob -0.5 per token, weights version 3."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reply = "hello"
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []

    def generate(self, prompts, params, keys=None):
        self.prompts += prompts
        self.params.append(params)
        ids = self.tokenizer.encode(self.reply, add_special_tokens=False)[: params.max_tokens]
        finish = "length" if len(ids) == params.max_tokens else "stop"
        sample = cut_at_stop(
            Sample([], list(ids), [-0.5] * len(ids), finish, 3), params.stop, self.decode
        )
        return [
            [
                dataclasses.replace(sample, prompt_ids=list(p), info=dict(sample.info))
                for _ in range(params.n)
            ]
            for p in prompts
        ]

    def generate_stream(self, prompts, params, keys=None, watch=None):
        out = self.generate(prompts, params, keys)
        texts = {i: [TextStream(self.tokenizer) for _ in g] for i, g in enumerate(out)}
        for t in range(max(len(s.response_ids) for g in out for s in g)):
            yield Progress(
                3,
                [
                    (i, j, t, s.response_ids[t], s.logprobs[t], texts[i][j].step(s.response_ids[t]))
                    for i, g in enumerate(out)
                    if watch and watch[i]
                    for j, s in enumerate(g)
                    if t < len(s.response_ids)
                ],
            )
        yield out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def weights_version(self) -> int:
        return 3


class Served:
    """An endpoint on a loop of its own thread."""

    def __init__(
        self, engine: Any, tokenizer: Any, defaults: SamplingParams | None = None,
        max_prompt_tokens: int | None = None, in_thread: bool = False, **app_args: Any,
    ) -> None:  # fmt: skip
        """`in_thread`: the engine computes on a thread of its own (as in the explorer's
        process), not on the endpoint's event loop."""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        defaults = defaults or SamplingParams(n=1, temperature=1.0, max_tokens=64)

        async def start() -> str:
            client = BatchingClient([InThread(lambda: engine) if in_thread else InProcess(engine)])
            self.book = app_args.get("book")
            self.sessions = EngineSessions(
                client, tokenizer, defaults, "policy", max_prompt_tokens=max_prompt_tokens
            )
            self.server = EndpointServer(build_app(self.sessions, **app_args))
            return await self.server.start()

        self.url = self.run(start())

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


def on_a_loop_thread(main: Any, timeout: float = 120) -> Any:
    """`main()` (a coroutine function) on an event loop of its own thread, as the explorer runs
    its endpoint: a blocking call from this thread (the test's) does not stop that loop."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        return asyncio.run_coroutine_threadsafe(main(), loop).result(timeout=timeout)
    finally:
        loop.call_soon_threadsafe(loop.stop)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tokenizer) -> Iterator[Served]:
    served = Served(HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1), tokenizer)
    yield served
    served.close()


@pytest.fixture(scope="module")
def scripted(tokenizer) -> Iterator[tuple[Served, ScriptedEngine]]:
    engine = ScriptedEngine(tokenizer)
    served = Served(engine, tokenizer, api_key="sk-test", book=FeedbackBook())
    yield served, engine
    served.close()


def client(served: Served, key: str = "-", session: str | None = None) -> openai.OpenAI:
    base = served.url if session is None else served.url.replace("/v1", f"/sessions/{session}/v1")
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0)


USER = [{"role": "user", "content": "1+2="}]


def test_chat_returns_the_sampled_tokens_text_logprobs_and_version(tiny, tokenizer):
    r = client(tiny).chat.completions.create(
        model="policy", messages=USER, max_tokens=8, logprobs=True, seed=7
    )
    # a seed fixes a call's samples: the same call made directly gives the tokens sampled
    [sample] = tiny.run(tiny.sessions.handle("direct").chat(USER, max_tokens=8, seed=7))
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(sample.response_ids, skip_special_tokens=True)
    assert [t.logprob for t in choice.logprobs.content] == sample.logprobs
    assert r.usage.prompt_tokens == len(sample.prompt_ids)
    assert r.usage.completion_tokens == len(sample.response_ids)
    assert r.model_version == 0 and r.system_fingerprint == "trinity-v0"
    assert choice.finish_reason == ("length" if len(sample.response_ids) == 8 else "stop")


def test_every_body_and_chunk_is_valid_for_the_openai_package_s_own_types(scripted):
    """Validated strictly against `openai.types` (the client itself builds its objects without
    checking), plain and streamed, chat (tool calls, logprobs, n) and completions."""
    import httpx
    from openai.types import Completion, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    served, engine = scripted
    engine.reply = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    head = {"Authorization": "Bearer sk-test"}
    chat = {"model": "policy", "messages": USER, "max_tokens": 64, "tools": tools, "n": 2,
            "logprobs": True}  # fmt: skip
    completion = {"model": "policy", "prompt": "1+2=", "max_tokens": 4, "logprobs": 0}
    try:
        with httpx.Client(base_url=served.url, headers=head, timeout=60) as http:
            body = http.post("/chat/completions", json=chat).json()
            got = ChatCompletion.model_validate(body, strict=True)
            assert got.choices[0].message.tool_calls[0].function.name == "add"
            Completion.model_validate(
                http.post("/completions", json=completion).json(), strict=True
            )
            for m in http.get("/models").json()["data"]:
                Model.model_validate(m, strict=True)
            for route, req, kind in (
                ("/chat/completions", {**chat, "stream_options": {"include_usage": True}},
                 ChatCompletionChunk),
                ("/completions", completion, Completion),
            ):  # fmt: skip
                lines = http.post(route, json={**req, "stream": True}).text.splitlines()
                data = [x.removeprefix("data: ") for x in lines if x.startswith("data: ")]
                assert data[-1] == "[DONE]" and len(data) > 2
                for chunk in map(json.loads, data[:-1]):
                    if kind is Completion:  # mid-stream null, as OpenAI sends (not in the type)
                        for c in chunk["choices"]:
                            c["finish_reason"] = c["finish_reason"] or "stop"
                    kind.model_validate(chunk, strict=True)
    finally:
        engine.reply = "hello"


def test_a_seed_fixes_the_reply_and_streaming_returns_exactly_the_same(tiny):
    c = client(tiny)
    args = dict(model="policy", messages=USER, max_tokens=12, seed=11, logprobs=True, n=2)
    a, b = c.chat.completions.create(**args), c.chat.completions.create(**args)
    assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]
    chunks = list(
        c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    for choice in a.choices:
        mine = [
            ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == choice.index
        ]
        text = "".join(d.delta.content or "" for d in mine)
        lps = [t.logprob for d in mine if d.logprobs for t in d.logprobs.content]
        assert text == choice.message.content
        assert lps == [t.logprob for t in choice.logprobs.content]
        assert mine[-1].finish_reason == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == a.usage.completion_tokens
    # another seed, other samples (8 tokens drawn from a random model's ~800-token vocabulary)
    other = c.chat.completions.create(**{**args, "seed": 12})
    assert [x.message.content for x in other.choices] != [x.message.content for x in a.choices]


def test_n_samples_and_the_completions_route(tiny, tokenizer):
    r = client(tiny).chat.completions.create(model="policy", messages=USER, n=3, max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = tokenizer.encode("3+4=", add_special_tokens=False)
    for prompt in ("3+4=", ids):
        r = client(tiny).completions.create(model="policy", prompt=prompt, max_tokens=5, seed=3)
        assert r.usage.prompt_tokens == len(ids)
        assert 1 <= r.usage.completion_tokens <= 5
    # the same prompt as text and as ids, with one seed: the same reply
    t = client(tiny).completions.create(model="policy", prompt="3+4=", max_tokens=5, seed=3)
    i = client(tiny).completions.create(model="policy", prompt=ids, max_tokens=5, seed=3)
    assert t.choices[0].text == i.choices[0].text


def test_tool_calls_are_parsed_and_a_malformed_one_is_returned_as_text(scripted):
    served, engine = scripted
    tools = [
        {
            "type": "function",
            "function": {"name": "add", "parameters": {"type": "object"}},
        }
    ]
    c = client(served, "sk-test", session="tools")
    engine.reply = 'Sure.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    r = c.chat.completions.create(model="policy", messages=USER, tools=tools, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure."
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    # the call goes back as the agent would send it: arguments as a JSON string
    follow = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    engine.reply = "It is 3."
    r = c.chat.completions.create(model="policy", messages=follow, tools=tools, max_tokens=64)
    assert r.choices[0].message.content == "It is 3." and r.choices[0].finish_reason == "stop"
    # malformed: no JSON inside the tags; the text comes back, nothing is dropped
    engine.reply = "<tool_call>{add(1, 2)}</tool_call>"
    r = c.chat.completions.create(model="policy", messages=USER, tools=tools, max_tokens=64)
    assert r.choices[0].message.content == engine.reply and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    # the ledger keeps every parse for training: the first conversation (a call, then its
    # answer) is one trajectory with statuses ok, none; the malformed reply opened a second
    handle = served.sessions.pop("tools")
    stats = handle.ledger_stats()
    assert (stats.tool_calls_ok, stats.tool_calls_malformed) == (1, 1)
    first, second = handle.extract_experiences(reward=1.0)
    assert first.info["tool_calls"] == ["ok", "none"] and "tool_call_errors" not in first.info
    assert second.info["tool_calls"] == ["malformed"]
    assert second.info["tool_call_errors"]["0"].startswith("tool call 0: ")  # hermes' JSON error


def test_tool_choice_none_returns_a_call_as_text(scripted):
    """`tool_choice: "none"`: the tools stay in the prompt (so the call continues the
    conversation's tokens, `test_agentscope`), but a reply is not parsed for calls."""
    served, engine = scripted
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    engine.reply = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    r = client(served, "sk-test").chat.completions.create(
        model="policy", messages=USER, tools=tools, tool_choice="none", max_tokens=64
    )
    assert r.choices[0].message.content == engine.reply and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_sampling_fields_left_out_are_the_session_s_defaults(tokenizer):
    """A request without temperature, top_p, top_k or max_tokens samples with the session
    handle's defaults (a workflow's: its task's sampling), one that sets them with its own;
    `n` is the request's (1 when left out), never the defaults' samples per task."""
    engine = ScriptedEngine(tokenizer)
    defaults = SamplingParams(n=8, temperature=0.25, top_p=0.5, top_k=3, max_tokens=32)
    served = Served(engine, tokenizer, defaults)
    try:
        c = client(served)
        r = c.chat.completions.create(model="policy", messages=USER)
        c.chat.completions.create(
            model="policy", messages=USER, temperature=1.0, top_p=1.0, max_tokens=5, n=2
        )
    finally:
        served.close()
    assert len(r.choices) == 1
    first, second = engine.params
    assert (first.n, first.temperature, first.top_p, first.top_k, first.max_tokens) == (
        1, 0.25, 0.5, 3, 32
    )  # fmt: skip
    assert (second.n, second.temperature, second.top_p, second.top_k, second.max_tokens) == (
        2, 1.0, 1.0, 3, 5
    )  # fmt: skip


def test_an_agent_s_tool_conversation_is_one_exact_trajectory(scripted, tokenizer):
    """The agent sends back what the endpoint returned (a parsed tool call, then a reply cut at
    a stop string) plus new turns: the ledger continues one trajectory, sampled tokens trained,
    the tool and user turns rendered as deltas and masked, nothing counted as drift."""
    served, engine = scripted
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    c = client(served, "sk-test", session="agent")
    messages: list[dict] = list(USER)
    replies = [
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        "It is 3. Anything else?",
    ]
    for reply in replies:
        engine.reply = reply
        r = c.chat.completions.create(
            model="policy", messages=messages, tools=tools, stop=["."], max_tokens=64
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "3"})
        else:
            assert msg.content == "It is 3"  # cut before the stop string
            messages.append({"role": "user", "content": "thanks"})
    engine.reply = "Bye"
    c.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=64)
    handle = served.sessions.sessions["agent"]
    stats = handle.ledger_stats()
    assert (stats.calls, stats.segments, stats.drift, stats.bridged) == (3, 1, 0, 2)
    [exp] = handle.extract_experiences(1.0)
    response = exp.response_tokens.tolist()
    mask = exp.action_mask.tolist()
    trained = [t for t, m in zip(response, mask, strict=True) if m]
    sampled = [
        tokenizer.encode(text, add_special_tokens=False) for text in (replies[0], "It is 3.", "Bye")
    ]
    assert trained == [t for ids in sampled for t in ids]  # the sampled tokens, nothing else
    masked = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m])
    assert "3" in masked and "thanks" in masked  # the tool result and the user turn


def test_streamed_and_plain_calls_with_one_seed_record_the_same(tiny):
    c = client(tiny)
    args = dict(model="policy", messages=USER, max_tokens=8, seed=21, logprobs=True)
    c.chat.completions.create(**args, extra_headers={"X-Session-Id": "plain"})
    list(c.chat.completions.create(**args, stream=True, extra_headers={"X-Session-Id": "streamed"}))

    def record(session: str) -> tuple:
        [r] = tiny.sessions.sessions[session].ledger.records.values()
        return r.prompt_ids, r.completion_ids, r.logprobs, r.model_version, r.finish_reason

    assert record("plain") == record("streamed")


def test_a_stop_string_ends_the_reply_and_its_tokens(scripted, tokenizer):
    served, engine = scripted
    engine.reply = "one two. three four"
    r = client(served, "sk-test").chat.completions.create(
        model="policy", messages=USER, stop=["."], max_tokens=64
    )
    assert r.choices[0].message.content == "one two"
    assert r.choices[0].finish_reason == "stop"
    # the tokens kept end with the one that completed the stop string, none after it
    ids = tokenizer.encode(engine.reply, add_special_tokens=False)
    cut = cut_at_stop(Sample([1], ids, [0.0] * len(ids), "length", 0), (".",), tokenizer.decode)
    assert tokenizer.decode(cut.response_ids).endswith(".")
    assert "." not in tokenizer.decode(cut.response_ids[:-1])
    assert r.usage.completion_tokens == len(cut.response_ids)


def test_sessions_by_path_and_header(scripted):
    served, _ = scripted
    client(served, "sk-test", session="by-path").chat.completions.create(
        model="policy", messages=USER
    )
    openai.OpenAI(
        base_url=served.url, api_key="sk-test", default_headers={"X-Session-Id": "by-header"}
    ).chat.completions.create(model="policy", messages=USER)
    assert {"by-path", "by-header"} <= set(served.sessions.sessions)


def test_errors_are_4xx_in_openai_s_format(scripted, tiny):
    served, _ = scripted
    c = client(served, "sk-test")
    with pytest.raises(openai.AuthenticationError):
        client(served, "wrong").chat.completions.create(model="policy", messages=USER)
    with pytest.raises(openai.NotFoundError, match="serves 'policy'"):
        c.chat.completions.create(model="gpt-4o", messages=USER)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: foo"):
        c.chat.completions.create(model="policy", messages=USER, extra_body={"foo": 1})
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        c.chat.completions.create(model="policy", messages=USER, presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.chat.completions.create(model="policy", messages=USER, max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model="policy", messages=USER, temperature=3)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        c.completions.create(model="policy", prompt=[10**7])
    # the tiny template reads message['content']: an assistant turn without content fails it
    bad = [*USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
           "function": {"name": "f", "arguments": "{}"}}]}]  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client(tiny).chat.completions.create(model="policy", messages=bad)
    status, body = post(served.url + "/chat/completions", b"{not json", key="sk-test")
    assert status == 400 and "not JSON" in body["error"]["message"]
    assert post(served.url.removesuffix("/v1") + "/health")[0] == 200
    status, body = post(served.url + "/nothing", b"{}")
    assert status == 404 and body["error"]["code"] == "not_found"


def test_a_prompt_over_the_context_is_a_400(tiny_model_dir, tokenizer):
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1, max_model_len=8)
    served = Served(engine, tokenizer)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            client(served).completions.create(model="policy", prompt="1+2=" * 10)
        assert e.value.code == "context_length_exceeded"
    finally:
        served.close()


def test_a_prompt_over_max_prompt_tokens_is_a_400_on_every_route_and_records_nothing(tokenizer):
    """With `model.max_prompt_tokens` set (prompt truncation on), a workflow's own call is
    answered from the cut prompt and not trained; an OpenAI client gets 400
    context_length_exceeded instead of a fabricated one-token reply, and nothing is sampled or
    recorded for the call."""
    engine = ScriptedEngine(tokenizer)
    served = Served(engine, tokenizer, max_prompt_tokens=6)
    long_text = "1+2=" * 10
    long_ids = tokenizer.encode(long_text, add_special_tokens=False)
    assert len(long_ids) > 6
    c = client(served, session="agent")
    calls = [
        lambda: c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": long_text}]
        ),
        lambda: c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": long_text}], stream=True
        ),
        lambda: c.completions.create(model="policy", prompt=long_text),
        lambda: c.completions.create(model="policy", prompt=long_ids),
        lambda: c.completions.create(model="policy", prompt=["1+2=", long_text]),  # one of two
    ]
    try:
        for call in calls:
            with pytest.raises(openai.BadRequestError) as e:
                got = call()
                list(got)  # a stream is refused before its first chunk
            assert e.value.code == "context_length_exceeded", e.value
            assert "model.max_prompt_tokens (6)" in e.value.message
        assert engine.prompts == []  # nothing sampled, not even the short prompt of the pair
        handle = served.sessions.sessions["agent"]
        assert handle.ledger.records == {} and handle.truncated_prompts == []
        short = c.completions.create(model="policy", prompt="1+2=")  # the session goes on
        assert short.choices[0].text == "hello"
    finally:
        served.close()


def post(url: str, data: bytes | None = None, key: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw.startswith(b"{") else raw


def _raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request("POST", u.path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_a_web_page_cannot_post_to_the_local_endpoint(scripted):
    """A page can send a form-encoded or text/plain POST to 127.0.0.1 without asking (no CORS
    preflight), and reach a loopback endpoint under a name of its own (DNS rebinding): the
    first is a 415, the second a 421, both in OpenAI's error format; a JSON client is served."""
    served, _ = scripted
    url = served.url + "/completions"
    body = json.dumps({"model": "policy", "prompt": "1+2=", "max_tokens": 2}).encode()
    auth = {"Authorization": "Bearer sk-test"}
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, got = _raw(url, body, {**auth, "Content-Type": kind})
        assert status == 415 and got["error"]["code"] == "unsupported_media_type", got
    status, got = _raw(url, body, auth)  # none at all
    assert status == 415 and "missing" in got["error"]["message"]
    port = url.split(":")[2].split("/")[0]
    status, got = _raw(
        url, body, {**auth, "Content-Type": "application/json", "Host": f"evil.example:{port}"}
    )
    assert status == 421 and got["error"]["code"] == "bad_host"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1"):
        status, got = _raw(
            url, body, {**auth, "Content-Type": "application/json; charset=utf-8", "Host": host}
        )
        assert status == 200, (host, got)


class SlowEngine:
    """The scripted engine's answers, `delay` s after each call, without blocking the loop."""

    def __init__(self, tokenizer: Any, delay: float) -> None:
        self.scripted, self.delay, self.calls = ScriptedEngine(tokenizer), delay, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.scripted, name)

        async def later(*args: Any, **kwargs: Any) -> Any:
            if name == "generate":
                self.calls += 1
                await asyncio.sleep(self.delay)
            return method(*args, **kwargs)

        return types.SimpleNamespace(remote=later)


def test_a_client_that_hangs_up_and_retries_is_recorded_once(tokenizer):
    """An agent's client times out and retries (the example agent does): the abandoned call is
    cancelled and recorded nowhere (ledger, session turns), so only the retry is trained."""
    import socket

    engine = SlowEngine(tokenizer, delay=1.0)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start() -> tuple[EngineSessions, FeedbackBook, EndpointServer, str]:
        sessions = EngineSessions(
            BatchingClient([engine]), tokenizer, SamplingParams(max_tokens=4), "policy"
        )
        book = FeedbackBook()
        server = EndpointServer(build_app(sessions, book=book))
        return sessions, book, server, await server.start()

    sessions, book, server, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        body = json.dumps({"model": "policy", "messages": USER}).encode()
        port = int(url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port)) as sock:  # a client that gives up
            sock.sendall(
                b"POST /sessions/ep/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            deadline = time.monotonic() + 10
            while engine.calls == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(1.5)  # the engine's answer to the abandoned call has come and gone
        handle = sessions.sessions["ep"]
        assert engine.calls == 1 and handle.ledger.records == {}
        assert book.sessions.get("ep") is None or book.sessions["ep"].calls == []
        retry = client(types.SimpleNamespace(url=url), session="ep").chat.completions.create(
            model="policy", messages=USER
        )
        assert retry.choices[0].message.content == "hello"
        assert len(handle.ledger.records) == 1 and book.sessions["ep"].calls == [retry.id]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)


def test_calls_past_the_in_flight_limit_are_429s_the_client_retries(tokenizer):
    """A flood of clients waits in their retries, not in the endpoint's memory: past
    `max_in_flight` calls sampling at once, a call is a 429 with Retry-After, and the openai
    client's own retry (as an agent's client does by default) gets it served."""
    engine = SlowEngine(tokenizer, delay=0.5)

    async def main() -> None:
        sessions = EngineSessions(
            BatchingClient([engine]), tokenizer, SamplingParams(max_tokens=4), "policy"
        )
        server = EndpointServer(build_app(sessions, max_in_flight=2))
        url = await server.start()
        try:
            eager = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0)
            calls = [
                eager.completions.create(model="policy", prompt="1+2=", max_tokens=4)
                for _ in range(3)
            ]
            got = await asyncio.gather(*calls, return_exceptions=True)
            refused = [g for g in got if isinstance(g, openai.RateLimitError)]
            assert len(refused) == 1 and sum(not isinstance(g, Exception) for g in got) == 2
            assert refused[0].response.headers["retry-after"] == "1"
            assert refused[0].code == "rate_limit_exceeded"
            patient = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=3)
            calls = [
                patient.completions.create(model="policy", prompt="1+2=", max_tokens=4)
                for _ in range(3)
            ]
            assert all(r.choices[0].text == "hello" for r in await asyncio.gather(*calls))
        finally:
            await server.stop()

    on_a_loop_thread(main)


def test_an_empty_prompt_and_a_deep_body_are_400s_on_the_real_engine(tiny):
    """Each was a 500: an empty prompt failed the whole engine batch it was in, and json's
    recursion limit escaped as a plain-text error."""
    c = client(tiny)
    for prompt in ("", [[]], [[], [5, 6]]):
        with pytest.raises(openai.BadRequestError, match="prompt is empty") as e:
            c.completions.create(model="policy", prompt=prompt)
        assert e.value.param == "prompt"
    status, body = post(tiny.url + "/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested too deeply" in body["error"]["message"]
    status, body = post(tiny.url + "/completions", b'{"prompt": [[[[[[[[[[[[1]]]]]]]]]]]]}')
    assert status == 400  # a shape the request type refuses, not an engine error
    assert c.completions.create(model="policy", prompt="1+2=", max_tokens=2).choices


def test_a_chunked_body_over_the_limit_is_refused_while_it_streams_in(tokenizer):
    import http.client
    import urllib.parse

    served = Served(ScriptedEngine(tokenizer), tokenizer, max_body_bytes=1000)
    try:
        url = urllib.parse.urlsplit(served.url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        chunks = iter([b'{"model": "policy", "prompt": "', b"x" * 600, b"x" * 600, b'"}'])
        conn.request("POST", url.path + "/completions", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json"})  # fmt: skip
        r = conn.getresponse()
        assert r.status == 413 and b"over 1000 bytes" in r.read()
        conn.close()
        # a declared length over the limit: refused before a byte of the body is read
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.putrequest("POST", url.path + "/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(20 * 2**20))
        conn.endheaders()
        r = conn.getresponse()
        assert r.status == 413 and b"20971520 bytes; at most 1000" in r.read()
        conn.close()
    finally:
        served.close()


def test_an_empty_prompt_fails_alone_in_its_engine_batch(tiny_model_dir):
    from trinity.common.rollout import BadPrompt

    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1)
    got = engine.generate([[], [5, 6, 7]], SamplingParams(n=2, max_tokens=3), keys=[1, 2])
    alone = engine.generate([[5, 6, 7]], SamplingParams(n=2, max_tokens=3), keys=[2])
    assert isinstance(got[0], BadPrompt) and "empty prompt" in str(got[0])
    assert [s.response_ids for s in got[1]] == [s.response_ids for s in alone[0]]


def test_a_workflow_s_async_client_samples_in_its_own_session(tiny_model_dir, tokenizer):
    """As in the explorer (`enable_openai_api`): the workflow's handle is registered under its
    session while it runs, and the AsyncOpenAI client it hands out calls the server on the same
    loop, so an `async def run` awaits it without blocking the engines' batching."""
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1)

    async def main() -> None:
        client = BatchingClient([InProcess(engine)])
        sessions = WorkflowSessions("tiny-policy", len(tokenizer), 64, client)
        server = EndpointServer(build_app(sessions))
        url = await server.start()
        try:
            defaults = SamplingParams(n=1, max_tokens=6)
            handle = TaskModelHandle(client, tokenizer, defaults, endpoint=(url, "tiny-policy"))
            with pytest.raises(RuntimeError, match="enable_openai_api"):
                TaskModelHandle(client, tokenizer, defaults).async_openai_client()
            sessions.sessions["task-1"] = handle
            oai = handle.async_openai_client()
            oai = oai.with_options(base_url=url.replace("/v1", "/sessions/task-1/v1"))
            r = await oai.chat.completions.create(model="tiny-policy", messages=USER, seed=5)
            [direct] = await handle.chat(USER, seed=5)
            assert r.choices[0].message.content == handle.decode(direct.response_ids)
            with pytest.raises(openai.NotFoundError, match="no running workflow"):
                other = oai.with_options(base_url=url.replace("/v1", "/sessions/gone/v1"))
                await other.chat.completions.create(model="tiny-policy", messages=USER)
            # the blocking client on the loop's own thread would hold the loop that serves it
            # for its whole timeout: refused at once, naming the async client
            blocking = handle.openai_client(timeout=600).with_options(
                base_url=url.replace("/v1", "/sessions/task-1/v1")
            )
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match="async_openai_client"):
                blocking.chat.completions.create(model="tiny-policy", messages=USER)
            assert time.monotonic() - t0 < 1.0
            # from a thread of its own, it is served
            r2 = await asyncio.to_thread(
                blocking.chat.completions.create, model="tiny-policy", messages=USER, seed=5
            )
            assert r2.choices[0].message.content == r.choices[0].message.content
        finally:
            await server.stop()

    on_a_loop_thread(main)


def test_the_workflow_endpoint_budgets_a_reply_by_max_response_tokens(tokenizer):
    """Not by max_model_len: an in-workflow agent asking for more than `max_response_tokens`
    gets the 400 serve mode gives, and what it may ask for is sampled."""
    from trinity.config.schema import TrinityConfig
    from trinity.endpoint.server import rollout_model_endpoint

    cfg = TrinityConfig.model_validate(
        {
            "model": {"model_path": "tiny://1m", "max_model_len": 4096, "max_response_tokens": 8},
            "explorer": {"rollout_model": {"enable_openai_api": True}},
        }
    )
    engine = ScriptedEngine(tokenizer)

    async def main() -> None:
        client = BatchingClient([InProcess(engine)])
        sessions, server = rollout_model_endpoint(cfg, tokenizer, client)
        url = await server.start()
        try:
            defaults = SamplingParams(n=1, max_tokens=8)
            sessions.sessions["t"] = TaskModelHandle(client, tokenizer, defaults)
            oai = openai.AsyncOpenAI(
                base_url=url.replace("/v1", "/sessions/t/v1"), api_key="-", max_retries=0
            )
            with pytest.raises(openai.BadRequestError, match="at most 8 tokens per reply"):
                await oai.completions.create(model="tiny://1m", prompt="1+2=", max_tokens=9)
            ok = await oai.completions.create(model="tiny://1m", prompt="1+2=", max_tokens=8)
            assert ok.choices[0].text == "hello"
        finally:
            await server.stop()

    on_a_loop_thread(main)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
VALID_CHAT = {"model": "policy", "messages": USER, "max_tokens": 4}
VALID_COMPLETION = {"model": "policy", "prompt": "1+2=", "max_tokens": 4}
CHAT_KEYS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
    "top_k", "seed", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "tools",
    "tool_choice", "response_format", "presence_penalty", "logit_bias", "user",
]  # fmt: skip
COMPLETION_KEYS = ["model", "prompt", "max_tokens", "n", "stop", "logprobs", "echo", "stream"]
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "robot"])},
    optional={
        "content": st.none() | st.text(max_size=30) | st.lists(JSON, max_size=2),
        "tool_calls": JSON,
        "tool_call_id": JSON,
    },
)


HOSTILE = [
    ("/v1/chat/completions", b"[" * 50_000 + b"]" * 50_000),
    ("/v1/completions", b'{"model": "policy", "prompt": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"),
    ("/v1/completions", b'{"model": "policy", "prompt": ""}'),
    ("/v1/completions", b'{"model": "policy", "prompt": [[]]}'),
    ("/v1/completions", b'{"model": "policy", "prompt": [[], [5, 6]]}'),
    ("/v1/completions", b'{"model": "policy", "prompt": "1+2=", "n": 1000000000}'),
    ("/v1/completions", b'{"model": "policy", "prompt": "1+2=", "max_tokens": 0}'),
    ("/v1/completions", b'{"model": "policy", "prompt": "1+2=", "temperature": 1e999}'),
    ("/v1/chat/completions", b'{"model": "policy", "messages": []}'),
    ("/v1/chat/completions", b'{"model": "policy", "messages": [{"role": "user", "content": ""}]}'),
    ("/v1/chat/completions", b'{"model": "policy", "messages": [{"role": "tool"}]}'),
]


@st.composite
def requests(draw: Any) -> tuple[str, str, bytes | None]:
    """(method, path, body): valid bodies with one field set to anything, bodies that are any
    JSON at all, bytes that are not JSON, and routes and methods that do not exist."""
    prefix = draw(st.sampled_from(["", "/sessions/fuzz", "/sessions/%20x"]))
    kinds = ["valid", "chat", "completion", "raw", "bytes", "get", "feedback", "commit", "hostile"]
    kind = draw(st.sampled_from(kinds))
    if kind == "hostile":  # each a 500 once, or a shape an engine could choke on
        path, body = draw(st.sampled_from(HOSTILE))
        return "POST", prefix + path, body
    if kind in ("feedback", "commit"):  # serve mode's routes, with the same kinds of bodies
        body = {"session_id": draw(st.sampled_from(["fuzz", "fb-1", " bad", ""]))}
        if kind == "feedback":
            body |= {"reward": 1.0, "key": draw(st.sampled_from(["k1", "k2", ""]))}
            optional = ["reward", "key", "call_id", "turn", "session_id", "unknown_field"]
            for key in draw(st.lists(st.sampled_from(optional), max_size=3)):
                body[key] = draw(JSON)
        return "POST", f"/{kind}", json.dumps(body).encode()
    if kind == "get":
        path = draw(st.sampled_from(["/v1/models", "/health", "/v1/chat/completions", "/v2/x"]))
        return "GET", prefix + path if path != "/health" else path, None
    if kind == "valid":  # as sent, or streamed
        body = {
            **draw(st.sampled_from([VALID_CHAT, VALID_COMPLETION])),
            "stream": draw(st.booleans()),
        }
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        return "POST", prefix + path, json.dumps(body).encode()
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    if kind == "bytes":
        return "POST", prefix + path, draw(st.binary(max_size=40))
    if kind == "raw":
        return "POST", prefix + path, json.dumps(draw(JSON)).encode()
    body = dict(VALID_CHAT if kind == "chat" else VALID_COMPLETION)
    keys = CHAT_KEYS if kind == "chat" else COMPLETION_KEYS
    for key in draw(st.lists(st.sampled_from([*keys, "unknown_field"]), max_size=3)):
        body[key] = draw(st.lists(MESSAGE, max_size=3) if key == "messages" else JSON)
    return "POST", prefix + path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def real(tiny_model_dir, tokenizer) -> Iterator[Served]:
    """The tiny model's engine behind serve mode's app: what the scripted engine cannot show."""
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1)
    served = Served(engine, tokenizer, api_key="sk-test", book=FeedbackBook())
    yield served
    served.close()


@pytest.mark.slow  # a fuzz trial of 2,000 requests; each route's own tests stay fast
@pytest.mark.parametrize("engine_kind", [pytest.param("scripted", marks=pytest.mark.long), "real"])
def test_2000_fuzzed_requests_over_every_route_get_no_5xx(engine_kind, request):
    """Every route, /feedback and /commit included: 2,000 requests, none answered 5xx, against a
    scripted engine (tool calls in every reply) and against the tiny model's real engine."""
    if engine_kind == "scripted":
        served, engine = request.getfixturevalue("scripted")
        engine.reply = '<tool_call>{"name": "add", "arguments": {}}</tool_call> ok'
    else:
        served = request.getfixturevalue("real")
    root = served.url.removesuffix("/v1")
    statuses: Counter[int] = Counter()

    @settings(max_examples=2000, deadline=None, database=None, derandomize=True)
    @given(requests())
    def one(request: tuple[str, str, bytes | None]) -> None:
        method, path, body = request
        req = urllib.request.Request(root + path, data=body, method=method)
        req.add_header("Authorization", "Bearer sk-test")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
            assert status >= 500 or "error" in json.loads(e.read()), path
        statuses[status] += 1
        assert status < 500, (method, path, body)

    one()
    assert sum(statuses.values()) >= 2000
    assert statuses[200] > 20 and statuses[400] > 1000  # valid and bad requests both made
