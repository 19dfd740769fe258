"""Moving a model's (and an optimizer's) tensors between the device and host memory, for
colocation (`trinity.common.turns`): the side that does not hold the device keeps its state in
host memory. On a CPU-only machine the device is host memory, and nothing moves.

    moved = to_device([model, ref_model], [optimizer], "cpu")    # bytes that changed place
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")


def to_device(modules: Iterable[Any], optimizers: Iterable[Any], device: str) -> int:
    """Move every parameter, gradient and buffer of `modules` and every tensor of the
    optimizers' state to `device`; returns the bytes that changed place (0 where they already
    were). `None` entries are skipped. The device's cache is emptied after moving away from it,
    so the memory is free for the other side, not only for this process's allocator."""
    moved, left = 0, set()
    for module in (m for m in modules if m is not None):
        for t in [*module.parameters(), *module.buffers()]:
            if t.device.type != torch.device(device).type:
                moved += _nbytes(t) + (_nbytes(t.grad) if t.grad is not None else 0)
                left.add(t.device.type)
        module.to(device)
    for optimizer in (o for o in optimizers if o is not None):
        for state in optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.device.type != torch.device(device).type:
                    moved += _nbytes(value)
                    left.add(value.device.type)
                    state[key] = value.to(device)
    if "cuda" in left:
        torch.cuda.empty_cache()
    return moved


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()
