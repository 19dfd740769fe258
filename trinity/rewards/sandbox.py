"""The reward sandbox: a pool of worker processes that run reward fn calls under CPU-time and
memory limits (`reward_fn_args: {sandbox: subprocess, cpu_seconds: 5, memory_mb: 512}`).

    pool = sandbox_pool(limits)   # one pool per (workers, cpu_seconds, memory_mb) in a process
    result, seconds = await pool.call("my_pkg.rewards.run_tests", response, truth, raw, kwargs,
                                      timeout=10)

A worker (`sandbox_worker.py`, `python -m`) is a process started once and reused, not a fork
per call: it imports the reward registry and resolves the fn by its registry name or dotted
path (so the fn must be importable there; a plugin's through `TRINITY_PLUGIN_DIRS`, which it
inherits). A call waits for an idle worker (at most `workers` run at once); its timeout counts
from the moment the worker has it. A worker that times out is killed (SIGKILL); one past its
CPU time dies of SIGXCPU, one past its memory exits after reporting the MemoryError; a killed or
dead worker is replaced by a fresh one (started by the next call that needs it). A reward that
raises leaves its worker in the pool. Every failure is a `SandboxFailure` with its kind
(`timeout` for wall-clock and CPU time, `error` for the rest) and how long the call ran.

The pool is usable from any event loop and thread (a worker's reply is awaited with the
running loop's `add_reader`; idle workers are handed over under a lock). A process's pools are
closed at exit; their workers also die with the process that started them.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from trinity.rewards.limits import RewardLimits
from trinity.rewards.sandbox_worker import read_frame, write_frame

START_TIMEOUT_S = 120.0  # a worker's start-up (interpreter + reward registry) on a loaded machine


class SandboxFailure(Exception):
    """A sandboxed call that returned no result: `kind` is 'timeout' or 'error'."""

    def __init__(self, kind: str, detail: str, seconds: float) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.seconds = kind, detail, seconds


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, cpu_seconds: int | None, memory_mb: int | None) -> None:
        paths = [p or os.getcwd() for p in sys.path]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trinity.rewards.sandbox_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        write_frame(self.stdin, {"cpu_seconds": cpu_seconds, "memory_mb": memory_mb})

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def receive(self, timeout: float | None) -> Any:
        """The worker's next frame. TimeoutError after `timeout` s; EOFError when it died."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self.stdout.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await asyncio.wait_for(ready, timeout)
        finally:
            loop.remove_reader(fd)
        return read_frame(self.stdout)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def close(self) -> None:
        """End an idle worker: its stdin closes, so it returns; killed if it lingers."""
        self._close_pipes()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()

    def death(self, cpu_seconds: int | None) -> tuple[str, str]:
        """(kind, why) of a worker whose pipe closed mid-call."""
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        self._close_pipes()
        if rc == -signal.SIGXCPU:
            return "timeout", f"used more than cpu_seconds={cpu_seconds} of CPU time (SIGXCPU)"
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name
            return "error", f"the sandbox worker was killed by {name} (the kernel's OOM killer?)"
        return "error", f"the sandbox worker exited with code {rc}"

    def _close_pipes(self) -> None:
        for pipe in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


class SandboxPool:
    """At most `workers` worker processes, each call on an idle one (module docstring)."""

    def __init__(self, workers: int, cpu_seconds: int | None, memory_mb: int | None) -> None:
        self.size, self.cpu_seconds, self.memory_mb = workers, cpu_seconds, memory_mb
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._slots = 0  # workers started and not yet ended (idle or busy) + starts promised
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = (
            collections.deque()
        )
        self.started = 0  # workers started over the pool's life (replacements included)

    async def call(
        self,
        name: str,
        response: str,
        truth: str | None,
        raw: dict[str, Any],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> tuple[Any, float]:
        """The reward fn `name`'s result for one response, and the seconds the call ran;
        SandboxFailure when it returned none."""
        worker = await self._acquire()
        reuse = False
        t0 = time.perf_counter()
        try:
            try:
                write_frame(worker.stdin, (name, response, truth, raw, kwargs))
                kind, payload = await worker.receive(timeout)
            except TimeoutError:
                raise SandboxFailure(
                    "timeout",
                    f"took longer than timeout={timeout}s; its sandbox worker was killed",
                    time.perf_counter() - t0,
                ) from None
            except (EOFError, BrokenPipeError):
                kind, why = worker.death(self.cpu_seconds)
                raise SandboxFailure(kind, why, time.perf_counter() - t0) from None
            seconds = time.perf_counter() - t0
            if kind == "memory":
                raise SandboxFailure(
                    "error", f"exceeded memory_mb={self.memory_mb}:\n{payload}", seconds
                )
            reuse = True  # the call ended in the worker: it takes the next one
            if kind == "error":
                raise SandboxFailure("error", payload, seconds)
            return payload, seconds
        finally:
            if not reuse:
                worker.kill()
            self._release(worker if reuse else None)

    async def _acquire(self) -> _Worker:
        """An idle worker, a fresh one while the pool has room, else the next one released."""
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.close()  # died while idle (its parent thread ended, or killed)
                self._slots -= 1
            start = self._slots < self.size
            if start:
                self._slots += 1
            else:
                loop = asyncio.get_running_loop()
                handed: asyncio.Future = loop.create_future()
                self._waiters.append((loop, handed))
        if not start:
            got = await handed
            if got is not None:
                return got
            # None: a worker ended and its slot is ours; start its replacement
        try:
            worker = _Worker(self.cpu_seconds, self.memory_mb)
        except BaseException:
            self._release(None)
            raise
        self.started += 1
        try:
            kind, _ = await worker.receive(START_TIMEOUT_S)
            assert kind == "ready", kind
        except BaseException as e:
            worker.kill()
            self._release(None)
            if isinstance(e, asyncio.CancelledError):
                raise
            raise SandboxFailure(
                "error", f"the sandbox worker did not start: {type(e).__name__}: {e}", 0.0
            ) from e
        return worker

    def _release(self, worker: _Worker | None) -> None:
        """Give `worker` (None: a slot whose worker ended) to the first waiter, or keep it."""
        with self._lock:
            while self._waiters:
                loop, handed = self._waiters.popleft()
                if handed.done():
                    continue  # its caller was cancelled
                loop.call_soon_threadsafe(self._hand, handed, worker)
                return
            if worker is None:
                self._slots -= 1
            else:
                self._idle.append(worker)

    def _hand(self, handed: asyncio.Future, worker: _Worker | None) -> None:
        """On the waiter's loop: hand over, or pass on when it was cancelled meanwhile."""
        if handed.done():
            self._release(worker)
        else:
            handed.set_result(worker)

    def close(self) -> None:
        """End the idle workers (busy ones end with their calls' kill or the process)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._slots -= len(idle)
        for worker in idle:
            worker.close()


_POOLS: dict[tuple[int, int | None, int | None], SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def sandbox_pool(limits: RewardLimits) -> SandboxPool:
    """This process's pool for these limits (made on first use)."""
    key = (limits.workers, limits.cpu_seconds, limits.memory_mb)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SandboxPool(*key)
        return pool


@atexit.register
def close_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()
