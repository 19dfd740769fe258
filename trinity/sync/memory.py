"""`sync_method: memory`: weights as numpy arrays in the Ray object store.

numpy, not torch: a numpy array moves between processes ~10x cheaper (zero-copy read from shared
memory) than a pickled torch tensor. bfloat16 has no numpy dtype, so such tensors travel as
float32 and are cast back by `load_state_dict`. The object is freed when the synchronizer drops
the last reference (`discard`) and no engine still holds it.

`receive` hands out read-only views of the object-store arrays, not copies: the engine copies them
into its own parameters anyway (`load_state_dict`), so a copy here would move every byte twice
(it made a sync 3.2-3.8x a plain memory copy instead of ~2x, see docs/benchmarks.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.sync.method import SYNC_METHOD, Peers

if TYPE_CHECKING:  # imported where tensors are handled: the synchronizer only discards
    import torch


@SYNC_METHOD.register("memory")
class MemorySync:
    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        import torch

        arrays = {}
        for k, v in state.items():
            t = v.detach().cpu()
            # a view of the tensor, no copy: `ray.put` copies it into the object store, so the
            # stored object is a snapshot the trainer may train past
            arrays[k] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        return [ray.put(arrays)]  # in a list: Ray passes a nested reference on unresolved

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        import torch

        arrays = ray.get(payload[0])
        with warnings.catch_warnings():  # torch warns that object-store arrays are read-only:
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            return {k: torch.from_numpy(v) for k, v in arrays.items()}  # they are only read

    def discard(self, payload: list[Any]) -> None:
        """Nothing to do: dropping the reference lets Ray free the object."""
