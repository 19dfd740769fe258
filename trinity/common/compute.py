"""The compute lane: the one thread on which a process runs its models' torch work.

    lane = compute_lane()                        # this process's lane, made on first use
    metrics = lane.run(trainer.train_step, batch)  # on the lane; inline when already on it
    InThread(factory, lane=lane)                  # an engine whose calls run on the lane too

Why one thread. torch's CPU kernels parallelise with OpenMP: GNU libgomp in torch's Linux wheels.
libgomp gives each thread that starts a parallel region a team of worker threads of its own,
which it keeps for that thread's life. Once a process's OpenMP threads outnumber the cores it
may use, libgomp's barriers stop spin-waiting and sleep instead (its "throttled" spin). Then
every small kernel pays a futex wake-up per barrier. A second team is enough to cross that line,
even when it is idle, and a small model's decode, made of small kernels, then runs markedly
slower (docs/benchmarks.md, "One OpenMP team per process").
Two teams arose wherever two threads of one process each ran model code:
- a trainer actor, whose `prepare` and `run` came on different threads of its pool;
- a `cluster.one_process` run, whose engines and trainer ran on threads of their own.

`torch.set_num_threads` is per thread under OpenMP too. A count set in a trainer's constructor
did not reach its steps when those ran on another thread. On the lane, the thread that sets the
count is the thread that computes.

Work on the lane takes turns: an engine's batch waits for a train step to end, and the reverse.
So a one-process run puts its engines there only in lockstep (`config.resolved.in_lockstep`),
where each side runs alone with every core anyway. Where they overlap (one-step-off), each side
computes on its own thread with its part of the cores (`common.resources`), so that the
process's OpenMP threads do not outnumber its cores (on 2 cores: one thread each, no team).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeLane:
    """One thread that runs submitted calls in the order they came, one at a time."""

    def __init__(self, name: str = "compute") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident = self._pool.submit(threading.get_ident).result()

    def here(self) -> bool:
        """Whether the calling thread is the lane."""
        return threading.get_ident() == self._ident

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue `fn(*args, **kwargs)` on the lane; its future holds the result or the error."""
        return self._pool.submit(fn, *args, **kwargs)

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the lane, waiting for it: at once when called from the lane
        (a call on the lane that waited for the lane would wait forever)."""
        if self.here():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()


def per_process(make: Callable[[], T]) -> Callable[[], T]:
    """A function returning the process's one `make()`, made on the first call (whichever
    thread calls first; the others wait for it)."""
    made: list[T] = []
    lock = threading.Lock()

    def get() -> T:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


compute_lane = per_process(ComputeLane)
"""This process's compute lane (one per process: every model user in it shares it)."""
