"""When weights move from trainer to explorer (`synchronizer.sync_style`).

`sync_style: fixed` (the default) is an exact schedule, below. The dynamic styles keep its sync
points but not its versions (`explorer_sync`, `trainer_publishes_after`):

* `trainer_driven`: the trainer publishes every `sync_interval` steps; at each of its sync
  points the explorer takes the newest published weights if they are newer than its own and
  otherwise goes on, never waiting. (Upstream this differs from `fixed` only with nccl, where
  the trainer waits for the explorer's next sync point; here the trainer never waits.)
* `explorer_driven`: the explorer asks at each of its sync points; the trainer publishes its
  current weights when asked (after the step it is in, or at once while it waits for data),
  and only then. When the trainer has trained nothing newer than the explorer's weights, the
  explorer goes on with them (as upstream).

With `sync_interval = k` and `sync_offset = d` (all steps 1-indexed):

* the trainer publishes its weights after every train step `t` with `t % k == 0`;
* the explorer, after explore step `s` with `s > d` and `(s - d) % k == 0`, waits for and loads the
  weights of train step `s - d`;
* so explore step `s` samples with the weights of train step
  `version_for_explore_step(s) = max(0, floor((s - 1 - d) / k) * k)`.

`k = 1, d = 0` is strictly on-policy (explore step s uses the weights trained on steps < s);
`k = 1, d = 1` is one-step off-policy: the explorer produces step s+1 while the trainer trains s.

The synchronizer keeps only the versions a reader can still ask for (`versions_to_keep`).
"""

from __future__ import annotations


def _check(interval: int, offset: int) -> None:
    if interval < 1:
        raise ValueError(f"sync_interval must be >= 1, got {interval}")
    if offset < 0:
        raise ValueError(f"sync_offset must be >= 0, got {offset}")


def explorer_syncs_after(step: int, interval: int, offset: int) -> bool:
    """Does the explorer load new weights after explore step `step`?"""
    _check(interval, offset)
    return step > offset and (step - offset) % interval == 0


def weights_version_after_explore_step(step: int, interval: int, offset: int) -> int:
    """The train-step version the explorer loads after explore step `step` (when it syncs)."""
    _check(interval, offset)
    return step - offset


def trainer_publishes_after(step: int, interval: int, style: str = "fixed") -> bool:
    """Does the trainer publish its weights after train step `step` unasked?

    `explorer_driven`: never; it publishes when the explorer asks.
    """
    _check(interval, 0)
    return style != "explorer_driven" and step % interval == 0


def explorer_sync(style: str, trainer_in_run: bool) -> str:
    """How the explorer takes weights at its sync points (`Explorer.run`'s `sync`).

    "schedule": wait for exactly the version the fixed schedule names; "latest": the newest
    published, if newer, never waiting (trainer_driven, or a trainer in another process);
    "request": ask the trainer for its current weights (explorer_driven).
    """
    if style == "explorer_driven":
        return "request"
    if style == "trainer_driven" or not trainer_in_run:
        return "latest"
    if style != "fixed":
        raise ValueError(
            f"unknown sync_style {style!r}; valid: fixed, explorer_driven, trainer_driven"
        )
    return "schedule"


def version_for_explore_step(step: int, interval: int, offset: int) -> int:
    """Train-step version of the weights that explore step `step` samples with."""
    _check(interval, offset)
    return max(0, ((step - 1 - offset) // interval) * interval)


def admission_version(step: int, max_staleness: int | None) -> int:
    """The oldest weights explore step `step` may start with under `max_staleness` (None: any).

    Its experiences train step `step` (FIFO, one explore step per train step), whose weights are
    those of train step `step - 1`: staleness = `step - 1 - version` <= `max_staleness`.
    """
    if max_staleness is None:
        return 0
    return max(0, step - 1 - max_staleness)


def staleness_bound_problem(style: str, interval: int, max_staleness: int | None) -> str | None:
    """Why a bound can never be met (the explorer would wait forever), or None.

    When the trainer publishes every `interval` steps unasked (fixed, trainer_driven), explore step
    s needs a published multiple of `interval` in [s - 1 - N, s - 1] (the trainer cannot pass
    s - 1 before step s's experiences exist): N >= interval - 1. explorer_driven publishes any
    step on request: any N >= 0 works.
    """
    if max_staleness is None or style == "explorer_driven" or max_staleness >= interval - 1:
        return None
    return (
        f"max_staleness {max_staleness} < sync_interval - 1 = {interval - 1}: with sync_style "
        f"{style} the trainer publishes every {interval} steps, so the explorer would wait for "
        f"weights it cannot get"
    )


def versions_to_keep(interval: int, offset: int, explorer_syncs: bool, style: str = "fixed") -> int:
    """How many published versions the synchronizer must hold, newest first.

    The trainer's step t needs the experiences of explore step t, before which the explorer asked
    for version a = the last multiple of k not above t - 1 - d (a > t - 1 - d - k). It never asks
    for anything older again, so the versions it can still want are the multiples of k in (a, t]:
    at most d // k + 1. (The trainer's final publish comes after the explorer has finished.)
    With no exploring reader (mode train, or explore without a trainer) only the newest version
    can be asked for (the final evaluation): 1. A dynamic style takes the newest: 2, so a
    version an engine is loading survives one more publish.
    """
    _check(interval, offset)
    if style != "fixed":
        return 2
    return offset // interval + 1 if explorer_syncs else 1
