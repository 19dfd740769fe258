"""Cores lent between a process's compute threads while one of them idles.

    part = core_shares().join(threads=1)   # a compute thread's own part of the cores
    with part.active():                    # a batch or a train step: the part is in use
        part.follow()                      # on the part's own thread, at safe points: the torch
        ...                                # threads it may use now (its own + idle parts')
    hooks = follow_hooks(model, part)      # `follow` before each decoder layer, both passes

Where a `cluster.one_process` run's explorer and trainer overlap (one-step-off, async), each
computes on a thread of its own with its part of the cores (one torch thread each on 2 cores,
`common.compute`). The two sides' work is unequal: an engine batch ends well before a train
step, so without lending the engine's core idles for the rest of every step. A part that is not
`active` lends its threads to the active ones: the trainer runs
its remaining layers on two threads once the engine's batch is done, and the engine its first
batch on two while the trainer waits for data. A thread follows its count at its own safe points
(each decode step; each decoder layer's forward and backward), so for at most one layer the
process runs one thread more than it has cores.

Lending is on only where it cannot change a result (`lending_is_reproducible`). Which thread
count an op ran with depends on timing, and with MKL's default code paths gradients depend on
the thread count: on the 10M model 57 of 98 parameter gradients differed in their last bits
between one and two threads. Under MKL's strict conditional numerical reproducibility
(`MKL_CBWR=AUTO,STRICT`, which a one-process run's driver sets for its Ray instance unless the
environment already sets MKL_CBWR) all 98 were bitwise equal, the logits too, at the same speed
(docs/benchmarks.md, "Lean decode, reports as they come, lent cores"). Without it (another
BLAS, a cluster started elsewhere) each part keeps its own threads.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trinity.common.compute import per_process

REPRODUCIBLE_MKL = "AUTO,STRICT"  # MKL_CBWR's value that makes results independent of threads


def lending_is_reproducible() -> bool:
    """Whether results are the same whatever the thread count: torch computes with MKL and
    MKL_CBWR asks MKL for strict reproducibility."""
    import torch

    strict = "STRICT" in os.environ.get("MKL_CBWR", "").upper()
    return strict and torch.backends.mkl.is_available()


class CorePart:
    """One compute thread's part of its process's cores (`CoreShares.join`)."""

    def __init__(self, shares: CoreShares, threads: int) -> None:
        self.shares = shares
        self.threads = max(1, threads)
        self.busy = False
        self._current: int | None = None  # what this part's thread last set

    @contextmanager
    def active(self) -> Iterator[None]:
        """The part is in use (its threads are not lent) for the block."""
        with self.shares.lock:
            self.busy = True
        try:
            yield
        finally:
            with self.shares.lock:
                self.busy = False

    def now(self) -> int:
        """The threads this part may use now: its own and those of every part not active."""
        return self.shares.threads_for(self)

    def follow(self) -> None:
        """Set the calling thread's torch thread count to `now()` (torch's count is per thread
        under OpenMP: call it on the thread that computes)."""
        n = self.now()
        if n != self._current:
            import torch

            torch.set_num_threads(n)
            self._current = n


class CoreShares:
    """The parts of one process's cores held by its compute threads."""

    def __init__(self, lend: bool | None = None) -> None:
        """`lend`: lend idle parts' threads (default: where `lending_is_reproducible`)."""
        self.lock = threading.Lock()
        # held weakly: a part ends with its owner (an engine or trainer of a finished stage),
        # and must not lend threads nobody gave back
        self.parts: weakref.WeakSet[CorePart] = weakref.WeakSet()
        self._lend = lend

    def lends(self) -> bool:
        if self._lend is None:
            self._lend = lending_is_reproducible()
        return self._lend

    def join(self, threads: int) -> CorePart:
        part = CorePart(self, threads)
        with self.lock:
            self.parts.add(part)
        return part

    def leave(self, part: CorePart) -> None:
        with self.lock:
            self.parts.discard(part)

    def threads_for(self, part: CorePart) -> int:
        if not self.lends():
            return part.threads
        with self.lock:
            return part.threads + sum(p.threads for p in self.parts if p is not part and not p.busy)


core_shares = per_process(CoreShares)
"""This process's core shares (one per process)."""


def follow_hooks(model: Any, part: CorePart) -> list[Any]:
    """Make `part` follow its count before each decoder layer runs, in the forward pass and,
    through a hook on the layer's output, in the backward pass. Returns the hook handles.
    A model without `get_decoder().layers` follows at its own call only."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = list(getattr(decoder, "layers", None) or [model])

    def before(_module: Any, _args: Any) -> None:
        part.follow()

    def after(_module: Any, _args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if getattr(out, "requires_grad", False):
            out.register_hook(lambda _grad: part.follow())

    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(before))
        handles.append(layer.register_forward_hook(after))
    return handles
