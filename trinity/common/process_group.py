"""Joining a torch.distributed process group from Ray actors: a rendezvous address, then the group.

    address = free_address()                                  # asked of rank 0, on its node
    device = init_process_group(rank, world, address)         # every rank: "cpu" or "cuda"

Gloo on CPUs, NCCL on CUDA. Two kinds of process use it: the ranks of a sharded trainer
(`trainer/sharding.py`, FSDP2) and the ranks of a tensor-parallel rollout engine
(`explorer/tp_engine.py`). Each is a process of its own, so each process joins one default group.
"""

from __future__ import annotations

import socket
from datetime import timedelta


def free_address() -> tuple[str, int]:
    """This node's address and a free TCP port: where rank 0's process group rendezvous."""
    import ray

    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return host, int(s.getsockname()[1])


def init_process_group(
    rank: int, world: int, address: tuple[str, int], timeout_s: float = 600.0
) -> str:
    """Join the default process group as `rank` of `world` (gloo on CPU, NCCL on CUDA): each
    collective waits at most `timeout_s` for the others. Returns the device ("cpu" or "cuda";
    Ray gives each rank actor its own GPU as device 0)."""
    import torch
    import torch.distributed as dist

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(0)
    host, port = address
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return device
