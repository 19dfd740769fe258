"""ServiceHost: objects in one actor keep the execution model Ray gives each as an actor of its own."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from typing import ClassVar

import pytest

from trinity.common.service_host import Hosted, ServiceHost


class AsyncCounter:  # an async actor in Ray: its calls run on the event loop
    def __init__(self, start: int) -> None:
        self.n = start
        self.threads: set[str] = set()
        self.gate = asyncio.Event()

    async def bump(self, by: int = 1) -> int:
        self.threads.add(threading.current_thread().name)
        self.n += by
        return self.n

    def value(self) -> int:  # a plain method of an async class runs inline on the loop
        self.threads.add(threading.current_thread().name)
        return self.n

    async def wait_gate(self) -> str:
        await self.gate.wait()
        return "opened"

    async def open_gate(self) -> None:
        self.gate.set()

    async def fail(self) -> None:
        raise ValueError("bad input, from the service")


class Threaded:  # a threaded actor in Ray: its calls run on threads of its own
    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def meet(self, barrier: threading.Barrier) -> str:
        barrier.wait()  # passes only once `barrier.parties` calls run at the same time
        return threading.current_thread().name

    def work(self, seconds: float) -> str:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        self.threads.add(threading.current_thread().name)
        time.sleep(seconds)
        with self.lock:
            self.active -= 1
        return threading.current_thread().name


class Broken:
    def __init__(self) -> None:
        raise OSError("cannot open its file")


def run(coro):
    return asyncio.run(coro)


def test_async_objects_run_on_the_loop_and_share_it():
    async def main():
        host = ServiceHost()
        await host.add("c", AsyncCounter, (10,), 64)
        # a call waiting inside one object does not hold up the loop for the others
        waiting = asyncio.ensure_future(host.call("c", "wait_gate"))
        assert await host.call("c", "bump", 5) == 15
        assert await host.call("c", "bump", by=2) == 17
        assert await host.call("c", "value") == 17
        await host.call("c", "open_gate")
        assert await waiting == "opened"
        return host._services["c"].obj.threads

    # both ran on the loop's own thread, not on a pool
    assert run(main()) == {threading.main_thread().name}


def test_a_threaded_object_runs_on_its_own_threads_at_most_max_concurrency_at_once():
    async def serial():
        host = ServiceHost()
        await host.add("t", Threaded, ())  # Ray's default for an actor: one call at a time
        t0 = time.perf_counter()
        names = await asyncio.gather(*(host.call("t", "work", 0.2) for _ in range(4)))
        return host._services["t"].obj, names, time.perf_counter() - t0

    obj, names, seconds = run(serial())
    assert obj.most == 1 and seconds >= 0.8  # 4 calls of 0.2 s, one after another
    assert threading.main_thread().name not in names

    async def together():
        host = ServiceHost()
        await host.add("t", Threaded, (), 4)
        barrier = threading.Barrier(4, timeout=30)  # broken (an error) unless all 4 meet
        return await asyncio.gather(*(host.call("t", "meet", barrier) for _ in range(4)))

    assert len(set(run(together()))) == 4  # four threads of its own, at once


def test_errors_reach_the_caller():
    async def main():
        host = ServiceHost()
        await host.add("c", AsyncCounter, (0,), 8)
        with pytest.raises(ValueError, match="bad input, from the service"):
            await host.call("c", "fail")
        with pytest.raises(AttributeError):
            await host.call("c", "no_such_method")
        with pytest.raises(OSError, match="cannot open its file"):
            await host.add("b", Broken, ())
        # every call of an object whose constructor raised raises that error
        with pytest.raises(RuntimeError, match="'b' failed to start") as e:
            await host.call("b", "anything")
        assert isinstance(e.value.__cause__, OSError)
        with pytest.raises(ValueError, match="already hosted"):
            await host.add("c", AsyncCounter, (0,))
        return await host.call("c", "value")

    assert run(main()) == 0  # the failures left the good object as it was


def test_a_call_made_before_its_object_was_added_waits_for_it():
    async def main():
        host = ServiceHost()
        early = asyncio.ensure_future(host.call("late", "bump", 3))
        await asyncio.sleep(0.05)
        assert not early.done()
        await host.add("late", AsyncCounter, (1,), 8)
        return await early

    assert run(main()) == 4


def test_remove_cancels_running_calls_and_later_calls_fail():
    async def main():
        host = ServiceHost()
        await host.add("c", AsyncCounter, (0,), 8)
        waiting = asyncio.ensure_future(host.call("c", "wait_gate"))
        never_added = asyncio.ensure_future(host.call("gone", "bump"))
        await asyncio.sleep(0.05)
        await host.remove("c")
        await host.remove("gone")
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(KeyError, match="'gone' was removed"):
            await never_added
        with pytest.raises(KeyError, match="'c' was removed"):
            await host.call("c", "value")
        # the name is free again: the next stage's object of that name
        await host.add("c", AsyncCounter, (7,), 8)
        return await host.call("c", "value"), host.names()

    assert run(main()) == (7, ["c"])


class Closing:  # an object that holds something a killed actor's process would let go
    alive: ClassVar[list[int]] = []
    closed: ClassVar[list[str]] = []

    def __init__(self, ident: int) -> None:
        self.ident = ident
        Closing.alive.append(ident)

    def __del__(self) -> None:
        Closing.alive.remove(self.ident)

    def ping(self) -> int:
        return self.ident


class SyncClosing(Closing):
    def shutdown(self) -> None:
        Closing.closed.append(f"sync {self.ident}")


class AsyncClosing(Closing):
    async def shutdown(self) -> None:
        await asyncio.sleep(0)
        Closing.closed.append(f"async {self.ident}")


def test_remove_shuts_an_object_down_and_lets_it_go():
    """`remove` is what ending an actor's process was: the object's `shutdown()` runs (an
    explorer closes its engine threads there), awaited when it is a coroutine, and nothing in
    the host keeps the object alive after it."""
    Closing.alive.clear()
    Closing.closed.clear()

    async def main():
        host = ServiceHost()
        await host.add("a", SyncClosing, (1,))
        await host.add("b", AsyncClosing, (2,), 8)
        await host.add("c", Closing, (3,))  # no shutdown: removed all the same
        assert [await host.call(n, "ping") for n in "abc"] == [1, 2, 3]
        for n in "abc":
            await host.remove(n)
        return host.names()

    assert run(main()) == []
    assert Closing.closed == ["sync 1", "async 2"]
    assert Closing.alive == []


class FakeHost:  # records what a Hosted handle asks of the host actor
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    @property
    def call(self):
        host = self

        class _M:
            @staticmethod
            def remote(*args, **kwargs):
                host.calls.append((args, kwargs))
                return "ref"

        return _M


def test_a_hosted_handle_has_the_shape_of_an_actor_handle():
    host = FakeHost()
    h = Hosted(host, "stage/buffer/exp")
    assert h.write.remote([1, 2], token=3) == "ref"
    # the arguments stay top-level, so Ray resolves ObjectRefs among them as for an actor
    assert host.calls == [(("stage/buffer/exp", "write", [1, 2]), {"token": 3})]
    with pytest.raises(AttributeError):
        h._private  # noqa: B018
    back = pickle.loads(pickle.dumps(Hosted("host-handle", "hub")))
    assert (back.host, back.name) == ("host-handle", "hub")
