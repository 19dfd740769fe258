"""One worker process of the reward sandbox (`sandbox.py` starts it): `python -m` this module.

Protocol (frames: an 8-byte big-endian length, then a pickle), over the worker's stdin/stdout:
1. the parent sends {"cpu_seconds", "memory_mb"}; the worker imports the reward registry, then
   answers ("ready", pid) (it finds trinity and the user's modules on the parent's sys.path,
   which the parent passes as PYTHONPATH);
2. per call the parent sends (reward fn name, response, truth, task_raw, kwargs); the worker
   answers ("ok", result), ("error", traceback) or ("memory", traceback) and, after a
   MemoryError, exits (its parent replaces it).

Each call runs under its own limits: RLIMIT_CPU's soft limit at the CPU time used so far plus
`cpu_seconds` (the kernel sends SIGXCPU, which ends the process), RLIMIT_AS at the address space
before the call plus `memory_mb` MiB (an allocation past it raises MemoryError); both lifted
again after the call. The worker's own stdout is its stderr (a reward's prints cannot break the
protocol), and it dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import resource
import signal
import traceback
from typing import IO, Any

_HEADER = 8


def write_frame(out: IO[bytes], obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(len(body).to_bytes(_HEADER, "big") + body)
    out.flush()


def read_exact(inp: IO[bytes], n: int) -> bytes:
    """`n` bytes of `inp`; EOFError when it ends first."""
    chunks, got = [], 0
    while got < n:
        chunk = inp.read(n - got)
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(inp: IO[bytes]) -> Any:
    size = int.from_bytes(read_exact(inp, _HEADER), "big")
    return pickle.loads(read_exact(inp, size))


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the request
        os._exit(0)


def _address_space() -> int:
    """Bytes of address space this process holds now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _cpu_used() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Limits:
    """Per-call RLIMIT_CPU / RLIMIT_AS (module docstring)."""

    def __init__(self, cpu_seconds: int | None, memory_mb: int | None) -> None:
        self.cpu_seconds, self.memory_mb = cpu_seconds, memory_mb
        self.cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        self.as_hard = resource.getrlimit(resource.RLIMIT_AS)[1]

    def __enter__(self) -> None:
        if self.cpu_seconds is not None:
            soft = int(_cpu_used()) + 1 + self.cpu_seconds  # whole seconds, never below use
            resource.setrlimit(resource.RLIMIT_CPU, (soft, self.cpu_hard))
        if self.memory_mb is not None:
            soft = _address_space() + self.memory_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (soft, self.as_hard))

    def __exit__(self, *exc: object) -> None:
        if self.memory_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (self.as_hard, self.as_hard))
        if self.cpu_seconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_hard, self.cpu_hard))


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a reward's prints go to stderr, never into the protocol
    inp = os.fdopen(os.dup(0), "rb")
    _die_with_parent()
    init = read_frame(inp)
    from trinity.rewards import REWARD_FN

    limits = _Limits(init["cpu_seconds"], init["memory_mb"])
    fns: dict[str, Any] = {}
    write_frame(out, ("ready", os.getpid()))
    while True:
        try:
            name, response, truth, raw, kwargs = read_frame(inp)
        except EOFError:
            return  # the parent closed the pool
        try:
            fn = fns.get(name) or fns.setdefault(name, REWARD_FN.get(name))
            with limits:
                result = fn(response, truth, raw, **kwargs)
                if inspect.isawaitable(result):
                    result = asyncio.run(_wait(result))
        except MemoryError:
            write_frame(out, ("memory", traceback.format_exc()))
            os._exit(3)
        except Exception:
            write_frame(out, ("error", traceback.format_exc()))
        else:
            try:
                write_frame(out, ("ok", result))
            except Exception:  # the result does not pickle: nothing was written yet
                write_frame(out, ("error", traceback.format_exc()))


async def _wait(awaitable: Any) -> Any:
    return await awaitable


if __name__ == "__main__":
    main()
