"""A run's small services in one process: the metrics hub, the synchronizer and the buffer.

    host = ray.remote(ServiceHost).options(num_cpus=0, max_concurrency=HOST_CONCURRENCY).remote()
    hub = hosted(host, "hub", MetricsHub, journal_path)          # the handle's shape is unchanged
    ray.get(hub.drain.remote())                                   # an ObjectRef, as from an actor

A run whose services no other process shares (`mode: both`, a train stage from a dataset,
`bench`) used to start each of them as a Ray actor: three Python processes that each held Ray's
worker runtime (docs/benchmarks.md, "The run's small services in one process") and took their
turn in the raylet's worker start-up queue, which starts as many workers at once as the machine
has cores, ahead of the explorer and the trainer. `ServiceHost` holds them all in one actor instead.

`hosted(...)` returns a `Hosted` handle with the shape of a Ray actor handle
(`handle.method.remote(*args, **kwargs)` returns an ObjectRef), so the explorer, the trainer and
the driver call it exactly as they call an actor. Each hosted object keeps the execution model Ray
gives it as an actor of its own:

- a class with coroutine methods (an async actor in Ray): its calls run on the host's event loop,
  at most `max_concurrency` at once; its plain methods run inline on the loop, as Ray runs them;
- a class without (a threaded actor in Ray): its calls run on a pool of `max_concurrency` threads
  of its own (Ray's default for an actor is one), never on the loop.

Differences from separate actors, all of them for processes of one run: an object's calls share
the host's process and loop with the other objects (none of the built-in services blocks the loop:
their waits are `await`s); a service is gone when `remove` is called (its running calls are
cancelled), not when a process is killed; a call made before its object was added waits for it
(the driver adds them without waiting, so the explorer and trainer start at once), and a call to
an object whose constructor raised raises that error. Services that another process of the run
must find by name (split runs: `mode: explore / train / serve`) stay named actors of their own.

With `cluster.one_process` the host also holds the stage's compute objects: the explorer (an
async class) and the trainer (a plain class, on its thread pool), so a laptop's run has one
worker process with one copy of torch, transformers and Ray's worker runtime. Their model work
(the rollout engines' calls, the trainer's build, steps, syncs and checkpoints) takes turns on
the process's one compute lane (`trinity.common.compute`), so the process has one OpenMP team. They call the services, and the driver calls them, through the same handles
(a call from one hosted object to another is the host actor calling itself, which Ray serves
concurrently). `remove` runs an object's `shutdown()` where it has one, since no process exit
frees what it holds (an explorer's engine threads). Model builds in the one process take turns
(`trinity.models.loading.BUILD_LOCK`). A one-process run with nothing else on Ray runs this same
host on a thread of the driver instead of in an actor (`common.local_host`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HOST_CONCURRENCY = 1024  # Ray's limit for the host: the objects' own limits apply inside it
ADD_WAIT_S = 300.0  # a call that names an object not added within this long is an error


class _Service:
    """One hosted object and how its calls run (see the module doc)."""

    def __init__(self, obj: Any, max_concurrency: int) -> None:
        self.obj = obj
        is_async = any(
            inspect.iscoroutinefunction(f) for _, f in inspect.getmembers(type(obj), callable)
        )
        self.slots = asyncio.Semaphore(max_concurrency)
        self.pool = (
            None
            if is_async
            else ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="service")
        )
        self.running: set[asyncio.Task] = set()

    async def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        fn = getattr(self.obj, method)
        if self.pool is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.pool, lambda: fn(*args, **kwargs))
        async with self.slots:
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result


class ServiceHost:
    """The Ray actor that holds a run's small services (module doc). Methods: `add`, `call`,
    `remove`, `names`."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        """`preload`: modules to import now, as the actor starts (for compute objects to come,
        `cluster.one_process`: torch and transformers import while the driver sets the stage up,
        instead of after their objects are added). Imported before any call runs, so never on
        two threads at once."""
        for module in preload:
            importlib.import_module(module)
        self._services: dict[str, _Service] = {}
        self._failed: dict[str, BaseException] = {}
        self._added: dict[str, asyncio.Event] = {}
        self._removed: set[str] = set()

    def _event(self, name: str) -> asyncio.Event:
        return self._added.setdefault(name, asyncio.Event())

    async def add(self, name: str, cls: type, args: tuple, max_concurrency: int = 1) -> None:
        """Build `cls(*args)` here under `name` (replacing nothing: the name must be free)."""
        if name in self._services:
            raise ValueError(f"a service named {name!r} is already hosted")
        self._removed.discard(name)
        try:
            self._services[name] = _Service(cls(*args), max_concurrency)
        except BaseException as e:  # every call to it raises this, as an actor's calls would
            self._failed[name] = e
            raise
        finally:
            self._event(name).set()

    async def call(self, _service: str, _method: str, *args: Any, **kwargs: Any) -> Any:
        """`_method(*args, **kwargs)` of the object hosted as `_service` (top-level ObjectRef
        arguments arrive resolved, as Ray resolves them for an actor's method)."""
        if _service in self._removed:
            raise KeyError(f"service {_service!r} was removed from this host")
        if _service not in self._services and _service not in self._failed:
            try:
                await asyncio.wait_for(self._event(_service).wait(), ADD_WAIT_S)
            except TimeoutError:
                raise KeyError(
                    f"no service {_service!r} was added to this host within {ADD_WAIT_S:.0f} s "
                    f"(hosted: {sorted(self._services)})"
                ) from None
        if _service in self._failed:
            raise RuntimeError(f"service {_service!r} failed to start") from self._failed[_service]
        service = self._services.get(_service)
        if service is None:  # removed while this call waited for it
            raise KeyError(f"service {_service!r} was removed from this host")
        task = asyncio.current_task()
        service.running.add(task)
        try:
            return await service.call(_method, args, kwargs)
        finally:
            service.running.discard(task)

    async def remove(self, name: str) -> None:
        """Drop `name`: its running calls are cancelled, its `shutdown()` runs when it has one
        (what a killed actor's process would have let go: an explorer's engine threads and
        endpoints), and the object is let go."""
        service = self._services.pop(name, None)
        self._failed.pop(name, None)
        self._removed.add(name)
        if (added := self._added.pop(name, None)) is not None:
            added.set()  # a call still waiting for it raises now
        if service is None:
            return
        for task in list(service.running):
            if task is not asyncio.current_task():
                task.cancel()
        if service.pool is not None:
            service.pool.shutdown(wait=False, cancel_futures=True)
        if callable(shutdown := getattr(service.obj, "shutdown", None)):
            done = shutdown()
            if inspect.isawaitable(done):
                await done
        del service
        gc.collect()  # a compute object's model and optimizer go now, not at some later GC

    def names(self) -> list[str]:
        """The objects hosted now."""
        return sorted(self._services)


class _HostedMethod:
    def __init__(self, host: Any, service: str, method: str) -> None:
        self._host, self._service, self._method = host, service, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._host.call.remote(self._service, self._method, *args, **kwargs)


class Hosted:
    """A handle on an object in a `ServiceHost`, shaped like a Ray actor handle. Picklable: it
    travels to other actors as the host's handle and the object's name."""

    def __init__(self, host: Any, name: str) -> None:
        self.host, self.name = host, name

    def __getattr__(self, method: str) -> _HostedMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _HostedMethod(self.host, self.name, method)

    def __reduce__(self) -> tuple:
        return (Hosted, (self.host, self.name))

    def __repr__(self) -> str:
        return f"Hosted({self.name!r})"


def hosted(host: Any, name: str, cls: type, *args: Any, max_concurrency: int = 1) -> Hosted:
    """Add `cls(*args)` to `host` as `name` (without waiting for it) and return its handle."""
    host.add.remote(name, cls, args, max_concurrency)
    return Hosted(host, name)
