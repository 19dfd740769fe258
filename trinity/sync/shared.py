"""`sync_method: shared`: the engines use the trainer's own weights, in shared memory.

    synchronizer: {sync_method: shared}   # mode both, one machine, CPU, strictly on-policy

The first `send` moves each of the trainer's parameter storages into a shared-memory file (one
copy, once; the parameters keep their identity, so the optimizer and autograd do not notice);
every `send` then returns the files' handles, and `receive` maps them: the engines' parameters
are the trainer's, one copy of the weights on the machine instead of the trainer's, the object
store's and (while a sync is under way) a second version's. A sync moves no bytes.

The engines see every update as the trainer makes it, so nothing may sample while the trainer
trains. The config checks allow the method only where the schedule guarantees that: mode both,
`sync_style: fixed`, `sync_interval: 1`, `sync_offset: 0` (explore step s samples with the
weights of train step s-1 while the trainer waits for its data, and the trainer trains step s
while the explorer waits for those weights), and the explorer evaluates before it writes a
step's experiences, not after (`live`). The weights must be in CPU memory (a GPU trainer uses
`nccl`), and trainer and engines on one node (`receive` checks).

The files are torch's own shared-memory files (`torch.multiprocessing`'s `file_system` strategy,
the mechanism its DataLoader workers use), created and freed by torch's shared-memory manager:
a file goes when the last process that maps it exits, a crashed one included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.sync.method import SYNC_METHOD, Peers

if TYPE_CHECKING:
    import torch

# name -> (manager socket, file name, storage bytes, dtype name, shape, stride, storage offset)
Handle = tuple[bytes, bytes, int, str, tuple[int, ...], tuple[int, ...], int]


@SYNC_METHOD.register("shared")
class SharedSync:
    hands_over = True  # the engine keeps the mapped tensors as its parameters
    live = True  # ... and they change as the trainer steps

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        handles: dict[str, Handle] = {}
        for name, t in state.items():
            if t.device.type != "cpu":
                raise RuntimeError(
                    f"synchronizer.sync_method shared: the trainer's {name!r} is on "
                    f"{t.device}; the method shares CPU memory (use nccl or memory for a GPU "
                    "trainer)"
                )
            # moves the storage into a shared-memory file in place (a no-op once it is there):
            # the parameter that owns it keeps its identity and now lives in the file
            manager, filename, nbytes = t.untyped_storage()._share_filename_cpu_()
            dtype = str(t.dtype).removeprefix("torch.")
            handles[name] = (
                manager,
                filename,
                nbytes,
                dtype,
                tuple(t.shape),
                t.stride(),
                t.storage_offset(),
            )
        return [{"node": ray.get_runtime_context().get_node_id(), "handles": handles}]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        import torch

        sent = payload[0]
        here = ray.get_runtime_context().get_node_id()
        if sent["node"] != here:
            raise RuntimeError(
                f"synchronizer.sync_method shared: the trainer runs on node {sent['node']} and "
                f"this engine on node {here}; the method shares one machine's memory (use "
                "memory or nccl across nodes)"
            )
        out: dict[str, torch.Tensor] = {}
        storages: dict[bytes, Any] = {}  # a file mapped once per receive (tied names share it)
        for name, (manager, filename, nbytes, dtype, shape, stride, offset) in sent[
            "handles"
        ].items():
            if filename not in storages:
                storages[filename] = torch.UntypedStorage._new_shared_filename_cpu(
                    manager, filename, nbytes
                )
            t = torch.empty(0, dtype=getattr(torch, dtype))
            out[name] = t.set_(storages[filename], offset, shape, stride)
        return out

    def discard(self, payload: list[Any]) -> None:
        """Nothing to do: the files live as long as the trainer's parameters."""
