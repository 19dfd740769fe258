"""When weights move from trainer to explorer (`synchronizer.sync_style: fixed`).

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


def trainer_publishes_after(step: int, interval: int) -> bool:
    """Does the trainer publish its weights after train step `step`?"""
    _check(interval, 0)
    return step % interval == 0


def version_for_explore_step(step: int, interval: int, offset: int) -> int:
    """Train-step version of the weights that explore step `step` samples with."""
    _check(interval, offset)
    return max(0, ((step - 1 - offset) // interval) * interval)


def versions_to_keep(interval: int, offset: int, explorer_syncs: bool) -> int:
    """How many published versions the synchronizer must hold, newest first.

    The trainer's step t needs the experiences of explore step t, before which the explorer asked
    for version a = the last multiple of k not above t - 1 - d (a > t - 1 - d - k). It never asks
    for anything older again, so the versions it can still want are the multiples of k in (a, t]:
    at most d // k + 1. (The trainer's final publish comes after the explorer has finished.)
    With no exploring reader (mode train, or explore without a trainer) only the newest version
    can be asked for (the final evaluation): 1.
    """
    _check(interval, offset)
    return offset // interval + 1 if explorer_syncs else 1
