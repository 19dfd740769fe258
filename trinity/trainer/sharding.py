"""FSDP2 on the trainer's models: one process group, parameters sharded with `fully_shard`,
full weights gathered for sync and export, optimizer state saved and loaded with
`torch.distributed.checkpoint` (DCP) at any world size.

    trainer: {trainer_strategy: fsdp2, world_size: 2}

Each decoder layer is its own FSDP group (its parameters are gathered just before its forward
and freed after, again in backward); everything else (embeddings, final norm, LM head, a value
head) is the root group. The trainer's passes call the backbone and the LM head separately
(`trinity.trainer.logprobs`), so the root is a thin `PassRoot` wrapper whose forward is that
whole pass: FSDP2's root hooks run around it, gathering the root parameters and scheduling their
gradient reduction.

Gradients are SUMMED over ranks, not averaged (FSDP2's default): the losses are already divided by
the whole batch's counts (`trinity.trainer.parallel`). Under gloo a custom divide factor needs
FSDP2's sum-only reduction (`set_force_sum_reduction_for_comms`), set on every FSDP module.

With sequence parallelism (`trinity.trainer.sequence_parallel`) the mesh stays 1-D over all the
world's ranks, and each group of `sp` ranks has a process group of its own for its all-to-alls
(`sequence_groups`). A rank whose slice of a micro-batch holds no response token leaves the LM
head (or value head) unused: FSDP2 then reduce-scatters a zero gradient for it
(`set_reduce_scatter_unused_params`), as every rank must take part in each reduce-scatter.

Rank 0 reads the checkpoint from disk; the other ranks build the model on the meta device (no
memory, no read) and receive their shards from rank 0's full weights
(`set_model_state_dict(..., broadcast_from_rank0=True)`). Buffers that are not in a state dict
(rotary `inv_freq`) are left uninitialised by `to_empty` and are broadcast from rank 0 too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trinity.common import process_group
from trinity.common.process_group import free_address as free_address  # the trainer ranks' import
from trinity.trainer.parallel import Ranks


def init_process_group(ranks: Ranks, address: tuple[str, int], timeout_s: float = 600.0) -> str:
    """Join the trainer's process group (gloo on CPU, NCCL on CUDA); returns the device."""
    return process_group.init_process_group(ranks.rank, ranks.world, address, timeout_s)


def sequence_groups(ranks: Ranks) -> Ranks:
    """`ranks` with its sequence-parallel process group (`sp` consecutive ranks): every rank
    creates every group, in the same order, as `new_group` requires. No group with sp 1."""
    if ranks.sp == 1:
        return ranks
    mine = None
    for first in range(0, ranks.world, ranks.sp):
        group = dist.new_group(list(range(first, first + ranks.sp)))
        if first == ranks.dp_rank * ranks.sp:
            mine = group
    return dataclasses.replace(ranks, sp_group=mine)


class PassRoot(torch.nn.Module):
    """A model as one pass: `forward(fn, *args)` runs `fn(model, *args)`. Sharded, it is the
    FSDP root, so a pass that calls the model's parts directly (backbone, then LM head) still
    runs inside the root's hooks, which gather and reduce the root parameters; unsharded, it
    only calls `fn`. `module` is the wrapped model."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.module, *args, **kwargs)


def shard(root: torch.nn.Module, device: str, unused_grads: bool = False) -> torch.nn.Module:
    """`root` with each decoder layer under it and the rest (root group) sharded over the world's
    ranks, gradients summed over ranks. `root`'s forward must be a whole pass (`PassRoot`, or a
    model that calls its parts in its own forward, as the critic's `ValueModel`).
    `unused_grads`: a parameter a rank did not use has a zero gradient in the reduce-scatter
    (sequence parallelism: module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for layer in decoder_layers(root):
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
            if unused_grads:
                m.set_reduce_scatter_unused_params(True, recurse=False)
    return root


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model (`model.model.layers` and the like): the
    modules of the classes transformers marks `_no_split_modules`, or failing that every
    ModuleList's items."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return [layer for lst in lists for layer in lst]


def build_sharded(
    load: Callable[[], torch.nn.Module],
    ranks: Ranks,
    device: str,
    root: Callable[[torch.nn.Module], torch.nn.Module] = PassRoot,
    build_meta: Callable[[], torch.nn.Module] | None = None,
) -> torch.nn.Module:
    """The sharded `root(model)` of a model that `load` reads. With `build_meta` only rank 0
    reads it; the other ranks build it on the meta device (no memory, no read) and receive
    their shards from rank 0. Without, every rank loads it and keeps its shards."""
    unused = ranks.sp > 1
    if build_meta is None:
        return shard(root(load()), device, unused)
    if ranks.rank == 0:
        model = load()
        full = model.state_dict()
        buffers = {k: b.clone() for k, b in model.named_buffers()}
    else:
        with torch.device("meta"):
            model = build_meta()
        full, buffers = {}, {}
    wrapped = shard(root(model), device, unused)
    if ranks.rank != 0:
        wrapped.to_empty(device=device)
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    del full
    for name, buf in model.named_buffers():  # not in a state dict: rotary inv_freq
        if ranks.rank == 0:
            buf.copy_(buffers[name])
        dist.broadcast(buf, src=0)
    return wrapped


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (CPU tensors; a collective every rank must call;
    other ranks get {}), each tied parameter once, under its first name."""
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {k: v for k, v in state.items() if k not in tied_names(model)}


def tied_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are the very parameter of an earlier name (a tied LM head)."""
    first: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(p), name) != name:
            tied.add(name)
    return tied


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Rank 0's full weights `state` into every rank's shards of `model` (a collective; other
    ranks pass {}). A tied parameter absent from `state` is the one it is tied to."""
    set_model_state_dict(
        model,
        state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False),
    )


def save_optimizer(model: torch.nn.Module, optimizer: Any, folder: Path, key: str) -> None:
    """`optimizer`'s state (keyed by parameter names, so any world size can load it) into the
    DCP folder `folder/key` (a collective under FSDP2; one process writes alone otherwise)."""
    import torch.distributed.checkpoint as dcp

    state = get_optimizer_state_dict(_plain(model), optimizer)
    dcp.save({"optim": state}, checkpoint_id=str(folder / key))


def load_optimizer(model: torch.nn.Module, optimizer: Any, folder: Path, key: str) -> None:
    """Load what `save_optimizer` wrote, resharded to this process's world size."""
    import torch.distributed.checkpoint as dcp

    state = {"optim": get_optimizer_state_dict(_plain(model), optimizer)}
    dcp.load(state, checkpoint_id=str(folder / key))
    set_optimizer_state_dict(_plain(model), optimizer, state["optim"])


def _plain(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose parameter names the optimizer state is keyed by (a `PassRoot`'s inner
    one, so sharded and unsharded checkpoints share names)."""
    return model.module if isinstance(model, PassRoot) else model


def restore_optimizer(
    model: torch.nn.Module,
    optimizer: Any,
    folder: Path,
    key: str,
    saved: dict[str, Any] | None,
    sharded: bool,
) -> None:
    """Load an optimizer state from a checkpoint folder, whichever world size saved it: the DCP
    folder `folder/key` ranks write (`save_optimizer`), else `saved`, a one-process
    `state_dict()` by parameter index (into shards: keyed by name first)."""
    if (folder / key).is_dir():
        load_optimizer(model, optimizer, folder, key)
    elif saved is None:
        raise ValueError(f"{folder} holds no optimizer state ({key}/ or in its trainer state)")
    elif sharded:
        named = named_optimizer_state(_plain(model), saved)
        load_named_optimizer_state(_plain(model), optimizer, named)
    else:
        optimizer.load_state_dict(saved)


def named_optimizer_state(model: torch.nn.Module, legacy: dict[str, Any]) -> dict[str, Any]:
    """A one-process optimizer `state_dict()` (keyed by parameter index, in the order
    `build_optimizer` passed them: the trainable parameters, each once) keyed by parameter
    name instead, as `set_optimizer_state_dict` takes a full state."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    state = {names[i]: s for i, s in legacy["state"].items()}
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in legacy["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_named_optimizer_state(model: torch.nn.Module, optimizer: Any, named: dict) -> None:
    """A full, name-keyed optimizer state (every rank holds it) into this rank's shards."""
    set_optimizer_state_dict(
        model, optimizer, named, options=StateDictOptions(full_state_dict=True)
    )


def scalar(x: Any) -> float:
    """A float of a tensor, a sharded one (DTensor: a gradient norm under FSDP2) included."""
    full = getattr(x, "full_tensor", None)
    return float(full() if full is not None else x)
