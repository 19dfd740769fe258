"""An engine in this process behind the Ray-handle shape `BatchingClient` calls.

    client = BatchingClient([InProcess(HFRolloutEngine(path))])

`engine.method.remote(*args)` runs the method at once, on the caller's thread, and returns an
awaitable with its result (or its exception), as a Ray actor handle's call returns an
ObjectRef. For tools that need one engine and no cluster (`trinity debug workflow`) and for tests.
"""

from __future__ import annotations

import asyncio
from typing import Any


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
