"""Calling a reward fn so that it cannot freeze training: bounded, checked and counted.

    scores = await score_responses(task, "math_reward", responses)   # in a workflow's run
    scores = score_responses_sync(task, "math_reward", responses)    # in a `run_sync`
    with reward_log() as log: ...; log.metrics("rollout/")           # in the explorer, per step

Every call of a reward fn in a workflow goes through `score_responses`, under the limits its
taskset sets in `reward_fn_args` (`limits.py`: `timeout`, `sandbox`, `cpu_seconds`,
`memory_mb`). A call fails when it takes longer than its timeout (or its CPU time), raises, or
returns a component that is not a finite number (NaN or infinity); the first failed call of a
task's try raises `RewardFailed` naming the task, so the workflow's try fails and the explorer's
policy applies: tried again up to `explorer.max_retry_times`, then dropped and counted
(`rollout/failed_tasks`; an eval task dropped counts as its `n` wrong samples). A failed
reward is never a reward of 0.

Each call is recorded in the step's `RewardLog` (a context variable the explorer sets around a
step or an evaluation; the workflows' tasks inherit it): its seconds and, when it failed, the
kind and the task's id (`<taskset>#<index>`). `RewardLog.metrics` gives the step's
`reward_time_p50` / `reward_time_p99` (seconds; linear interpolation between closest ranks,
numpy's default), `reward_calls`, `reward_timeouts`, `reward_errors`, `reward_nans`, and
`reward_failed_tasks` ({kind: sorted task ids}, only when a call failed).

In the explorer's process (`sandbox: none`) a sync fn runs on a thread of its own per call, so a
call that hangs holds only that thread, never the event loop or a shared executor; an async fn
is awaited with the timeout on the explorer's loop (one that blocks without awaiting holds the
loop: write it as a sync fn, or sandbox it). In the sandbox (`sandbox.py`) the call runs in a worker process that
a timeout kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trinity.common import heartbeat
from trinity.rewards.base import REWARD_FN
from trinity.rewards.limits import RewardLimits

FAILURE_KINDS = ("timeout", "error", "nan")
_METRIC = {"timeout": "reward_timeouts", "error": "reward_errors", "nan": "reward_nans"}


class RewardFailed(RuntimeError):
    """A reward fn call that gave no usable score: `kind` is timeout, error or nan."""

    def __init__(self, kind: str, task_id: str, detail: str) -> None:
        super().__init__(f"reward fn failed ({kind}) on task {task_id}: {detail}")
        self.kind, self.task_id, self.detail = kind, task_id, detail


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` by linear interpolation between closest ranks (numpy's
    default): position q * (n - 1) in the sorted values."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class RewardLog:
    """The reward fn calls of one step (or evaluation): seconds each, failures with task ids."""

    seconds: list[float] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (kind, task id)

    def record(self, seconds: float, kind: str | None = None, task_id: str = "") -> None:
        self.seconds.append(seconds)
        if kind is not None:
            self.failures.append((kind, task_id))

    def failed_tasks(self) -> dict[str, list[str]]:
        """{kind: sorted distinct task ids} of the failed calls."""
        out: dict[str, set[str]] = {}
        for kind, task in self.failures:
            out.setdefault(kind, set()).add(task)
        return {k: sorted(v) for k, v in out.items()}

    def metrics(self, prefix: str) -> dict[str, Any]:
        """`<prefix>reward_*` (module docstring); nothing when no reward fn was called."""
        if not self.seconds:
            return {}
        out: dict[str, Any] = {
            f"{prefix}reward_calls": float(len(self.seconds)),
            f"{prefix}reward_time_p50": quantile(self.seconds, 0.5),
            f"{prefix}reward_time_p99": quantile(self.seconds, 0.99),
        }
        for kind, key in _METRIC.items():
            out[f"{prefix}{key}"] = float(sum(1 for k, _ in self.failures if k == kind))
        if self.failures:
            out[f"{prefix}reward_failed_tasks"] = self.failed_tasks()
        return out

    def summary(self) -> str | None:
        """One log line naming the failed calls' kinds and tasks; None when none failed."""
        if not self.failures:
            return None
        counts = {k: sum(1 for f, _ in self.failures if f == k) for k in FAILURE_KINDS}
        tasks = self.failed_tasks()
        parts = [
            f"{counts[k]} {k}{'s' if counts[k] > 1 else ''} (tasks {', '.join(tasks[k])})"
            for k in FAILURE_KINDS
            if counts[k]
        ]
        return "reward fn failures: " + "; ".join(parts)


_LOG: contextvars.ContextVar[RewardLog | None] = contextvars.ContextVar("reward_log", default=None)


@contextlib.contextmanager
def reward_log(log: RewardLog | None = None) -> Iterator[RewardLog]:
    """Record the reward calls made in this context (and in the tasks it starts) in `log`
    (default: a fresh one)."""
    log = RewardLog() if log is None else log
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def task_id(task: Any) -> str:
    """A task's id in logs and metrics: `<taskset>#<index>`."""
    return f"{getattr(task, 'taskset_name', '') or 'taskset'}#{getattr(task, 'index', '?')}"


async def score_responses(
    task: Any,
    name: str,
    responses: list[str],
    kwargs: dict[str, Any] | None = None,
) -> list[dict[str, float]]:
    """The reward fn `name`'s components for each response of `task`, in order, each call
    under the task's limits (`task.reward_limits`); `kwargs`: the fn's keyword arguments
    (default: the taskset's `reward_fn_args`). Raises RewardFailed at the first failed call."""
    limits: RewardLimits = getattr(task, "reward_limits", None) or RewardLimits()
    kwargs = dict(task.reward_fn_args) if kwargs is None else kwargs
    fn = REWARD_FN.get(name)  # an unknown name fails here, in the explorer, with the valid names
    log, tid = _LOG.get(), task_id(task)
    out = []
    for response in responses:
        with heartbeat.waiting_here(f"reward_fn {name!r}", f"task {tid}"):
            kind, detail, seconds, result = await _call(fn, name, limits, task, response, kwargs)
        if kind is None:
            kind, detail, result = _checked(result)
        if log is not None:
            log.record(seconds, kind, tid)
        if kind is not None:
            raise RewardFailed(kind, tid, f"reward fn {name!r}: {detail}")
        out.append(result)
    return out


def score_responses_sync(
    task: Any, name: str, responses: list[str], kwargs: dict[str, Any] | None = None
) -> list[dict[str, float]]:
    """`score_responses` for a blocking workflow (`SyncWorkflow.run_sync`, on its worker
    thread): the calls run on an event loop of this thread's own."""
    return asyncio.run(score_responses(task, name, responses, kwargs))


async def _call(
    fn: Callable[..., Any],
    name: str,
    limits: RewardLimits,
    task: Any,
    response: str,
    kwargs: dict[str, Any],
) -> tuple[str | None, str, float, Any]:
    """One call: (failure kind or None, detail, seconds, result)."""
    timeout = limits.timeout
    if limits.sandbox == "subprocess":
        from trinity.rewards.sandbox import SandboxFailure, sandbox_pool

        try:
            result, seconds = await sandbox_pool(limits).call(
                name, response, task.truth, task.raw, kwargs, timeout
            )
        except SandboxFailure as e:
            return e.kind, e.detail, e.seconds, None
        return None, "", seconds, result
    t0 = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(fn):
            result = await asyncio.wait_for(fn(response, task.truth, task.raw, **kwargs), timeout)
        else:
            call = lambda: fn(response, task.truth, task.raw, **kwargs)  # noqa: E731
            result = await asyncio.wait_for(_on_own_thread(call), timeout)
    except TimeoutError:
        return "timeout", f"took longer than timeout={timeout}s", time.perf_counter() - t0, None
    except Exception as e:
        detail = f"{type(e).__name__}: {e}"
        return "error", detail, time.perf_counter() - t0, None
    return None, "", time.perf_counter() - t0, result


def _on_own_thread(call: Callable[[], Any]) -> asyncio.Future:
    """`call()` on a daemon thread of its own; its result (or exception) as a future of the
    running loop. Cancelling the future abandons the thread, which ends when `call` does."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if done.done():
            return  # timed out or cancelled meanwhile
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            ok, value = True, context.run(call)
        except BaseException as e:  # handed to the awaiting coroutine, which raises it
            ok, value = False, e
        with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=run, name="reward-call", daemon=True).start()
    return done


def _checked(result: Any) -> tuple[str | None, str, Any]:
    """(failure kind or None, detail, components as floats) of a reward fn's return value."""
    if not isinstance(result, dict) or not result:
        return (
            "error",
            f"returned {type(result).__name__} {result!r:.200}, not a dict of components",
            None,
        )
    components: dict[str, float] = {}
    for key, value in result.items():
        try:
            components[str(key)] = float(value)
        except (TypeError, ValueError):
            return "error", f"component {key!r} is {value!r:.200}, not a number", None
    bad = sorted(k for k, v in components.items() if not math.isfinite(v))
    if bad:
        shown = ", ".join(f"{k}={components[k]}" for k in bad)
        return "nan", f"returned a component that is not a finite number: {shown}", None
    return None, "", components
