"""The weight-sync contract: how weights travel from the trainer to the rollout engines.

    synchronizer: {sync_method: memory}     # or checkpoint, nccl (a collective broadcast), shared

A method is two halves and a clean-up, registered in `SYNC_METHOD` by its `sync_method` name:

* `send` (trainer half): turn the trainer's weights into a small picklable payload that the
  synchronizer holds for the explorer (an object-store reference, a file path, ...);
* `receive` (engine half): turn that payload back into a name -> tensor dict in the engine;
* `discard` (synchronizer): release what a payload holds once no explorer can still ask for it.

The synchronizer and the explorer only pass payloads along; neither knows how a method works.
Every method's payload also carries the weights' fingerprint, checked on receipt
(`fingerprint.py`).
A new transport is one new module in `sync/` and a line in `SYNC_METHOD`'s `modules`
(`collective.py`, the `nccl` method, was added that way).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trinity.common.registry import Registry
from trinity.common.rollout import Peers

if TYPE_CHECKING:  # the synchronizer's process passes payloads and never needs torch
    import torch


@runtime_checkable
class SyncMethod(Protocol):
    hands_over: bool
    """True when the tensors `receive` returns are never written by the transport again (an
    immutable object, a file read into fresh tensors): the engine keeps them as its parameters
    (`load_weights(take=True)`), holding one copy of the weights. False: the transport reuses
    them (the next receive's buffers), and the engine copies out of them."""
    live: bool
    """True when the engines' parameters are the trainer's own (`shared`): they change as the
    trainer steps, so the explorer finishes all sampling of a step, its evaluation included,
    before it writes the step's experiences (which is what lets the trainer start). False: an
    engine holds the snapshot it received."""

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        """Trainer half: publish `state` (the trainer's weights of `version`) as a payload."""
        ...

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        """Engine half: the weights a payload stands for, as tensors the engine copies from or,
        when `hands_over`, keeps as its parameters (it never writes them): they may be read-only
        views of the transport's buffers, valid while referenced.

        `peers`: this engine's place among the engines that load the payload in the same call (a
        collective method needs it; the others ignore it). None: an engine loading on its own.
        """
        ...

    def discard(self, payload: list[Any]) -> None:
        """Release a payload nobody will take (the synchronizer's version window moved on)."""
        ...


SYNC_METHOD: Registry[type] = Registry(
    "sync_method",
    modules={
        "memory": "trinity.sync.memory",
        "checkpoint": "trinity.sync.checkpoint",
        "nccl": "trinity.sync.collective",
        "shared": "trinity.sync.shared",
    },
)


def sync_method(name: str) -> SyncMethod:
    """An instance of the registered method `name` (importing its module on first use), its
    payloads fingerprinted (`fingerprint.py`: the engine half checks what it received)."""
    from trinity.sync.fingerprint import Fingerprinted

    return Fingerprinted(SYNC_METHOD.get(name)(), name)


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of a state dict's tensors (what one sync moves)."""
    return sum(t.numel() * t.element_size() for t in state.values())
