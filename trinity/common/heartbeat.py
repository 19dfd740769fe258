"""Heartbeats: what each part of a run is doing and waiting on, for the stall doctor.

    heartbeat.start(run_dir)                          # once per process (idempotent)
    heartbeat.progress("trainer")                     # the trainer moved on
    with heartbeat.waiting("explorer", "engine 0", "generate (8 prompts)"):
        result = await call(engine)                   # while waiting: named, timed

Every service of a run (explorer, trainer, and through their waits the engines, reward functions,
buffer and synchronizer) keeps in this process's registry a progress counter, the time it last
progressed and the waits it has open: what it waits *on* (another service's kind, e.g.
`trainer`, `synchronizer`, `engine 0`, or something outside the run's services such as
`reward_fn 'mine'`) and since when. The calls are a lock and a dict update: cheap enough for
every engine call and micro-batch.

A process that calls `start` gets a daemon thread (the *beacon*) that writes the registry as
JSON to `<run_dir>/heartbeat/<host>-<pid>.json` every `BEAT_S` seconds, so a driver in another
process (`monitor.stall`) sees every process of the run, and registers `faulthandler` on
SIGUSR1 to append all its threads' Python stacks to `stacks-<host>-<pid>.txt` beside it. The
beacon is a thread of its own: a service blocked in a sleep, a lock or a native call still
shows up as blocked, with its stack.
"""

from __future__ import annotations

import contextlib
import contextvars
import faulthandler
import itertools
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEAT_S = 1.0  # how often the beacon writes this process's snapshot
STACK_SIGNAL = signal.SIGUSR1  # a run's process dumps its stacks on this signal

_LOCK = threading.RLock()  # `start` holds it while the beacon takes its first snapshot
_TOKENS = itertools.count()


@dataclass
class _Service:
    progress: int = 0
    steps: int = 0
    progressed_at: float = field(default_factory=time.time)  # wall clock: compared across processes
    waits: dict[int, tuple[str, str, float]] = field(
        default_factory=dict
    )  # token: (on, detail, since)


_SERVICES: dict[str, _Service] = {}
# the service the code running now works for (an explorer sets it for its workflows' tasks), so
# code that does not know its service can still say what it waits on (`waiting_here`)
CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("heartbeat_service", default="")
_beacon: _Beacon | None = None


def service_name(kind: str, name: str) -> str:
    """A service's name in the registry: its kind, then its own name where that differs
    (`explorer`, `explorer 'explorer_2'`); the doctor matches waits on a kind to every
    service of that kind."""
    return kind if name in ("", kind) else f"{kind} {name!r}"


def _service(name: str) -> _Service:
    found = _SERVICES.get(name)
    if found is None:
        found = _SERVICES[name] = _Service()
    return found


def progress(service: str) -> None:
    """`service` moved on (a step, a micro-batch, an answered call, a finished task)."""
    with _LOCK:
        s = _service(service)
        s.progress += 1
        s.progressed_at = time.time()


def step(service: str) -> None:
    """`service` (an explorer or a trainer) finished a step: progress, and the step count the
    doctor's automatic timeout scales with."""
    with _LOCK:
        _service(service).steps += 1
    progress(service)


@contextlib.contextmanager
def waiting(service: str, on: str, detail: str = "") -> Iterator[None]:
    """`service` waits on `on` (`detail`: for what) for the block; the wait ends when the block
    does, however it ends. Works around an `await` as around a blocking call."""
    token = next(_TOKENS)
    with _LOCK:
        _service(service).waits[token] = (on, detail, time.time())
    try:
        yield
    finally:
        with _LOCK:
            _service(service).waits.pop(token, None)


@contextlib.contextmanager
def waiting_here(on: str, detail: str = "") -> Iterator[None]:
    """`waiting` for the service the running code works for (`CURRENT`); nothing outside one."""
    service = CURRENT.get()
    if not service:
        yield
        return
    with waiting(service, on, detail):
        yield


def snapshot() -> dict[str, Any]:
    """This process's registry: {pid, host, time, services: {name: {progress, steps, progressed_at,
    waits: [[on, detail, since], ...] oldest first}}}."""
    with _LOCK:
        services = {
            name: {
                "progress": s.progress,
                "steps": s.steps,
                "progressed_at": s.progressed_at,
                "waits": sorted((list(w) for w in s.waits.values()), key=lambda w: w[2]),
            }
            for name, s in _SERVICES.items()
        }
    return {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
            "services": services}  # fmt: skip


def process_key(host: str, pid: int) -> str:
    return f"{host}-{pid}"


def start(run_dir: str | Path) -> Path:
    """Start this process's beacon for the run at `run_dir` (once; later calls return the same
    folder). Returns the heartbeat folder."""
    global _beacon
    folder = Path(run_dir) / "heartbeat"
    with _LOCK:
        if _beacon is None or _beacon.folder != folder:
            if _beacon is not None:
                _beacon.stop()
            _beacon = _Beacon(folder)
        return _beacon.folder


def stop() -> None:
    """Stop this process's beacon (its snapshot file stays, and ages)."""
    global _beacon
    with _LOCK:
        if _beacon is not None:
            _beacon.stop()
            _beacon = None


def reset() -> None:
    """Forget every service (a new run in this process, or a test)."""
    with _LOCK:
        _SERVICES.clear()


class _Beacon:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        key = process_key(socket.gethostname(), os.getpid())
        self.path = folder / f"{key}.json"
        self.stacks = (folder / f"stacks-{key}.txt").open("a", encoding="utf-8")
        # a C handler (any thread may install it); another's handler, if any, runs after it
        before = signal.getsignal(STACK_SIGNAL)
        chain = before not in (signal.SIG_DFL, signal.SIG_IGN, None)
        faulthandler.register(STACK_SIGNAL, file=self.stacks, all_threads=True, chain=chain)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._write()
        self._thread.start()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot()))
        os.replace(tmp, self.path)  # a reader never sees half a snapshot

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._write()
            except OSError as e:  # the run folder went away: the run is over for this process
                print(f"heartbeat: cannot write {self.path}: {e}; beacon stopped", flush=True)
                return

    def stop(self) -> None:
        self._stop.set()


def dump_own_stacks(file: Any) -> None:
    """This process's threads' Python stacks, to `file` (an open text file)."""
    faulthandler.dump_traceback(file=file, all_threads=True)
