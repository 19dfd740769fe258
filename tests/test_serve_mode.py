"""Serve mode's writes (`explorer.serve.ServeMode`): a group reaches the buffer whole in one
write, and group ids carry the endpoint's name and a serve step kept in the buffer with the
experiences, so neither a second serve process nor this one started again reuses one."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from test_endpoint import USER, ScriptedEngine, post

from trinity.buffer.queue import QueueStorage
from trinity.common.rollout import SamplingParams
from trinity.config.schema import TrinityConfig
from trinity.endpoint.feedback import FeedbackBook
from trinity.endpoint.server import EngineSessions
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient
from trinity.explorer.serve import ServeMode
from trinity.models import load_tokenizer


class Handle:
    """An object behind the actor-handle shape: `handle.method.remote(...)` is awaitable."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.obj, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out

        return SimpleNamespace(remote=call)


class Nothing:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _serving(name: str, queue: QueueStorage, tokenizer: Any) -> ServeMode:
    cfg = TrinityConfig.model_validate({"explorer": {"name": name}})
    explorer = SimpleNamespace(
        cfg=cfg, buffer=Handle(queue), synchronizer=Handle(Nothing()), hub=Handle(Nothing()),
        step_offset=0, _version=lambda: 0, _token=None,
    )  # fmt: skip

    async def write(exps: list, cursor: Any) -> None:
        await queue.write(exps, cursor, explorer._token)

    explorer._write = write
    serve = ServeMode(explorer)
    client = BatchingClient([InProcess(ScriptedEngine(tokenizer))])
    serve.sessions = EngineSessions(client, tokenizer, SamplingParams(max_tokens=4), "policy")
    serve.book = FeedbackBook(window_s=60, freeze=serve.freeze)
    return serve


async def _episode(serve: ServeMode, sid: str, group: str | None, size: int | None) -> None:
    assert serve.sessions is not None and serve.book is not None
    [sample] = await serve.sessions.handle(sid).chat(USER)
    serve.book.called(sid, f"{sid}-call", [sample.info["call_id"]])
    serve.book.feedback(sid, float(len(sid)), key=sid)
    serve.book.commit(sid, group, size)


def test_groups_are_written_whole_under_ids_no_other_write_had(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    queue = QueueStorage(tmp_path / "buffer.db")

    async def main() -> tuple[list, Any]:
        a = _serving("serve_a", queue, tokenizer)
        await a.register()
        await _episode(a, "a1", "q", 2)
        await _episode(a, "solo", None, None)
        await a._write_step(a.book.take_ready())  # step 1: the solo session; q waits for a2
        await _episode(a, "a2", "q", 2)
        await a._write_step(a.book.take_ready())  # step 2: q, whole
        # the same endpoint started again: it continues after step 2; another one beside it
        again, b = _serving("serve_a", queue, tokenizer), _serving("serve_b", queue, tokenizer)
        await again.register()
        await b.register()
        assert (again.step, again.written, b.step) == (2, 3, 0)
        for serve, sid in ((again, "r1"), (again, "r2"), (b, "b1"), (b, "b2")):
            await _episode(serve, sid, "q", 2)
        await again._write_step(again.book.take_ready())
        await b._write_step(b.book.take_ready())
        return (await queue.read(7, timeout=5)).experiences, await queue.cursor("serve_a")

    experiences, cursor = asyncio.run(main())
    rows = {e.info["session_id"]: e.eid for e in experiences}
    assert rows["solo"].group == (1, 0, "serve/serve_a")
    assert rows["a1"].group == rows["a2"].group == (2, 0, "serve/serve_a")
    assert rows["r1"].group == rows["r2"].group == (3, 0, "serve/serve_a")
    assert rows["b1"].group == rows["b2"].group == (1, 0, "serve/serve_b")
    assert len({e.group for e in rows.values()}) == 4
    assert (cursor.step, cursor.tasks) == (3, 5)


def test_a_drifting_session_is_one_episode_of_its_group_with_its_whole_return(
    tmp_path, tiny_model_dir
):
    """The agent edits a reply it sends back: the session is two segments (drift). Both rows
    are one episode of the group (one run, steps 0 and 1), each with the session's return (the
    sum of its calls' rewards, 0.25 + 0.5), so a group baseline counts the session once."""
    tokenizer = load_tokenizer(str(tiny_model_dir))

    async def main() -> tuple[list, Any]:
        serve = _serving("serve_a", QueueStorage(tmp_path / "buffer.db"), tokenizer)
        assert serve.sessions is not None and serve.book is not None
        handle = serve.sessions.handle("d")
        [s0] = await handle.chat(USER)
        edited = [*USER, {"role": "assistant", "content": "3 (edited)"},
                  {"role": "user", "content": "sure?"}]  # fmt: skip
        [s1] = await handle.chat(edited)
        for i, s in enumerate((s0, s1)):
            serve.book.called("d", f"d-{i}", [s.info["call_id"]])
            serve.book.feedback("d", 0.25 * (i + 1), key=f"d-{i}", call_id=f"d-{i}")
        serve.book.commit("d", "q", 2)
        await _episode(serve, "e", "q", 2)  # reward len("e") = 1
        return serve.experiences(1, serve.book.take_ready())

    experiences, stats = asyncio.run(main())
    assert stats.drift == 1
    rows = [(e.info["session_id"], e.eid.run, e.eid.step, e.reward) for e in experiences]
    assert rows == [("d", 0, 0, 0.75), ("d", 0, 1, 0.75), ("e", 1, 0, 1.0)]
    assert len({e.eid.group for e in experiences}) == 1


def test_a_long_session_keeps_each_message_once_and_unchanged_by_its_caller(tiny_model_dir):
    """50 calls, each the history so far plus an answer and a new question: the session keeps
    99 messages, not the 2,500 a copy of every call's whole history would be, and a caller
    that edits its list afterwards changes nothing kept."""
    from trinity.explorer.model_client import TaskModelHandle

    tokenizer = load_tokenizer(str(tiny_model_dir))
    client = BatchingClient([InProcess(ScriptedEngine(tokenizer))])
    handle = TaskModelHandle(client, tokenizer, SamplingParams(max_tokens=4))

    async def main() -> list[dict]:
        history = [{"role": "user", "content": "1+1="}]
        for i in range(50):
            [s] = await handle.chat(history)
            history += [
                {"role": "assistant", "content": handle.decode(s.response_ids)},
                {"role": "user", "content": f"and {i}?"},
            ]
        return history

    history = asyncio.run(main())
    calls = handle._chat._calls
    assert len(calls) == 50 and sum(len(c.messages) for c in calls) == 2500
    assert len({id(m) for c in calls for m in c.messages}) == 99  # the last call's 99
    history[0]["content"] = "edited"
    assert calls[-1].messages[0]["content"] == "1+1=" == calls[0].messages[0]["content"]


class Killed(Exception):
    """A serve process SIGKILLed at this point: nothing after it runs."""


class Loop:
    """An event loop on a thread of its own (the serve processes' and the buffer's), so the
    test's blocking HTTP calls do not stop it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)


def _started(loop: Loop, tmp_path: Any, queue: QueueStorage, tokenizer: Any, model: str) -> Any:
    """A serve process of endpoint "serve_a" (`ServeMode.start`: its cursor, session log and
    endpoint on port 0) whose buffer writes can be killed: `explorer.kill` "before" or
    "after" the write reaches the buffer."""
    cfg = TrinityConfig.model_validate({
        "checkpoint_root_dir": str(tmp_path), "model": {"model_path": model},
        "explorer": {"name": "serve_a", "api_port": 0},
    })  # fmt: skip
    explorer = SimpleNamespace(
        cfg=cfg, buffer=Handle(queue), synchronizer=Handle(Nothing()), hub=Handle(Nothing()),
        step_offset=0, _version=lambda: 0, _token=None, tokenizer=tokenizer, kill=None,
    )  # fmt: skip

    async def write(exps: list, cursor: Any) -> None:
        if explorer.kill == "before":
            raise Killed
        await queue.write(exps, cursor, explorer._token)
        if explorer.kill == "after":
            raise Killed

    async def start() -> tuple[ServeMode, str]:
        explorer.client = BatchingClient([InProcess(ScriptedEngine(tokenizer))])
        serve = ServeMode(explorer)
        return serve, await serve.start()

    explorer._write = write
    serve, url = loop.run(start())
    return serve, url.removesuffix("/v1")


def _kill(loop: Loop, serve: ServeMode, step: bool = False) -> None:
    """SIGKILL, as far as the log can tell: the endpoint stops answering, the log is never
    closed; `step`: in the middle of writing a serve step (where `explorer.kill` says)."""
    if step:
        with pytest.raises(Killed):
            loop.run(serve._write_step(serve.book.take_ready()))
    assert serve.endpoint is not None
    loop.run(serve.endpoint.stop())


def test_a_killed_serve_process_loses_nothing_it_acknowledged(tmp_path, tiny_model_dir):
    """Commits and feedback answered 200 are on disk before the answer: a serve process started
    again under the same name writes every committed session, partial groups included, exactly
    once, whether the kill came before a serve step reached the buffer or after; only sessions
    left open (never committed) are lost, and say so (410)."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model, loop = str(tiny_model_dir), Loop()
    queue = QueueStorage(tmp_path / "buffer.db")

    def episode(root: str, sid: str, reward: float | None, group: str | None = None) -> int:
        chat = {"model": model, "messages": USER, "max_tokens": 2}
        status, _ = post(f"{root}/sessions/{sid}/v1/chat/completions", json.dumps(chat).encode())
        assert status == 200
        if reward is not None:
            assert _post(root, "feedback", session_id=sid, reward=reward, key=sid) == 200
        commit = {"group": group, "group_size": 3} if group else {}
        return _post(root, "commit", session_id=sid, **commit)

    serve, root = _started(loop, tmp_path, queue, tokenizer, model)
    assert episode(root, "e1", 1.0, "q") == episode(root, "e2", 0.0, "q") == 200  # q waits
    assert episode(root, "s1", 0.5) == episode(root, "s2", None) == 200  # s2 waits for reward
    post(f"{root}/sessions/o1/v1/chat/completions", json.dumps(
        {"model": model, "messages": USER, "max_tokens": 2}).encode())  # fmt: skip
    serve.explorer.kill = "after"  # s1's step reaches the buffer, the log never hears it
    _kill(loop, serve, step=True)

    serve, root = _started(loop, tmp_path, queue, tokenizer, model)
    assert _post(root, "commit", session_id="e1", group="q", group_size=3) == 200  # a retry
    assert _post(root, "feedback", session_id="e2", reward=0.0, key="e2") == 200  # duplicate
    assert _post(root, "feedback", session_id="o1", reward=1.0, key="o1") == 410  # open: lost
    assert _post(root, "commit", session_id="s1") == 200  # in the buffer: answered as before
    assert _post(root, "feedback", session_id="s2", reward=0.25, key="s2") == 200
    assert episode(root, "e3", 1.0, "q") == 200  # q is whole
    serve.explorer.kill = "before"  # this step never reaches the buffer
    _kill(loop, serve, step=True)

    serve, root = _started(loop, tmp_path, queue, tokenizer, model)
    loop.run(serve._write_step(serve.book.take_ready()))
    assert serve.book.take_ready() == []
    rows = loop.run(queue.read(queue.size(), timeout=5)).experiences  # all it holds
    got = sorted((e.info["session_id"], e.reward, e.eid.batch) for e in rows)
    assert got == [("e1", 1.0, 2), ("e2", 0.0, 2), ("e3", 1.0, 2), ("s1", 0.5, 1),
                   ("s2", 0.25, 2)]  # fmt: skip
    assert len({e.eid.group for e in rows if e.info["session_id"].startswith("e")}) == 1
    loop.run(serve.endpoint.stop())


def _post(root: str, route: str, **body: Any) -> int:
    return post(f"{root}/{route}", json.dumps(body).encode())[0]
