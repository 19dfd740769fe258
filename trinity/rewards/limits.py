"""How a reward fn is called: the keys of `reward_fn_args` that bound each call, not passed to it.

    buffer.explorer_input.taskset.reward_fn_args: {timeout: 10}                  # seconds per call
    buffer.explorer_input.taskset.reward_fn_args:
      {timeout: 10, sandbox: subprocess, cpu_seconds: 5, memory_mb: 512}        # code-running rewards

- `timeout`: wall-clock seconds one call may take (> 0; None = no bound of its own, the
  workflow's `explorer.max_timeout` still ends the try). A call past it fails as a timeout.
- `sandbox`: where a call runs. `none` (default): in the explorer's process, on a thread of its
  own (a call that times out there keeps running until it returns: Python cannot stop a thread);
  `subprocess`: in a pool of worker processes (`sandbox.py`), where a call past its timeout or
  its CPU time is killed with its worker, which is replaced.
- `cpu_seconds`: CPU seconds one call may use in the sandbox (RLIMIT_CPU, whole seconds,
  rounded up); `memory_mb`: MiB of address space one call may add to its worker (RLIMIT_AS).
  Both need `sandbox: subprocess`.
- `sandbox_workers`: processes in the sandbox's pool (default: min(4, CPU count)).

The other keys are the reward fn's own keyword arguments. Trinity-RFT has no such keys (its
math rewards bound their own parsing); a reward fn that takes an argument of one of these names
cannot be given it here, which pre-flight says.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Real
from typing import Any

SANDBOXES = ("none", "subprocess")
LIMIT_KEYS = ("timeout", "sandbox", "cpu_seconds", "memory_mb", "sandbox_workers")
_NEEDS_SANDBOX = ("cpu_seconds", "memory_mb", "sandbox_workers")


@dataclass(frozen=True)
class RewardLimits:
    """The bounds on each call of a taskset's reward fn (module docstring)."""

    timeout: float | None = None
    sandbox: str = "none"
    cpu_seconds: int | None = None
    memory_mb: int | None = None
    sandbox_workers: int | None = None

    @property
    def workers(self) -> int:
        return self.sandbox_workers or max(1, min(4, os.cpu_count() or 1))


def limit_problems(args: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(key, what is wrong) for each bad limit key of `reward_fn_args`."""
    args = args or {}
    out: list[tuple[str, str]] = []

    def positive(key: str, integer: bool) -> None:
        v = args.get(key)
        if v is None:
            return
        kind = "an integer" if integer else "a number"
        number = not isinstance(v, bool) and isinstance(v, int if integer else Real)
        if not number or not math.isfinite(v) or v <= 0:
            out.append((key, f"must be {kind} > 0, got {v!r}"))

    positive("timeout", integer=False)
    positive("cpu_seconds", integer=False)
    positive("memory_mb", integer=True)
    positive("sandbox_workers", integer=True)
    sandbox = args.get("sandbox", "none")
    if sandbox not in SANDBOXES:
        out.append(("sandbox", f"unknown sandbox {sandbox!r}; valid: {', '.join(SANDBOXES)}"))
    elif sandbox != "subprocess":
        for key in _NEEDS_SANDBOX:
            if args.get(key) is not None:
                out.append((key, "applies in the sandbox only: set sandbox: subprocess"))
    return out


def split_reward_args(args: dict[str, Any] | None) -> tuple[dict[str, Any], RewardLimits]:
    """`reward_fn_args` as (the reward fn's own keyword arguments, the call's limits); a bad
    limit raises ValueError naming it (the config check reports it before a run)."""
    args = dict(args or {})
    if problems := limit_problems(args):
        raise ValueError("; ".join(f"reward_fn_args.{key}: {why}" for key, why in problems))
    limits = {k: args.pop(k) for k in LIMIT_KEYS if k in args}
    cpu = limits.get("cpu_seconds")
    if cpu is not None:
        limits["cpu_seconds"] = math.ceil(cpu)
    if limits.get("timeout") is not None:
        limits["timeout"] = float(limits["timeout"])
    return args, RewardLimits(**limits)
