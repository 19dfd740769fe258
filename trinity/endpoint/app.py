"""The OpenAI-compatible HTTP app in front of the rollout engines.

    POST /v1/chat/completions   messages, tools (function calling), n, logprobs, stop, seed, stream
    POST /v1/completions        a text or token-id prompt
    GET  /v1/models, /health

The same routes under `/sessions/{session_id}/v1/...` put a call in that session (so does an
`X-Session-Id` header); a call in no session is a session of its own. Each session's calls go
through one `ModelHandle` of the `SessionSource`, which records them (the handle decides how:
the explorer's handle keeps the exact sampled tokens). Every answer carries the weights version
it was sampled with (`model_version` in the body, `X-Model-Version` header).

Errors use OpenAI's format. A bad request (malformed JSON, a field out of range, an unsupported
parameter, a prompt over the context, an unknown model) is a 4xx naming the problem; a 5xx
means the engines failed.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from trinity.common.reasoning import REASONING_PARSER
from trinity.common.rollout import BadPrompt, PromptTooLong, Sample
from trinity.endpoint.bodies import (
    chat_choice,
    chat_logprobs,
    completion_logprobs,
    finish_of,
    head,
    reply_text,
    usage,
)
from trinity.endpoint.feedback import FeedbackBook, FeedbackError
from trinity.endpoint.openai_api import (
    APIError,
    ChatRequest,
    CommitRequest,
    CompletionRequest,
    FeedbackRequest,
)
from trinity.endpoint.streaming import Heard, chat_chunks, completion_chunks, live_chunks
from trinity.endpoint.tool_calls import TOOL_CALL_PARSER
from trinity.explorer.call_args import TemplateError
from trinity.explorer.model_client import TaskModelHandle

SESSION_HEADER = "x-session-id"
VERSION_HEADER = "x-model-version"
SESSION_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
MAX_BODY_BYTES = 16 * 2**20  # a request body's limit: a long agent history is a few MB
MAX_IN_FLIGHT = 256  # model calls sampling at once, per endpoint


class SessionSource(Protocol):
    """Where the endpoint gets the model: one recording handle per session."""

    model_name: str
    vocab_size: int
    max_tokens: int  # the most tokens one reply may ask for (model.max_response_tokens)

    @property
    def model_version(self) -> int: ...  # the weights the engines hold now

    def handle(self, session_id: str) -> TaskModelHandle: ...


def build_app(
    source: SessionSource,
    api_key: str | None = None,
    tool_call_parser: str = "hermes",
    reasoning_parser: str | None = None,
    book: FeedbackBook | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_in_flight: int = MAX_IN_FLIGHT,
) -> FastAPI:
    """The app serving `source`. `api_key`: required as `Authorization: Bearer <key>`.
    `book`: serve mode's sessions and rewards; adds POST /feedback and /commit.
    `max_body_bytes`: a larger request body is refused with 413 before it is read whole.
    `max_in_flight`: model calls sampling at once; one more is a 429 (with `Retry-After`), so
    a flood of clients queues in their retries, not in this process's memory.
    `reasoning_parser`: a `REASONING_PARSER` name; chat messages then carry the reply's
    `reasoning_content` apart from its `content` (`common/reasoning.py`), and a streamed chat
    call is answered whole first, as one with tools is."""
    in_flight = [0]
    parse_tools = TOOL_CALL_PARSER.get(tool_call_parser)
    reason = REASONING_PARSER.get(reasoning_parser) if reasoning_parser else None
    app = FastAPI(title="trinity OpenAI-compatible endpoint", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status == 429 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(FeedbackError)
    async def feedback_error(_: Request, e: FeedbackError) -> JSONResponse:
        return JSONResponse(APIError(e.status, str(e)).body(), status_code=e.status)

    @app.exception_handler(404)
    async def not_found(request: Request, _: Exception) -> JSONResponse:
        e = APIError(404, f"no route {request.method} {request.url.path}", code="not_found")
        return JSONResponse(e.body(), status_code=404)

    @app.exception_handler(405)
    async def not_allowed(request: Request, _: Exception) -> JSONResponse:
        e = APIError(405, f"method {request.method} not allowed on {request.url.path}")
        return JSONResponse(e.body(), status_code=405)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")

    async def body_of(request: Request, model: type[Any]) -> Any:
        check_key(request)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":  # what a web page cannot send without asking first
            raise APIError(
                415,
                f"Content-Type is {kind or 'missing'!r}; this endpoint reads application/json",
                code="unsupported_media_type",
            )
        try:
            raw = json.loads(await _read_body(request, max_body_bytes))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not JSON: {e}") from None
        except RecursionError:
            raise APIError(400, "the request body is nested too deeply to read") from None
        if not isinstance(raw, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            req = model.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            param = ".".join(str(x) for x in err["loc"]) or None
            if err["type"] == "extra_forbidden":
                raise APIError(
                    400, f"Unrecognized request argument supplied: {param}", param
                ) from None
            raise APIError(400, f"{param}: {err['msg']}" if param else err["msg"], param) from None
        if getattr(req, "model", source.model_name) != source.model_name:
            raise APIError(
                404,
                f"the model {req.model!r} does not exist; this endpoint serves {source.model_name!r}",
                "model",
                "model_not_found",
            )
        return req

    def session_of(request: Request, session_id: str | None) -> str:
        sid = session_id or request.headers.get(SESSION_HEADER)
        if sid is None:
            sid = f"call-{uuid.uuid4().hex}"
        valid(sid)
        if book is not None:
            book.check_open(sid)
        return sid

    def valid(sid: str) -> None:
        if not SESSION_ID.fullmatch(sid):
            raise APIError(
                400, f"session id {sid!r} is not 1-128 of A-Z a-z 0-9 . _ : -", "session"
            )

    def answered(sid: str, head: dict[str, Any], samples: list[Sample]) -> None:
        if book is not None:
            book.called(
                sid, head["id"], [s.info["call_id"] for s in samples if "call_id" in s.info]
            )

    def admit(call: Any) -> None:
        """Count `call` (a handle's sampling, not started) in; a 429 past `max_in_flight`."""
        if in_flight[0] >= max_in_flight:
            call.close()  # never started
            raise APIError(
                429, f"{max_in_flight} model calls are being answered already; retry shortly",
                code="rate_limit_exceeded", type="rate_limit_error",
            )  # fmt: skip
        in_flight[0] += 1

    def release() -> None:
        in_flight[0] -= 1

    async def sample(request: Request, call: Any) -> list[Sample]:
        """Await `call` (a handle's sampling), cancelled if the client hangs up first: a call
        whose answer nobody reads is not recorded (the client's retry is the call that counts,
        and its session's turns do not count the abandoned one)."""
        admit(call)
        try:
            work = asyncio.ensure_future(call)
            await _until(request, work)
            return _result(work)
        finally:
            release()

    async def live(
        request: Request, sid: str, kind: str, req: ChatRequest | CompletionRequest,
        handle: TaskModelHandle, heard: Heard, call: Any,
    ) -> StreamingResponse:  # fmt: skip
        """Stream `call` (sampling with `heard` as its watch) as it is sampled (`streaming`):
        answered once its first token is, so a failure before then is its own 4xx, as
        unstreamed; a client that hangs up before the end cancels it (nothing recorded)."""
        admit(call)
        work = asyncio.ensure_future(call)
        try:
            await _until(request, work, heard.first)
            if work.done():
                _result(work)  # raises its 4xx
        except BaseException:
            if not work.done():
                work.cancel()
            release()
            raise
        version = heard.version if heard.version is not None else source.model_version
        prefix, obj = (
            ("chatcmpl", "chat.completion") if kind == "chat" else ("cmpl", "text_completion")
        )
        hd = head(prefix, obj, req.model, version)

        def finish(samples: list[Sample]) -> list[tuple[str, str]]:
            answered(sid, hd, samples)
            if kind == "chat":
                ends = [chat_choice(i, s, handle, None) for i, s in enumerate(samples)]
                return [(c.message["content"] or "", c.finish_reason) for c in ends]
            return [(reply_text(s, handle), finish_of(s)) for s in samples]

        over: list[bool] = []

        async def ended() -> None:  # the stream's end, or the client gone (even before it began)
            if over:
                return
            over.append(True)
            if not work.done():  # nothing of an unfinished call is recorded
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
            release()

        async def chunks() -> AsyncIterator[str]:
            try:
                async for piece in live_chunks(
                    kind, hd, heard, work, handle, stops=req.stops(),
                    logprobs=req.logprobs is not None if kind == "completion" else bool(req.logprobs),
                    include_usage=usage_on(req),
                    finish=finish,
                ):  # fmt: skip
                    yield piece
            finally:  # at once when the client hangs up mid-stream
                await ended()

        headers = {SESSION_HEADER: sid, VERSION_HEADER: str(version)}
        return _Streamed(chunks(), ended, media_type="text/event-stream", headers=headers)

    def sampling(req: ChatRequest | CompletionRequest, limit: int | None) -> dict[str, Any]:
        """The call's sampling args. temperature, top_p, top_k and max_tokens a request leaves
        out are the session handle's defaults (a workflow's: its task's rollout args over
        `model.*`, as `model.chat` samples; serve mode's: `model.*`), so the config's sampling
        settings hold for OpenAI clients too; `n` is the request's (1 when left out)."""
        args: dict[str, Any] = {"n": req.n, "stop": req.stops(), "seed": req.seed}
        for key in ("temperature", "top_p", "top_k"):
            if key in req.model_fields_set:
                args[key] = getattr(req, key)
        if limit is not None:
            if limit > source.max_tokens:
                raise APIError(
                    400,
                    f"max_tokens is {limit}; this endpoint serves at most {source.max_tokens} "
                    "tokens per reply (model.max_response_tokens)",
                    "max_tokens",
                )
            args["max_tokens"] = limit
        return args

    async def chat(request: Request, session_id: str | None = None) -> Any:
        req: ChatRequest = await body_of(request, ChatRequest)
        sid = session_of(request, session_id)
        handle = source.handle(sid)
        tools = req.template_tools()
        messages = [m.for_template() for m in req.messages]
        args = sampling(req, req.limit())
        # tool calls and reasoning are parsed from whole replies
        if req.stream and not req.parses_calls() and reason is None:
            heard = Heard(req.n)
            call = handle.chat(messages, tools=tools, refuse_over_long=True, watch=heard, **args)
            return await live(request, sid, "chat", req, handle, heard, call)
        samples = await sample(
            request, handle.chat(messages, tools=tools, refuse_over_long=True, **args)
        )
        choices = [
            chat_choice(i, s, handle, parse_tools if req.parses_calls() else None, reason)
            for i, s in enumerate(samples)
        ]
        version = min(s.model_version for s in samples)
        hd = head("chatcmpl", "chat.completion", req.model, version)
        answered(sid, hd, samples)
        headers = {SESSION_HEADER: sid, VERSION_HEADER: str(version)}
        if req.stream:
            chunks = chat_chunks(hd, choices, samples, handle, bool(req.logprobs), usage_on(req))
            return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
        body = {
            **hd,
            "choices": [
                {
                    "index": c.index,
                    "message": c.message,
                    "logprobs": (
                        chat_logprobs(c.sample.response_ids, c.sample.logprobs, handle)
                        if req.logprobs
                        else None
                    ),
                    "finish_reason": c.finish_reason,
                }
                for c in choices
            ],
            "usage": usage(len(samples[0].prompt_ids), samples),
        }
        return JSONResponse(body, headers=headers)

    async def completions(request: Request, session_id: str | None = None) -> Any:
        req: CompletionRequest = await body_of(request, CompletionRequest)
        sid = session_of(request, session_id)
        handle = source.handle(sid)
        choices: list[dict[str, Any]] = []
        samples: list[Sample] = []
        prompt_tokens = 0
        prompts = []  # as token ids, all checked before any is sampled (and recorded)
        for prompt in req.prompts():
            if isinstance(prompt, list) and not all(0 <= t < source.vocab_size for t in prompt):
                raise APIError(400, f"token ids must lie in [0, {source.vocab_size})", "prompt")
            ids = handle.encode(prompt) if isinstance(prompt, str) else prompt
            if not ids:
                raise APIError(400, "prompt is empty: there is nothing to continue", "prompt")
            try:
                handle.check_prompt(ids)
            except PromptTooLong as e:
                raise _too_long(e) from None
            prompts.append(ids)
        args = sampling(req, req.max_tokens)
        if req.stream and len(prompts) == 1:
            heard = Heard(req.n)
            call = handle.generate(prompts[0], refuse_over_long=True, watch=heard, **args)
            return await live(request, sid, "completion", req, handle, heard, call)
        for ids in prompts:
            got = await sample(request, handle.generate(ids, refuse_over_long=True, **args))
            prompt_tokens += len(got[0].prompt_ids)
            for s in got:
                lp = None
                if req.logprobs is not None:
                    lp = completion_logprobs(s.response_ids, s.logprobs, handle)
                choices.append(
                    {
                        "index": len(choices),
                        "text": reply_text(s, handle),
                        "logprobs": lp,
                        "finish_reason": finish_of(s),
                    }
                )
            samples += got
        version = min(s.model_version for s in samples)
        hd = head("cmpl", "text_completion", req.model, version)
        answered(sid, hd, samples)
        headers = {SESSION_HEADER: sid, VERSION_HEADER: str(version)}
        total = usage(prompt_tokens, samples)
        if req.stream:
            return StreamingResponse(
                completion_chunks(hd, choices, total, usage_on(req)),
                media_type="text/event-stream",
                headers=headers,
            )
        return JSONResponse({**hd, "choices": choices, "usage": total}, headers=headers)

    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {
            "object": "list",
            "data": [
                {"id": source.model_name, "object": "model", "created": 0, "owned_by": "trinity"}
            ],
        }

    async def health() -> dict[str, Any]:
        return {"status": "ok", "model_version": source.model_version}

    async def feedback(request: Request) -> dict[str, Any]:
        req: FeedbackRequest = await body_of(request, FeedbackRequest)
        valid(req.session_id)
        assert book is not None
        took = book.feedback(req.session_id, req.reward, req.key, req.call_id, req.turn)
        return {"session_id": req.session_id, "duplicate": not took}

    async def commit(request: Request) -> dict[str, Any]:
        req: CommitRequest = await body_of(request, CommitRequest)
        valid(req.session_id)
        assert book is not None
        book.commit(req.session_id, req.group, req.group_size)
        return {"session_id": req.session_id, "committed": True}

    if book is not None:  # at the root and under /v1 (an OpenAI client's `post` reaches it)
        for prefix in ("", "/v1"):
            app.post(prefix + "/feedback")(feedback)
            app.post(prefix + "/commit")(commit)

    for prefix in ("", "/sessions/{session_id}"):
        app.post(prefix + "/v1/chat/completions")(chat)
        app.post(prefix + "/v1/completions")(completions)
        app.get(prefix + "/v1/models")(models)
    app.get("/health")(health)
    return app


class _Streamed(StreamingResponse):
    """A streamed answer that runs `ended()` once it is over, however it ends: sent whole,
    failed, or cut by the client hanging up, before its first chunk included (Starlette then
    never starts the body, so a `finally` inside it would not run)."""

    def __init__(self, content: Any, ended: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._ended = ended

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._ended()


def usage_on(req: ChatRequest | CompletionRequest) -> bool:
    """Whether a streamed answer ends with a usage chunk (`stream_options.include_usage`)."""
    return req.stream_options is not None and req.stream_options.include_usage


async def _until(request: Request, work: asyncio.Future, news: Any = None) -> None:
    """Wait until `work` is done or (a streamed call) `news` is. A client that hangs up first
    (or this handler cancelled) cancels `work`: nothing is recorded, 499."""
    gone = asyncio.ensure_future(_hung_up(request))
    waits = {work, gone} if news is None else {work, gone, news}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hung_up = gone.done()
        gone.cancel()
        if not work.done() and (hung_up or news is None or not news.done()):
            # hung up, or this handler itself was cancelled
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise APIError(
            499, "the client closed the connection before the answer: nothing was recorded",
            code="client_closed",
        )  # fmt: skip


def _result(work: asyncio.Future) -> list[Sample]:
    """`work`'s samples; its failure as the 4xx it means (a bad prompt), else as it is."""
    try:
        return work.result()
    except PromptTooLong as e:
        raise _too_long(e) from None
    except BadPrompt as e:
        raise APIError(400, str(e), "prompt") from None
    except TemplateError as e:
        raise APIError(400, str(e), "messages") from None


async def _hung_up(request: Request) -> None:
    """Return once the client has closed the connection (its body is read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over `limit` bytes: from its
    Content-Length before any of it is read, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise APIError(413, f"the request body is over {limit} bytes; at most {limit} are read")
    return bytes(body)


def _too_long(e: PromptTooLong) -> APIError:
    """OpenAI's answer to a prompt over the model's context: 400 `context_length_exceeded`."""
    return APIError(400, str(e), "messages", "context_length_exceeded")
