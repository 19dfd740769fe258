"""Which run folders may still get a newly sealed checkpoint (`trainer.checkpoint`).

A run that stops names its newest checkpoint as the one to continue from. When its trainer is a
Ray actor, the run kills it first; when the trainer is a thread of this process
(`common.local_host`), nothing can end the thread at once, so the run stops sealing in its folder
instead, and the name it prints stays the newest. The trainer's next save then raises
`CheckpointsStopped`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_SEALING = threading.Lock()  # held while a checkpoint takes its final name
_STOPPED: set[Path] = set()  # folders in which no checkpoint may be sealed any more


class CheckpointsStopped(RuntimeError):
    """A checkpoint was to be sealed in the folder of a run that stopped (`stop_sealing`)."""


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def stop_sealing(root: Path) -> None:
    """Seal no more checkpoints under `root`, once any being sealed now is."""
    with _SEALING:
        _STOPPED.add(root.resolve())


def allow_sealing(root: Path) -> None:
    """Undo `stop_sealing` for `root` and the folders in it: a new run starts there in this
    process."""
    here = root.resolve()
    with _SEALING:
        _STOPPED.difference_update({r for r in _STOPPED if _under(r, here)})


@contextmanager
def sealing(root: Path) -> Iterator[None]:
    """Hold while a checkpoint in `root` takes its final name; raises `CheckpointsStopped` if
    the run that writes it stopped."""
    with _SEALING:
        here = root.resolve()
        if any(_under(here, r) for r in _STOPPED):
            raise CheckpointsStopped(f"the run stopped: no checkpoint is sealed in {root} any more")
        yield
