"""`sync_method: shared`: the engines use the trainer's own weights, in shared memory.

    synchronizer: {sync_method: shared}   # mode both, one machine, CPU, strictly on-policy

The first `send` moves each of the trainer's parameter storages into shared memory (one copy,
once; the parameters keep their identity, so the optimizer and autograd do not notice); every
`send` then returns where to find them, and `receive` maps them: the engines' parameters are the
trainer's, one copy of the weights on the machine instead of the trainer's, the object store's
and (while a sync is under way) a second version's. A sync moves no bytes.

The engines see every update as the trainer makes it, so nothing may sample while the trainer
trains. The config checks allow the method only where the schedule guarantees that: mode both,
`sync_style: fixed`, `sync_interval: 1`, `sync_offset: 0` (explore step s samples with the
weights of train step s-1 while the trainer waits for its data, and the trainer trains step s
while the explorer waits for those weights), and the explorer evaluates before it writes a
step's experiences, not after (`live`). The weights must be in CPU memory (a GPU trainer uses
`nccl`), and trainer and engines on one node (`receive` checks).

The memory is torch's anonymous shared memory (`torch.multiprocessing`'s `file_descriptor`
strategy: a segment unlinked as soon as it is made, held open by the trainer). An engine opens
it through the trainer's `/proc/<pid>/fd/<fd>` and maps it. No name is left in /dev/shm, so
nothing can leak: the kernel frees the segment when the last process that maps it exits, a killed
one included. (Named files, the `file_system` strategy, stayed in /dev/shm after every run whose
actors Ray killed: a copy of the weights per run.)
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.sync.method import SYNC_METHOD, Peers

if TYPE_CHECKING:
    import torch

# name -> (trainer pid, its fd of the segment, segment bytes, dtype name, shape, stride, offset)
Handle = tuple[int, int, int, str, tuple[int, ...], tuple[int, ...], int]


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
            # moves the storage into a shared segment in place (a no-op once it is there, the
            # same fd each time): the parameter that owns it keeps its identity
            fd, nbytes = t.untyped_storage()._share_fd_cpu_()
            dtype = str(t.dtype).removeprefix("torch.")
            handles[name] = (
                os.getpid(),
                fd,
                nbytes,
                dtype,
                tuple(t.shape),
                t.stride(),
                t.storage_offset(),
            )
        return [{"node": _node(), "handles": handles}]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        import torch

        sent = payload[0]
        here = _node()
        if sent["node"] != here:
            raise RuntimeError(
                f"synchronizer.sync_method shared: the trainer runs on node {sent['node']} and "
                f"this engine on node {here}; the method shares one machine's memory (use "
                "memory or nccl across nodes)"
            )
        out: dict[str, torch.Tensor] = {}
        storages: dict[tuple[int, int], Any] = {}  # a segment mapped once (tied names share it)
        for name, (pid, fd, nbytes, dtype, shape, stride, offset) in sent["handles"].items():
            if (pid, fd) not in storages:
                storages[pid, fd] = _map(pid, fd, nbytes)
            t = torch.empty(0, dtype=getattr(torch, dtype))
            out[name] = t.set_(storages[pid, fd], offset, shape, stride)
        return out

    def discard(self, payload: list[Any]) -> None:
        """Nothing to do: the segments live as long as the trainer's parameters."""


def _node() -> str:
    """This machine, as Ray names it (or by its host name, in a run without Ray)."""
    if ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return f"host {socket.gethostname()}"


def _map(pid: int, fd: int, nbytes: int) -> Any:
    """The trainer's segment `fd` of process `pid`, mapped into this process."""
    import torch

    try:
        mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    except OSError as e:
        raise RuntimeError(
            f"synchronizer.sync_method shared: cannot open the trainer's weights "
            f"(/proc/{pid}/fd/{fd}: {e.strerror}); the trainer process has ended, or this "
            "engine runs in another process namespace"
        ) from e
    try:
        return torch.UntypedStorage._new_shared_fd_cpu(mine, nbytes)  # maps a duplicate
    finally:
        os.close(mine)
