"""Running the endpoint: sessions over the rollout engines, and uvicorn on the caller's loop.

    sessions = EngineSessions(client, tokenizer, defaults, model_name="policy")
    server = EndpointServer(build_app(sessions))
    url = await server.start()        # http://127.0.0.1:PORT/v1, a free port unless given one
    ...                               # any OpenAI client: OpenAI(base_url=url, api_key="-")
    await server.stop()

The server runs as a task on the running event loop, the one the `BatchingClient` batches on, so
requests from HTTP clients and workflows running in that loop share the engines' batches. It
binds 127.0.0.1 unless given another host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
import uuid
from typing import Any

import uvicorn

from trinity.common.rollout import SamplingParams
from trinity.endpoint.openai_api import APIError
from trinity.explorer.model_client import BatchingClient, TaskModelHandle


class EngineSessions:
    """A `SessionSource`: one `TaskModelHandle` per session id, made on its first call and kept
    until `pop` (the handle records the session's calls)."""

    def __init__(
        self,
        client: BatchingClient,
        tokenizer: Any,
        defaults: SamplingParams,
        model_name: str,
        max_prompt_tokens: int | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        """`reasoning_parser`: each session's (`TaskModelHandle`'s), a `REASONING_PARSER` name."""
        self.client, self.tokenizer, self.defaults = client, tokenizer, defaults
        self.reasoning_parser = reasoning_parser
        self.model_name = model_name
        self.vocab_size = len(tokenizer)
        self.max_tokens = defaults.max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.sessions: dict[str, TaskModelHandle] = {}
        self.used_at: dict[str, float] = {}  # each session's last call (time.monotonic)

    @property
    def model_version(self) -> int:
        return self.client.model_version

    def handle(self, session_id: str) -> TaskModelHandle:
        self.used_at[session_id] = time.monotonic()
        if session_id not in self.sessions:
            self.sessions[session_id] = TaskModelHandle(
                self.client,
                self.tokenizer,
                self.defaults,
                max_prompt_tokens=self.max_prompt_tokens,
                reasoning_parser=self.reasoning_parser,
            )
        return self.sessions[session_id]

    def pop(self, session_id: str) -> TaskModelHandle | None:
        self.used_at.pop(session_id, None)
        return self.sessions.pop(session_id, None)

    def drop_unused(self, idle_s: float) -> list[str]:
        """Let go of sessions that recorded nothing (every call they had failed or was
        abandoned) and had no call for `idle_s` s; their ids."""
        now = time.monotonic()
        gone = [
            sid
            for sid, handle in self.sessions.items()
            if not handle.ledger.records and now - self.used_at.get(sid, now) > idle_s
        ]
        for sid in gone:
            self.pop(sid)
        return gone


class WorkflowSessions:
    """A `SessionSource` for the explorer's endpoints: a session is one try of one running
    workflow, whose handle is registered for as long as it runs (the rollout model's recording
    `TaskModelHandle`, or an auxiliary model's `AuxiliaryHandle`, keyed by the try). A call
    naming no running workflow's session is refused."""

    def __init__(
        self, model_name: str, vocab_size: int, max_tokens: int, client: BatchingClient
    ) -> None:
        self.model_name, self.vocab_size, self.max_tokens = model_name, vocab_size, max_tokens
        self.client = client
        self.sessions: dict[str, TaskModelHandle] = {}

    @property
    def model_version(self) -> int:
        return self.client.model_version

    def handle(self, session_id: str) -> TaskModelHandle:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise APIError(
                404,
                f"no running workflow has session {session_id!r}: use the client the "
                "workflow's handle gives (model.openai_client(), async_openai_client(), "
                "model.auxiliary(i).openai_client(), ...) inside the workflow",
                "session",
                "session_not_found",
            ) from None


class SessionPublisher:
    """Publishes one workflow run's handles as sessions of `WorkflowSessions`: the task's handle
    and every `session()` it opens (`TaskModelHandle(publish=...)`), each under a fresh session
    id, so each has OpenAI clients of its own (one agent per episode). `close()` withdraws them
    all when the run ends; a later call naming one is a 404.

        publisher = SessionPublisher(sessions, server.url)
        handle = TaskModelHandle(client, tokenizer, params, publish=publisher)
        try: await workflow.run(task, handle)
        finally: publisher.close()
    """

    def __init__(self, sessions: WorkflowSessions, url: str) -> None:
        """`url`: the endpoint's base URL (ending in /v1)."""
        self.sessions, self.root = sessions, url.removesuffix("/v1")
        self.published: list[str] = []

    def __call__(self, handle: TaskModelHandle) -> tuple[str, str]:
        sid = uuid.uuid4().hex
        self.sessions.sessions[sid] = handle
        self.published.append(sid)
        return f"{self.root}/sessions/{sid}/v1", self.sessions.model_name

    def close(self) -> None:
        for sid in self.published:
            self.sessions.sessions.pop(sid, None)
        self.published.clear()


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _host_name(header: str) -> str:
    """The name in a Host header, without its port (`[::1]:80` -> `::1`)."""
    if header.startswith("["):
        return header[1 : header.find("]")]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address
        return host.lower() == "localhost"


class LoopbackOnly:
    """ASGI middleware for an endpoint bound to a loopback address: a request whose Host header
    is not a loopback name is refused (421). A web page the user visits can point a name of its
    own at 127.0.0.1 (DNS rebinding) and so reach the endpoint; its requests then carry that name,
    never `localhost`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if _host_name(host).lower() not in LOOPBACK_NAMES:
                body = json.dumps(
                    APIError(
                        421, f"Host {host!r} is not this machine's loopback name", code="bad_host"
                    ).body()
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 421,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class EndpointServer:
    """uvicorn serving `app` as a task of the running loop (behind `LoopbackOnly` on a loopback
    address)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        if _loopback(host):
            app = LoopbackOnly(app)
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float = 30.0) -> str:
        """Start serving; returns the base URL clients use (ending in /v1)."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # inherited by every connection: without it, a keep-alive client's request waits ~40 ms
        # (Nagle holds the response body until the client's delayed ACK of its headers)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))  # port 0: the OS picks a free one, known before serving
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._server.started:
            if self._task.done():  # it failed to start: raise its error
                self._task.result()
                raise RuntimeError("the endpoint's server stopped before it started")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the endpoint did not start within {timeout:.0f}s")
            await asyncio.sleep(0.02)
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task


def rollout_model_endpoint(
    cfg: Any, tokenizer: Any, client: BatchingClient
) -> tuple[WorkflowSessions, EndpointServer]:
    """The rollout model's endpoint for workflows (`explorer.rollout_model.enable_openai_api`;
    the explorer's and `trinity debug workflow`'s): its sessions, whose replies have the budget
    every other call has (`model.max_response_tokens`, 64 unset; a larger `max_tokens` is a
    400, as in serve mode), and the server of its app (not started)."""
    from trinity.endpoint.app import build_app  # FastAPI: only where an endpoint is served

    m, rm = cfg.model, cfg.explorer.rollout_model
    budget = m.max_response_tokens if m.max_response_tokens is not None else 64
    sessions = WorkflowSessions(m.model_path, len(tokenizer), budget, client)
    app = build_app(
        sessions,
        tool_call_parser=rm.tool_call_parser or "hermes",
        reasoning_parser=rm.reasoning_parser,
    )
    return sessions, EndpointServer(app)
