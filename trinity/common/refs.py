"""Results of calls on actor-shaped handles, whether Ray runs them or this process does.

    ref = handle.method.remote(*args)     # a Ray ObjectRef, or a LocalRef (common.local_host)
    value = refs.get(ref)                 # from a thread: ray.get for Ray's, the result for ours
    value = await ref                     # from a coroutine: both are awaitable

A run whose parts are all in this process (`common.local_host`: the one-process layout with no
Ray instance) gets `LocalRef`s back from its handles; every other run gets Ray's. Code that
serves both (the trainer's runner, the launcher, the memory sync) waits through `get`, `wait`
and `put` here instead of Ray's functions of the same names, which accept only Ray's refs.

A local call raises its own exception where Ray would raise a `RayTaskError` deriving from it:
`except SomeError` catches both, and `remote_errors.cause_of` gives the original in both cases.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any


class LocalRef:
    """The result of a call that runs in this process (a `concurrent.futures.Future` inside):
    awaitable from any event loop, and `get`-able from any thread but the one that runs it."""

    __slots__ = ("_future",)

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def future(self) -> concurrent.futures.Future:
        """The call's `concurrent.futures.Future` (as `ObjectRef.future()` gives one)."""
        return self._future

    def __await__(self) -> Any:
        return asyncio.wrap_future(self._future).__await__()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"LocalRef({state})"


def resolved(value: Any) -> LocalRef:
    """A LocalRef that already holds `value` (what `put` gives back for a local run)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return LocalRef(future)


def is_local(ref: Any) -> bool:
    if isinstance(ref, list | tuple):
        return bool(ref) and all(isinstance(r, LocalRef) for r in ref)
    return isinstance(ref, LocalRef)


def get(ref: Any, timeout: float | None = None) -> Any:
    """`ray.get` for Ray's refs; the value (or the raised exception) for local ones. A list
    gives a list. Raises TimeoutError (Ray's `GetTimeoutError` is one) after `timeout` s."""
    if isinstance(ref, LocalRef):
        return ref.future().result(timeout)
    if isinstance(ref, list) and not ref:
        return []
    if is_local(ref):
        deadline = None if timeout is None else time.monotonic() + timeout
        return [
            r.future().result(None if deadline is None else max(deadline - time.monotonic(), 0))
            for r in ref
        ]
    import ray

    return ray.get(ref, timeout=timeout)


def wait(
    refs: list[Any], num_returns: int = 1, timeout: float | None = None
) -> tuple[list[Any], list[Any]]:
    """`ray.wait`: (the first `num_returns` refs done, the rest), each in the given order."""
    if not is_local(refs):
        import ray

        return ray.wait(refs, num_returns=num_returns, timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = [r for r in refs if r.future().done()]
        left = None if deadline is None else deadline - time.monotonic()
        if len(done) >= num_returns or (left is not None and left <= 0):
            done = done[:num_returns]
            return done, [r for r in refs if r not in done]
        concurrent.futures.wait(
            [r.future() for r in refs if not r.future().done()],
            timeout=left,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )


def put(value: Any, local: bool) -> Any:
    """A ref to `value` for other parts of the run: Ray's object store (a copy), or, for a run
    in this process (`local`), `value` itself: the caller copies what it may change later."""
    if local:
        return resolved(value)
    import ray

    return ray.put(value)
