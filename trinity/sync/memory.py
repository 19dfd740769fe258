"""`sync_method: memory`: weights as numpy arrays in the Ray object store.

numpy, not torch: a numpy array moves between processes far cheaper (a zero-copy read from
shared memory) than a pickled torch tensor, which is copied out of the object store. A dtype
numpy lacks (bfloat16, the float8 types) travels in its own bytes: as a view of the same bits as
a signed integer of the same width, viewed back on receipt, so a bf16 model moves half the bytes
of a float32 copy and arrives bit-exact. The object is freed when the synchronizer drops the
last reference (`discard`) and no engine still holds it.

`receive` hands out read-only views of the object-store arrays, not copies: an engine whose
parameters have their dtype keeps the views as its parameters (`load_weights(take=True)`; the
object stays pinned while it holds them), any other copies them, so a copy here would only move
every byte twice (docs/benchmarks.md, "Measurements moved out of module docstrings").
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.common import refs
from trinity.sync.method import SYNC_METHOD, Peers

if TYPE_CHECKING:  # imported where tensors are handled: the synchronizer only discards
    import torch


@SYNC_METHOD.register("memory")
class MemorySync:
    hands_over = True  # an object-store object is immutable: the engine may keep its views
    live = False

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        arrays, viewed = {}, {}
        local = not ray.is_initialized()  # a run in this process (common.local_host)
        for k, v in state.items():
            # a view of the tensor, no copy: `ray.put` copies it into the object store, so the
            # stored object is a snapshot the trainer may train past; in this process, a copy
            arrays[k], dtype = _as_numpy(v.detach().cpu())
            if local:
                arrays[k] = arrays[k].copy()
            if dtype is not None:
                viewed[k] = dtype
        # in a list: Ray passes a nested reference on unresolved
        return [refs.put({"arrays": arrays, "viewed": viewed}, local)]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        import torch

        got = refs.get(payload[0])
        viewed = got["viewed"]
        with warnings.catch_warnings():  # torch warns that object-store arrays are read-only:
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            out = {}
            for k, a in got["arrays"].items():  # they are only read
                t = torch.from_numpy(a)
                out[k] = t.view(getattr(torch, viewed[k])) if k in viewed else t
            return out

    def discard(self, payload: list[Any]) -> None:
        """Nothing to do: dropping the reference lets Ray free the object."""


def _as_numpy(t: torch.Tensor) -> tuple[Any, str | None]:
    """(a numpy view of `t`'s bytes, the torch dtype name to view them back as, or None when
    numpy has `t`'s dtype)."""
    import torch

    try:
        return t.numpy(), None
    except TypeError:  # no numpy dtype (bfloat16, float8_*): the same bits as a signed int
        same_width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return t.view(same_width[t.element_size()]).numpy(), str(t.dtype).removeprefix("torch.")
