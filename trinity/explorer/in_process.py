"""Engines in this process behind the Ray-handle shape `BatchingClient` calls.

    client = BatchingClient([InProcess(HFRolloutEngine(path))])      # on the caller's thread
    client = BatchingClient([InThread(lambda: HFRolloutEngine(path))])  # on a thread of its own

`engine.method.remote(*args)` returns an awaitable with the method's result (or its exception),
as a Ray actor handle's call returns an ObjectRef.

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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.common.compute import ComputeLane


class _Call:
    def __init__(self, method: Any) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(self._method(*args, **kwargs))
        except Exception as e:  # handed to the awaiting caller, as Ray hands a task's error
            fut.set_exception(e)
        return fut


class InProcess:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> _Call:
        return _Call(getattr(self.engine, name))


class _ThreadCall:
    def __init__(self, owner: InThread, name: str) -> None:
        self._owner, self._name = owner, name

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        owner, name = self._owner, self._name

        def call() -> Any:
            # the engine was built by the first job of this same thread: done by now
            return getattr(owner._built.result(), name)(*args, **kwargs)

        return asyncio.wrap_future(owner._submit(call))


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
