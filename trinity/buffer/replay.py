"""Experience replay: a storage hands experiences out by priority and reuses them.

    buffer.trainer_input.experience_buffer:
      storage_type: sql          # or queue: its experiences then live in the sql storage's file
      replay_buffer: {enable: true, priority_fn: decay_limit_randomization,
                      priority_fn_args: {use_count_limit: 2}, reuse_cooldown_time: 0}

Trinity-RFT's replay (`AsyncPriorityQueue`) with its names and priorities, made durable. Every
group of experiences (one task's samples of one explore step, `EID.group`) has a priority
`priority_fn(model_version, use_count)`; a read takes the highest-priority rows that are ready,
ties in write order. A read of a group that the priority function puts back writes a *replay
copy* of it in the read's transaction: `use_count + 1`, its own priority, ready
`reuse_cooldown_time` s after the read (0: at once; None, Trinity-RFT's default: never, so the
storage only orders reads by priority). So priorities, use counts and cooldowns are rows of the
storage: they survive a restart and are shared by every process on the database.

How it departs from Trinity-RFT's queue, and why:
- A copy belongs to the lease that read its original. A trainer that restarts from a checkpoint
  hands its unacked leases out again and deletes their copies (`SQLStore.reader_started`): the
  resumed run replays exactly what the checkpoint had trained, no copy counted twice.
- `reuse_cooldown_time: None` keeps Trinity-RFT's meaning, "never reused" (its examples and
  benchmark templates enable replay without a cooldown: they must train as they did there), but
  `validate` and `run` say so in a note instead of reusing nothing silently.
- `max_staleness` (ours): a copy whose weights are more than that many versions behind the
  newest experience written is dropped instead of trained (counted `replay_stale`).
- Capacity counts fresh experiences only: a write never waits for replay copies; when the
  pending rows exceed `capacity`, the lowest-priority copies are evicted (`replay_evicted`).
- Once writing has ended, no copies are made and cooldowns are not waited for: a draining
  trainer reads what is pending, then sees the end.

Priority functions are pure: `fn(model_version, use_count, noise) -> (priority, put_back)`;
`noise` is a standard normal drawn from a generator seeded by the group's key and use count, so
a priority is reproducible (a resumed run and a peer process compute the same one).
"""

from __future__ import annotations

import hashlib
import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trinity.common.registry import Registry

PriorityFn = Callable[..., tuple[float, bool]]
PRIORITY_FN: Registry[PriorityFn] = Registry("priority_fn")


@PRIORITY_FN.register("linear_decay")
def linear_decay(
    model_version: int, use_count: int, noise: float, decay: float = 2.0
) -> tuple[float, bool]:
    """Trinity-RFT's `linear_decay`: priority = model_version - decay * use_count; always put
    back (newer and less used first, reused without limit)."""
    return float(model_version - decay * use_count), True


@PRIORITY_FN.register("decay_limit_randomization")
def decay_limit_randomization(
    model_version: int,
    use_count: int,
    noise: float,
    decay: float = 2.0,
    use_count_limit: int = 3,
    sigma: float = 0.0,
) -> tuple[float, bool]:
    """Trinity-RFT's `decay_limit_randomization`: priority = model_version - decay * use_count
    + sigma * N(0, 1); put back only while use_count < use_count_limit (a limit <= 0: always)."""
    priority = float(model_version - decay * use_count) + sigma * noise
    return priority, use_count < use_count_limit if use_count_limit > 0 else True


def priority_args_problem(name: str, args: dict[str, Any]) -> str | None:
    """Why `args` do not fit priority function `name` (an unknown name or argument), or None."""
    try:
        fn = PRIORITY_FN.get(name)
    except KeyError as e:
        return str(e)
    accepted = list(inspect.signature(fn).parameters)[3:]
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        return (
            f"{name} takes {', '.join(accepted) or 'no arguments'}; unknown: {', '.join(unknown)}"
        )
    return None


@dataclass(frozen=True)
class ReplaySpec:
    """A storage's replay settings (from `replay_buffer`; `ReplaySpec.of(config)`)."""

    priority_fn: str = "linear_decay"
    priority_fn_args: dict[str, Any] = field(default_factory=dict)
    reuse_cooldown_time: float | None = None
    max_staleness: int | None = None

    @classmethod
    def of(cls, replay_buffer: Any) -> ReplaySpec | None:
        """The spec of a `replay_buffer` config section; None when replay is off."""
        if replay_buffer is None or not replay_buffer.enable:
            return None
        return cls(
            replay_buffer.priority_fn,
            dict(replay_buffer.priority_fn_args),
            replay_buffer.reuse_cooldown_time,
            replay_buffer.max_staleness,
        )

    @property
    def reuses(self) -> bool:
        """Are experiences reused at all (a cooldown is set; None: Trinity-RFT's "never")?"""
        return self.reuse_cooldown_time is not None

    def priority(self, model_version: int, use_count: int, group: str) -> tuple[float, bool]:
        """(priority, put back after a read) of a group at `use_count`."""
        fn = PRIORITY_FN.get(self.priority_fn)
        return fn(model_version, use_count, group_noise(group, use_count), **self.priority_fn_args)


def group_key(eid: Any) -> str:
    """A group's key as stored: its explore step, task and taskset suffix."""
    batch, task, suffix = eid.group
    return f"{batch}/{task}/{suffix}"


def group_noise(group: str, use_count: int) -> float:
    """A standard normal draw fixed by the group and its use count (module doc)."""
    seed = int.from_bytes(hashlib.blake2b(f"{group}#{use_count}".encode(), digest_size=8).digest())
    return random.Random(seed).gauss(0.0, 1.0)


def replay_metrics(experiences: list[Any]) -> dict[str, float]:
    """A train batch's reuse: `replay/reused` (experiences read before), `replay/use_count_mean`
    and `replay/use_count_max`; empty for a batch of a storage without replay."""
    uses = [e.info["use_count"] for e in experiences if "use_count" in e.info]
    if not uses:
        return {}
    return {
        "replay/reused": float(sum(u > 0 for u in uses)),
        "replay/use_count_mean": sum(uses) / len(uses),
        "replay/use_count_max": float(max(uses)),
    }
