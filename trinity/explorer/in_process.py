"""Engines in this process behind the Ray-handle shape `BatchingClient` calls.

    client = BatchingClient([InProcess(HFRolloutEngine(path))])      # on the caller's thread
    client = BatchingClient([InThread(lambda: HFRolloutEngine(path))])  # on a thread of its own

`engine.method.remote(*args)` returns an awaitable with the method's result (or its exception),
as a Ray actor handle's call returns an ObjectRef; a generator method called as
`engine.method.options(num_returns="streaming").remote(*args)` returns an async iterator of
awaitables, one per item, as Ray's `ObjectRefGenerator` does (`RolloutEngine.generate_stream`).

- `InProcess` runs the method at once, on the caller's thread: for tools that need one engine
  and no cluster (`trinity debug workflow`) and for tests.
- `InThread` builds the engine and runs every call on one thread of its own, one call at a time
  in the order they were made, as a Ray actor runs its calls (`max_concurrency` 1): the
  explorer's event loop goes on (gathering the next batch, talking to the buffer) while the
  engine generates, since torch releases the GIL in its kernels. This is
  `explorer.rollout_model.in_explorer_process`: the engine shares the explorer's process instead
  of holding a copy of torch, transformers and the model code in one of its own.
  `InThread(factory, lane=compute_lane())` runs them on the process's compute lane instead
  (`trinity.common.compute`), in turn with the other model users of the process
  (`cluster.one_process`: the trainer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.common.compute import ComputeLane


def _streaming(options: dict[str, Any]) -> bool:
    if set(options) != {"num_returns"} or options["num_returns"] != "streaming":
        raise TypeError(f"an in-process engine call takes num_returns='streaming' only: {options}")
    return True


def _done(loop: asyncio.AbstractEventLoop, result: Any = None, error: Any = None) -> asyncio.Future:
    fut = loop.create_future()
    if error is not None:  # handed to the awaiting caller, as Ray hands a task's error
        fut.set_exception(error)
    else:
        fut.set_result(result)
    return fut


class _Call:
    def __init__(self, method: Any, streaming: bool = False) -> None:
        self._method, self._streaming = method, streaming

    def options(self, **options: Any) -> _Call:
        return _Call(self._method, _streaming(options))

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._streaming:
            return self._items(loop, self._method(*args, **kwargs))
        try:
            return _done(loop, self._method(*args, **kwargs))
        except Exception as e:
            return _done(loop, error=e)

    @staticmethod
    async def _items(loop: asyncio.AbstractEventLoop, items: Iterator[Any]) -> AsyncIterator[Any]:
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception as e:
                yield _done(loop, error=e)
                return
            yield _done(loop, item)
            await asyncio.sleep(0)  # the loop's other work runs between items


class InProcess:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> _Call:
        return _Call(getattr(self.engine, name))


class _ThreadCall:
    def __init__(self, owner: InThread, name: str, streaming: bool = False) -> None:
        self._owner, self._name, self._streaming = owner, name, streaming

    def options(self, **options: Any) -> _ThreadCall:
        return _ThreadCall(self._owner, self._name, _streaming(options))

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        owner, name = self._owner, self._name

        def call() -> Any:
            # the engine was built by the first job of this same thread: done by now
            return getattr(owner._built.result(), name)(*args, **kwargs)

        if not self._streaming:
            return asyncio.wrap_future(owner._submit(call))
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()

        def send(*item: Any) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        def iterate() -> None:  # on the engine's thread: every item, whoever still listens
            try:
                for item in call():
                    send(item, None)
            except BaseException as e:  # handed to the caller, as Ray hands a task's error
                send(None, e)
            finally:
                send(_END, None)

        def never_ran(job: Future) -> None:  # cancelled before its turn (`close`)
            if job.cancelled():
                send(None, RuntimeError("the in-process engine was closed before this call ran"))
                send(_END, None)

        owner._submit(iterate).add_done_callback(never_ran)
        return self._items(loop, items)

    @staticmethod
    async def _items(loop: asyncio.AbstractEventLoop, items: asyncio.Queue) -> AsyncIterator[Any]:
        while True:
            item, error = await items.get()
            if item is _END:
                return
            yield _done(loop, item, error)
            if error is not None:
                return


_END = object()


class InThread:
    """An engine built by `factory` on a thread of its own, which then runs its calls; on
    `lane` (a `ComputeLane`) instead where one is given."""

    def __init__(
        self, factory: Callable[[], Any], name: str = "engine", lane: ComputeLane | None = None
    ) -> None:
        self._lane = lane
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) if lane is None else None
        )
        self._queued: set[Future] = set()  # its calls not done yet
        # it loads its model while the caller goes on; its calls queue behind the build
        self._built: Future = self._submit(factory)

    def _submit(self, fn: Callable[[], Any]) -> Future:
        runner: Any = self._pool if self._pool is not None else self._lane
        fut = runner.submit(fn)
        self._queued.add(fut)
        fut.add_done_callback(self._queued.discard)
        return fut

    def __getattr__(self, name: str) -> _ThreadCall:
        if name.startswith("_"):
            raise AttributeError(name)
        return _ThreadCall(self, name)

    def close(self) -> None:
        """Cancel the calls not started, wait for the one running, then let the engine go."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        else:  # the lane goes on serving the process's other model users
            queued = list(self._queued)
            for fut in queued:
                fut.cancel()
            wait(queued)
        self._built = Future()  # drop the engine: its weights and cache are freed
        self._built.set_exception(RuntimeError("the in-process engine was closed"))
