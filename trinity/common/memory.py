"""Memory of this process and of a process tree, as the metrics report it (Linux /proc).

- `PeakRss`: the peak resident set size of THIS process over a span (one train step). Linux keeps
  a high-water mark, `VmHWM` in /proc/self/status; writing "5" to /proc/self/clear_refs resets
  it to the current RSS (Linux ≥ 4.0), so `reset()` at the start of a step and `peak_bytes()` at
  its end give that step's own peak, transients included (not a sample). Before the first reset,
  or where the reset is not allowed, the mark covers the process life so far (`resettable` says
  which); without /proc it falls back to `getrusage`'s ru_maxrss (life-long as well). The reset
  is process-wide: one `PeakRss` user per process (the trainer).
- `tree_pss_bytes(pid)`: the proportional set size of a process and all its descendants (shared
  pages divided among the processes that map them, so the sum is the tree's real footprint;
  from /proc/<pid>/smaps_rollup). A Ray run's driver, raylet, GCS and actor workers are all
  descendants of the driver when it started Ray itself.
"""

from __future__ import annotations

import re
import resource
from pathlib import Path
from typing import Any

GB = 1024**3


def _status_kb(field: str, pid: int | str = "self") -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def rss_bytes() -> int | None:
    """Current RSS of this process (None without /proc)."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb * 1024


class PeakRss:
    """Peak RSS of this process since the last `reset()` (module docstring)."""

    def __init__(self) -> None:
        self.resettable: bool | None = None  # known after the first `reset()`

    def reset(self) -> bool:
        """Reset the kernel's high-water mark to the current RSS; False when not allowed."""
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.resettable = True
        except OSError:
            self.resettable = False
        return self.resettable

    def peak_bytes(self) -> int:
        kb = _status_kb("VmHWM")
        if kb is None:  # no /proc: ru_maxrss is in kB on Linux, life-long
            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb * 1024


def _pss_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # exited, or not ours to read
        return 0
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else 0


def _children() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/<pid>/stat."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        out.setdefault(ppid, []).append(int(d.name))
    return out


def tree_pids(root_pid: int) -> list[int]:
    """`root_pid` and all its descendants."""
    children, pids, todo = _children(), [], [root_pid]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    return pids


def tree_pss_bytes(root_pid: int) -> int:
    """PSS of `root_pid` and every descendant (0 for processes gone while reading)."""
    return sum(_pss_bytes(pid) for pid in tree_pids(root_pid))


def process_label(pid: int) -> str:
    """What a process of a run is, from its command line: a Ray actor's title (`ray::Explorer`,
    Ray sets it to the actor's class), a Ray service (`raylet`, `gcs_server`, ...), or the
    program's base name ('' for a process gone while reading)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return ""
    if words[0].startswith("ray::"):  # an actor or worker's process title
        return words[0].split()[0]
    prog = words[0].rsplit("/", 1)[-1]
    if prog.startswith("python"):  # `python [-u] -m x` or `python [-u] path/to/x[.py]`
        args = iter(words[1:])
        for arg in args:
            if arg == "-m":
                return next(args, prog)
            if not arg.startswith("-"):
                return arg.rsplit("/", 1)[-1].removesuffix(".py")
    return prog


def tree_pss_by_process(root_pid: int) -> dict[int, tuple[str, int]]:
    """pid -> (label, PSS bytes) for `root_pid` and every descendant alive while reading."""
    out = {}
    for pid in tree_pids(root_pid):
        label, pss = process_label(pid), _pss_bytes(pid)
        if label:
            out[pid] = (label, pss)
    return out


class TreePssSampler:
    """The peak of `tree_pss_bytes(root_pid)` sampled every `interval` s in a daemon thread,
    from `start()` to `stop()` (a sample, so a spike shorter than the interval can be missed)."""

    def __init__(self, root_pid: int, interval: float = 2.0) -> None:
        import threading

        self.root_pid, self.interval = root_pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-pss", daemon=True)

    def _loop(self) -> None:
        while True:
            self.peak = max(self.peak, tree_pss_bytes(self.root_pid))
            if self._stop.wait(self.interval):
                return

    def start(self) -> TreePssSampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop (after one last sample) and return the peak in bytes."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss_bytes(self.root_pid))
        return self.peak


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc `malloc_trim(0)`; a no-op elsewhere).
    glibc keeps freed blocks below its mmap threshold (which grows up to 32 MB as large blocks
    are freed) in the process, so after a train step's transients the RSS stays at the step's
    peak; trimming returns them, so the other processes of the run (the explorer) can use them."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_MAX = 32 * 1024**2  # glibc's upper bound on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def _glibc() -> Any | None:
    """The C library when it is glibc (its `mallopt` parameters are glibc's), else None."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def can_set_mmap_threshold() -> bool:
    """Whether `set_mmap_threshold` can act in this process (glibc's malloc)."""
    return _glibc() is not None


def set_mmap_threshold(nbytes: int) -> None:
    """Fix glibc's mmap threshold at `nbytes`: every allocation of at least that size gets pages
    of its own from the kernel and gives them back when freed (glibc `mallopt(M_MMAP_THRESHOLD)`,
    which also turns off glibc's dynamic threshold).

    glibc starts the threshold at 128 KiB and raises it to the size of each mmapped block that is
    freed, up to 32 MiB, so after a train step's first activations and gradients are freed, every
    later tensor below 32 MiB comes from the heap, whose freed holes do not fit the next pattern
    of sizes: a step's peak RSS grows past what its tensors need. A fixed threshold (1 MiB in
    the SmolLM2 example) keeps the step's peak near what its tensors need, and each large
    allocation then costs its page faults again, so steps run longer (both measured in
    docs/real_model.md)."""
    libc = _glibc()
    if libc is None:
        raise RuntimeError("the mmap threshold is glibc's (Linux); this C library has none")
    if not 0 < nbytes <= MMAP_THRESHOLD_MAX:
        raise ValueError(f"mmap threshold {nbytes} bytes: must be in (0, {MMAP_THRESHOLD_MAX}]")
    if libc.mallopt(M_MMAP_THRESHOLD, nbytes) != 1:
        raise RuntimeError(f"glibc refused mallopt(M_MMAP_THRESHOLD, {nbytes})")


class IdleTrim:
    """Trim the C heap (`release_free_heap`) once a process has been idle for `idle_s` seconds
    after some work, from a daemon thread: `with trim.busy(): ...` marks the work.

    For the rollout engine: its decode loop grows the KV cache by one token per step
    (`DynamicCache` concatenates), so every step allocates new blocks and frees the old ones,
    and glibc keeps the freed heap: on a cache shaped like the SmolLM2 example's the engine's
    resident memory grew several-fold within two batches, and one trim gave all of it back. A
    trim of that heap is not free, so trimming after every call would put its cost on each; an idle
    engine (while the trainer steps, in an on-policy run) gives that memory back once instead.
    The trainer likewise, after its steps' transients: a trainer that waits for its next batch
    (while the engines generate) gives them back; one whose batches are ready steps on without
    the trim and the page faults that would follow it, a sizeable part of a tiny model's step
    (docs/benchmarks.md, "Measurements moved out of module docstrings").
    `malloc_trim` is thread-safe (it takes the arena locks), so the trim may overlap a call that
    starts meanwhile."""

    def __init__(self, idle_s: float = 1.0) -> None:
        import threading

        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._active, self._dirty, self._last = 0, False, 0.0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="idle-trim", daemon=True)
        self._thread.start()

    def busy(self) -> _Busy:
        return _Busy(self)

    def close(self) -> None:
        """Stop the trim thread (its owner is done)."""
        self._closed.set()

    def _loop(self) -> None:
        import time

        while not self._closed.wait(self.idle_s / 2):
            with self._lock:
                due = self._dirty and not self._active
                due = due and time.monotonic() - self._last >= self.idle_s
                if due:
                    self._dirty = False
            if due:
                release_free_heap()


class _Busy:
    def __init__(self, owner: IdleTrim) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        with self.owner._lock:
            self.owner._active += 1

    def __exit__(self, *exc: object) -> None:
        import time

        with self.owner._lock:
            self.owner._active -= 1
            self.owner._dirty, self.owner._last = True, time.monotonic()
