"""Tensor parallelism for the rollout engine's model: PyTorch's `parallelize_module` over a 1-D
device mesh, following the plan the model's own transformers class declares.

    explorer.rollout_model: {tensor_parallel_size: 2}     # an engine is 2 processes

    tp = TensorParallel.join(TPPlace(rank, world, address))   # the process group and its mesh
    tp.parallelize(model)            # q/k/v, gate/up column-wise; o, down row-wise (Megatron)
    tok = tp.agree(tok)              # rank 0's sampled tokens on every rank
    model.load_state_dict(tp.shard(model, full_tensors))   # each rank keeps its slices

The plan is the model config's `base_model_tp_plan` (transformers writes one per family: Llama,
Qwen2, Qwen3, Mistral, ...): "colwise" becomes torch's `ColwiseParallel` (the weight's output rows
split over ranks, each rank computing its heads or its part of the MLP's inner width, the output
left local), "rowwise" `RowwiseParallel` (the input columns split, partial sums all-reduced), and
the "replicated_*" entries (Qwen3's per-head q/k norms) stay whole on every rank. Everything the
plan does not name (embeddings, final norm, LM head, layer norms) is replicated, so every rank
holds the whole logits and the decode loop above the model is unchanged. Per decoder layer a
forward costs two all-reduces of the hidden states (after o_proj and down_proj).

How it departs from transformers' own `tp_plan="auto"` loading: that path reads each rank's
slices from the checkpoint through transformers' private shard loaders, and an engine must also
load full weights from a sync (memory, checkpoint, nccl) into its slices. Here every rank loads
the full model (on CPU first on GPUs, then only its slices move to its device) and `shard` cuts
any full tensor with torch's own `distribute_tensor`, the one rule for the start weights and every
update alike.

A rank's attention heads, KV heads and MLP inner width are the model's divided by the world
size, which must divide all three (`models.shapes.divisibility_problem`, checked by pre-flight
where the model's config is at hand, and again at build).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trinity.common.process_group import init_process_group
from trinity.models.shapes import TP_KEY as KEY
from trinity.models.shapes import divisibility_problem

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
REPLICATED = frozenset({"replicated_with_grad_allreduce"})  # whole on every rank (no gradients)


@dataclass(frozen=True)
class TPPlace:
    """One rank of a tensor-parallel engine: `rank` of `world`, meeting at `address`."""

    rank: int
    world: int
    address: tuple[str, int]


def tp_plan(model: Any) -> dict[str, Any]:
    """torch's parallel styles for `model` (a transformers causal LM), keyed by module path
    (wildcards as transformers writes them), from its config's `base_model_tp_plan`."""
    config = model.config
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ValueError(
            f"{KEY}: model_type {config.model_type!r} declares no tensor-parallel plan "
            "(its transformers config has no base_model_tp_plan); serve it with "
            f"{KEY}: 1"
        )
    prefix = model.base_model_prefix
    styles: dict[str, Any] = {}
    for path, style in plan.items():
        if style in REPLICATED:
            continue
        if style not in STYLES:
            raise ValueError(
                f"{KEY}: model_type {config.model_type!r} asks for {style!r} on {path!r}; the "
                f"engine builds {sorted(STYLES)} (and replicated modules): serve it with {KEY}: 1"
            )
        styles[f"{prefix}.{path}"] = STYLES[style]()
    return styles


@dataclass
class TensorParallel:
    """This process's place in a tensor-parallel engine: the group's mesh and what it does to
    the model, its tokens and its weights (module docstring)."""

    rank: int
    world: int
    mesh: DeviceMesh
    device: str

    @staticmethod
    def join(place: TPPlace, timeout_s: float = 600.0) -> TensorParallel:
        """Join the engine's process group (gloo on CPU, NCCL on CUDA): every collective of a
        forward waits at most `timeout_s` for the other ranks."""
        device = init_process_group(place.rank, place.world, place.address, timeout_s)
        mesh = init_device_mesh(device, (place.world,))
        return TensorParallel(place.rank, place.world, mesh, device)

    def parallelize(self, model: Any) -> Any:
        """Split `model`'s decoder layers over the ranks in place (`tp_plan`); raises
        ValueError when the world size does not divide its heads and inner width."""
        problem = divisibility_problem(model.config, self.world)
        if problem is not None:
            raise ValueError(problem)
        parallelize_module(model, self.mesh, tp_plan(model))
        return model

    def agree(self, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens` [b] as rank 0 sampled them, on every rank. Each rank's logits are the same
        numbers only up to its own kernels (on CPU its thread count may change a matmul's
        rounding), and a row that sampled eos on one rank and not on another would leave the
        ranks with different batches, their collectives out of step: so rank 0's draw decides."""
        tokens = tokens.contiguous()
        dist.broadcast(tokens, src=0)
        return tokens

    def shard(self, model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """`tensors` (full weights by name) with each one whose parameter is split over the
        ranks replaced by this rank's slices (a DTensor of its own memory, the full tensor not
        kept); the others as they are. Raises RuntimeError on a full tensor of another shape."""
        held = model.state_dict(keep_vars=True)
        out: dict[str, Any] = dict(tensors)
        for name, full in tensors.items():
            param = held.get(name)
            if not isinstance(param, DTensor) or isinstance(full, DTensor):
                continue
            if tuple(full.shape) != tuple(param.shape):
                raise RuntimeError(
                    f"{name}: a tensor of shape {tuple(full.shape)} for a weight of shape "
                    f"{tuple(param.shape)}"
                )
            full = full.to(dtype=param.dtype)
            split = distribute_tensor(full, self.mesh, param.placements, src_data_rank=None)
            local = split.to_local()
            if local.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
                local = local.clone()  # a view would keep the whole tensor alive
            out[name] = DTensor.from_local(
                local, self.mesh, param.placements, run_check=False, shape=param.shape,
                stride=param.stride(),
            )  # fmt: skip
        return out


def local_rows(linear: Any) -> int:
    """Output features `linear` computes in this process: its weight's rows, or this rank's
    rows of a weight split over ranks."""
    weight = linear.weight
    return int((weight.to_local() if isinstance(weight, DTensor) else weight).shape[0])
