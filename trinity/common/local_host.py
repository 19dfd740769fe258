"""The run's ServiceHost in this process, for a run with no Ray instance at all.

    host = LocalHost(preload)                      # where a run would start the host actor
    hub = hosted(host, "hub", MetricsHub, path)    # the same `Hosted` handles as with Ray
    refs.get(hub.drain.remote())                   # a LocalRef (common.refs)

The one-process layout (`cluster.one_process`) puts the explorer, its engines, the trainer and
the small services in one Ray actor, the `ServiceHost`. When nothing else in the run needs Ray
(no auxiliary model engines, no Ray timeline, no cluster to join: `launcher.plan`), that actor
is all Ray would host, and Ray's own processes (GCS, raylet, agents, a worker runtime) cost
seconds before the first step and hundreds of megabytes beside a small model. `LocalHost` runs
the same `ServiceHost` on an event-loop thread of the driver's process instead, behind the
handle shape of the actor: `add`, `call`, `remove` and `names` take `.remote(...)` and return
`LocalRef`s, with the ObjectRef arguments of a call (LocalRefs here) resolved first, as Ray
resolves an actor call's top-level arguments. The hosted objects keep the execution model the
host gives them (module doc of `common.service_host`), so a hosted explorer awaits the buffer's
LocalRefs on the host's loop, and the trainer's thread waits on them with `refs.get`.

What Ray gave that this cannot: a killed actor's threads end with its process. Here a stop
(Ctrl-C, SIGTERM, a part that raised) cannot end the trainer's thread at once, so `halt` stops
checkpoints being sealed in the run's folder (`common.seals`), after which
the newest checkpoint cannot change and the run may name it. The threads end at their next call
to a removed service or their next checkpoint; the CLI does not wait for them and ends the
process with `os._exit` (`stranded()` says when), since Python's exit would.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trinity.common.refs import LocalRef
from trinity.common.seals import stop_sealing
from trinity.common.service_host import ServiceHost

_HALTED = threading.Event()  # a LocalHost of this process was halted: its threads may run on


def stranded() -> bool:
    """Whether a run in this process stopped with its parts' threads still running (`halt`):
    the process must end with `os._exit`, since Python's exit would wait for them."""
    return _HALTED.is_set()


class _LocalMethod:
    def __init__(self, host: LocalHost, method: str) -> None:
        self._host, self._method = host, method

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        return self._host.submit(self._method, args, kwargs)


class LocalHost:
    """A `ServiceHost` on an event-loop thread of this process (module doc). `preload`: the
    modules its compute objects need, imported on that thread while the caller goes on."""

    METHODS = ("add", "call", "remove", "names")

    def __init__(self, preload: Iterable[str] = ()) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="service-host", daemon=True
        )
        self._thread.start()
        self._halted = False
        self._host = asyncio.run_coroutine_threadsafe(self._build(tuple(preload)), self._loop)

    @staticmethod
    async def _build(preload: tuple[str, ...]) -> ServiceHost:
        return ServiceHost(preload)

    def __getattr__(self, method: str) -> _LocalMethod:
        if method not in self.METHODS:
            raise AttributeError(method)
        return _LocalMethod(self, method)

    def submit(self, method: str, args: tuple, kwargs: dict) -> LocalRef:
        """`ServiceHost.<method>(*args, **kwargs)` on the host's loop, once the host is built."""

        async def call() -> Any:
            host = await asyncio.wrap_future(self._host)
            given = [await a if isinstance(a, LocalRef) else a for a in args]
            named = {k: await v if isinstance(v, LocalRef) else v for k, v in kwargs.items()}
            out = getattr(host, method)(*given, **named)
            return await out if inspect.isawaitable(out) else out

        return LocalRef(asyncio.run_coroutine_threadsafe(call(), self._loop))

    def halt(self, run_dir: Path) -> None:
        """What killing the host actor does, as far as a process can do it to its own threads:
        no checkpoint is sealed in `run_dir` from now on (module doc)."""
        stop_sealing(run_dir)
        self._halted = True
        _HALTED.set()

    def close(self, timeout: float = 60.0) -> None:
        """Remove every hosted object (each `shutdown()` runs) and end the loop's thread; after
        `halt`, the loop stays (a daemon thread), so the parts' threads that still run get
        their errors from the removed objects and end, instead of waiting on a stopped loop."""
        if self._halted:  # a stopped run: what does not end soon will not end
            timeout = min(timeout, 10.0)
        if self._host.done() and self._host.exception() is None:
            try:
                names = self.submit("names", (), {}).future().result(timeout)
                for name in names:
                    self.submit("remove", (name,), {}).future().result(timeout)
            except TimeoutError:
                if not self._halted:
                    raise
                # a stopped run whose part is stuck for good (a stall) holds the loop: its
                # threads stay, and the stop's own error is the one the run reports
        if not self._halted:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._loop.close()

    def __repr__(self) -> str:
        return "LocalHost()"
