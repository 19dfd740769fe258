"""A stage's shares of the cluster: cores and GPUs for the trainer and the engines, and the
weight sync that the shares allow (`common.resources` does the arithmetic)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray

from trinity.common.placement import node_resources
from trinity.common.resources import ResourcePlan, plan_resources
from trinity.launcher.plan import process_role


def sync_by_memory(cfg: Any, plan: ResourcePlan) -> tuple[Any, str]:
    """`cfg` with `synchronizer.sync_method: memory`, and the note that says why.

    NCCL cannot put two ranks of one group on one device, and a plan that gives the trainer and
    the engines fractions of a GPU puts at least two of them on one (there are fewer GPUs than
    members). Trinity-RFT switches to `memory` in the same case (its colocate mode). Decided
    here, not in `resolve()`: it depends on the GPUs Ray has free when the stage starts.
    """
    assert plan.trainer is not None and plan.engine is not None
    sync = cfg.synchronizer.model_copy(update={"sync_method": "memory"})
    note = (
        f"synchronizer.sync_method nccl: trainer and engines share GPUs ({plan.trainer.num_gpus:g} "
        f"GPU each) and NCCL cannot put two ranks on one device: weights go by memory "
        "(the object store), as Trinity-RFT does when they are colocated"
    )
    return cfg.model_copy(update={"synchronizer": sync}), note


def colocated_config(cfg: Any, on_gpu: bool) -> tuple[Any, list[str]]:
    """`cfg` as colocation runs it (`common.turns`), and a note per change: weights go by
    `memory` (Trinity-RFT's colocate mode does the same: NCCL cannot put two ranks on one
    device, and a file round trip buys nothing on one machine), and on a GPU vLLM takes
    Trinity-RFT's colocated share of it, 0.25, unless `gpu_memory_utilization` is set (both
    sides load at start, before the trainer moves to host memory). vLLM on CPUs cannot sleep:
    refused."""
    notes = []
    rm = cfg.explorer.rollout_model
    if rm.engine_type == "vllm" and not on_gpu:
        raise ValueError(
            "cluster.colocate with explorer.rollout_model.engine_type vllm on CPUs: vLLM's "
            "sleep mode needs CUDA, so its engines cannot give the device to the trainer; use "
            "engine_type transformers, or cluster.colocate: false"
        )
    if cfg.synchronizer.sync_method != "memory":
        notes.append(
            f"synchronizer.sync_method {cfg.synchronizer.sync_method}: colocated, weights go "
            "by memory (the object store), as Trinity-RFT's colocate mode does"
        )
        sync = cfg.synchronizer.model_copy(update={"sync_method": "memory"})
        cfg = cfg.model_copy(update={"synchronizer": sync})
    if rm.engine_type == "vllm" and "gpu_memory_utilization" not in rm.model_fields_set:
        notes.append(
            "explorer.rollout_model.gpu_memory_utilization: 0.25 when colocated (Trinity-RFT's "
            "share; set it to give vLLM more of the GPU)"
        )
        rm = rm.model_copy(update={"gpu_memory_utilization": 0.25})
        explorer = cfg.explorer.model_copy(update={"rollout_model": rm})
        cfg = cfg.model_copy(update={"explorer": explorer})
    return cfg, notes


def resource_plan(
    cfg: Any,
    trains: bool,
    has_engines: bool,
    lockstep: bool,
    split: bool = False,
    nodes: list[str] | None = None,
    run_shares: Any = None,
) -> ResourcePlan:
    """Shares of what Ray has free now, or, for a process of a split run, of the cores the
    run's ledger gives it (`run_shares`, `common.resources.RunShares`: the trainer's half, or an
    explorer's part of the other half) and of half the GPUs. Over several `nodes`, shares of
    one node: the smallest, holding the trainer and the engines placed beside it (engine i goes
    to node i mod N)."""
    have = _settled_resources(split) if ray.is_initialized() else local_resources()
    rm = cfg.explorer.rollout_model
    engines = engine_count(cfg) if has_engines else 0
    ranks = engine_ranks(cfg)[:engines]  # each engine's processes (tensor_parallel_size)
    if nodes:
        have = node_resources(nodes)
        engines = len(range(0, engines, len(nodes)))  # those on the first node
        ranks = ranks[:: len(nodes)]
    cpus, note = have.get("CPU", 0.0), ""
    if split and run_shares is not None:
        role = process_role(cfg)
        got, note = ray.get(run_shares.claim_cpus.remote(role, engines, cpus))
        cpus = float(got)
        if got == 0:  # explorers hold the explorers' half: it takes its part at its first step
            note += ", waits for its part before its first step"
    elif split:  # a split stage in a run that is not split has no ledger: half the cluster
        cpus /= 2
    part = 0.5 if split else 1.0
    gpus = have.get("GPU", 0.0)
    if cfg.cluster.gpu_per_node is not None:
        gpus = min(gpus, cfg.cluster.gpu_per_node)
    plan = plan_resources(
        cpus,
        part * gpus,
        trainer=trains,
        engines=engines,
        lockstep=lockstep,
        trainer_threads=cfg.trainer.num_threads,
        engine_threads=rm.num_threads,
        reserve_cpus=not split,
        engine_ranks=sum(ranks),
        tensor_parallel=rm.tensor_parallel_size,
    )
    return dataclasses.replace(plan, run_share=note)


def engine_count(cfg: Any) -> int:
    """The explorer's engines: the rollout model's and those of the auxiliary models it serves
    (`explorer.auxiliary`); each takes one engine share."""
    from trinity.explorer.auxiliary import auxiliary_engines

    return cfg.explorer.rollout_model.engine_num + auxiliary_engines(cfg)


def engine_ranks(cfg: Any) -> list[int]:
    """The processes of each of the explorer's engines, in `engine_count`'s order (the rollout
    engines, then the served auxiliary models'): its pool's `tensor_parallel_size`."""
    from trinity.explorer.auxiliary import served_auxiliary

    pools = [cfg.explorer.rollout_model]
    pools += [cfg.explorer.auxiliary_models[i] for i in served_auxiliary(cfg)]
    return [p.tensor_parallel_size for p in pools for _ in range(p.engine_num)]


def local_resources() -> dict[str, float]:
    """This machine's cores, as a local Ray instance would count them, for a run without Ray
    (`common.local_host`, CPU-only by its plan)."""
    from ray._private.utils import get_num_cpus  # affinity and cgroup quotas, as Ray counts

    return {"CPU": float(get_num_cpus())}


def _settled_resources(split: bool, timeout: float = 10.0) -> dict[str, float]:
    """The cluster's resources (`split`: a process of a split run) or its free ones, once Ray
    reports them.

    Right after `ray.init` the resource view can still be empty, and the previous stage's killed
    actors return their reservations a moment later: wait (up to `timeout` s) until the node is
    registered and, for a run of its own, until everything is free or the count holds still.
    """
    deadline = time.monotonic() + timeout
    while not ray.cluster_resources().get("CPU") and time.monotonic() < deadline:
        time.sleep(0.1)
    total = ray.cluster_resources()
    if split:
        return total
    free, last, still = ray.available_resources(), None, 0
    while free.get("CPU", 0.0) < total.get("CPU", 0.0) and time.monotonic() < deadline:
        still = still + 1 if free.get("CPU") == last else 0
        if still >= 10:  # held for a second: another job's, not ours returning
            break
        last = free.get("CPU")
        time.sleep(0.1)
        free = ray.available_resources()
    return free
