"""Starting a run's engine actors: the rollout engines and those of every served auxiliary model.

The launcher starts them beside the explorer actor rather than from inside it, so their
processes start, import and load their models while the explorer's process is still importing
(on 2 cores that took the explorer's imports off the path to the first rollout); an explorer
built without them starts them itself, first thing. Rollout engines with
`explorer.rollout_model.in_explorer_process` are no actors: the explorer builds them on threads
of its own (`in_explorer_engines`). A pool with `tensor_parallel_size` t > 1 is t actors per
engine in a placement group of its own (`explorer/tp_engine.py`): the handle is rank 0's, and the
groups are the pools' to remove once the engines are gone (`EnginePools.release`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ray

from trinity.common.compute import compute_lane
from trinity.common.placement import on_node
from trinity.common.resources import Share, round_resource
from trinity.common.rollout import engine_class, pool_kwargs, run_kwargs
from trinity.config import seeds
from trinity.config.resolved import (
    BEST_ENGINE,
    engines_in_explorer,
    in_lockstep,
    overlaps_in_one_process,
    resolve,
)
from trinity.explorer.auxiliary import auxiliary_limits, served_auxiliary
from trinity.explorer.in_process import InThread
from trinity.models.loading import BUILD_LOCK


@dataclass
class EnginePools:
    rollout: list[Any]
    """The rollout engines (trained weights), one actor handle per `engine_num` (none when they
    run in the explorer's process: it builds them)."""
    auxiliary: dict[int, list[Any]] = field(default_factory=dict)
    """`explorer.auxiliary_models` position -> its engines (served models only, never trained)."""
    groups: list[Any] = field(default_factory=list)
    """The placement groups of tensor-parallel engines, one per engine."""

    def all(self) -> list[Any]:
        return [*self.rollout, *(e for pool in self.auxiliary.values() for e in pool)]

    def release(self) -> None:
        """Free the tensor-parallel engines' placement groups (once their actors are killed)."""
        from ray.util.placement_group import remove_placement_group

        for group in self.groups:
            remove_placement_group(group)
        self.groups = []


def start_engine_pools(
    cfg: Any, model_path: str, share: Share | None, nodes: list[str] | None
) -> EnginePools:
    """Start every engine actor of `cfg`'s explorer; not awaited (each resolves and loads its
    model in its own process). `share`: what each reserves and its threads (None: no
    reservation, every core); engine i runs on node i mod N of `nodes` (None or empty: wherever
    Ray places it), the auxiliary engines numbered after the rollout engines."""
    rm, nodes = cfg.explorer.rollout_model, list(nodes or [])
    share = share or Share(0, 0, os.cpu_count() or 1)
    groups: list[Any] = []
    rollout = (
        []
        if engines_in_explorer(cfg)
        else _spawn(
            groups,
            resolve(cfg).engine_type,  # unset: best available
            rm,
            model_path,
            [seeds.engine_seed(cfg, i) for i in range(rm.engine_num)],
            share,
            nodes,
            first=0,
            max_model_len=cfg.model.max_model_len,
            chat_template=cfg.model.custom_chat_template,
            colocated=bool(cfg.cluster.colocate),
            cfg=cfg,
        )
    )
    auxiliary: dict[int, list[Any]] = {}
    first = rm.engine_num
    for i in served_auxiliary(cfg):
        aux = cfg.explorer.auxiliary_models[i]
        seed = seeds.auxiliary_seed(cfg, i)
        auxiliary[i] = _spawn(
            groups,
            aux.engine_type or BEST_ENGINE[0],
            aux,
            seeds.model_path(cfg, aux.model_path),
            [seed + r for r in range(aux.engine_num)],
            share,
            nodes,
            first=first,
            max_model_len=auxiliary_limits(cfg, i)[0],
            chat_template=None,  # its own tokenizer's template
        )
        first += aux.engine_num
    return EnginePools(rollout, auxiliary, groups)


def in_explorer_engines(cfg: Any, model_path: str, share: Share | None) -> list[InThread]:
    """The rollout engines of `explorer.rollout_model.in_explorer_process`, each built (it loads
    its model) and called on a thread of its own in this process; threads as `start_engine_pools`
    gives them (`share`; None: every core)."""
    rm = cfg.explorer.rollout_model
    share = share or Share(0, 0, os.cpu_count() or 1)
    engine_cls = engine_class(resolve(cfg).engine_type)
    kwargs = _engine_kwargs(
        engine_cls, rm, share, cfg.model.max_model_len, chat_template=cfg.model.custom_chat_template
    )
    kwargs.update(run_kwargs(engine_cls, cfg))
    # one process: the trainer takes up what the engines free, and the reverse (no trims); in
    # lockstep they take turns on the process's compute lane, each with every core (one OpenMP
    # team, common.compute); otherwise each side computes on its own thread with its part
    kwargs["trim_when_idle"] = not cfg.cluster.one_process
    lane = compute_lane() if cfg.cluster.one_process and in_lockstep(cfg) else None
    # overlapping sides of one process lend each other their idle cores (common.core_shares)
    kwargs["lend_cores"] = overlaps_in_one_process(cfg)
    replica_seeds = [seeds.engine_seed(cfg, i) for i in range(rm.engine_num)]
    return [
        InThread(
            partial(_build_alone, partial(engine_cls, model_path, seed=seed, **kwargs)),
            name=f"engine{i}",
            lane=lane,
        )
        for i, seed in enumerate(replica_seeds)
    ]


def _build_alone(build: Any) -> Any:
    """`build()` while no other model user of this process builds (`BUILD_LOCK`)."""
    with BUILD_LOCK:
        return build()


def explorer_reservation(cfg: Any, share: Share | None) -> dict[str, float]:
    """What the explorer's actor reserves: the cores and GPUs of the engines it runs in its
    process (`in_explorer_process`), nothing otherwise (it waits on its engines)."""
    rm = cfg.explorer.rollout_model
    if not engines_in_explorer(cfg) or share is None:
        return {"num_cpus": 0}
    return {"num_cpus": share.num_cpus * rm.engine_num, "num_gpus": share.num_gpus * rm.engine_num}


def _engine_kwargs(
    engine_cls: type,
    pool: Any,
    share: Share,
    max_model_len: int | None,
    chat_template: str | None,
) -> dict[str, Any]:
    """An engine's constructor arguments but its model and seed, for the pool `pool`: the
    contract's, and the pool keys the engine class names (`pool_kwargs`)."""
    return {
        "dtype": pool.dtype,
        "max_batch_size": pool.max_batch_size,
        "max_model_len": max_model_len,
        "num_threads": pool.num_threads or share.threads,
        "custom_chat_template": chat_template,
        **pool_kwargs(engine_cls, pool),
    }


def _spawn(
    groups: list[Any],
    engine_type: str,
    pool: Any,
    model_path: str,
    replica_seeds: list[int],
    share: Share,
    nodes: list[str],
    first: int,
    max_model_len: int | None,
    chat_template: str | None,
    colocated: bool = False,
    cfg: Any = None,
) -> list[Any]:
    """One engine actor per seed in `replica_seeds` for the pool `pool` (an
    `InferenceModelConfig`), engine number `first` + r for node placement; each reserves
    `share`, with the pool's own `num_threads` if set. A tensor-parallel pool's engines are
    `_tensor_parallel` ones, their placement groups appended to `groups`. `colocated`: the
    engines will sleep (`common.turns`); an engine that must know it when built names the
    keyword that says so (`sleep_kwarg`: vLLM's `enable_sleep_mode`). `cfg`: the run's config,
    for what the rollout engine class takes from it (`run_kwargs`; None for auxiliary pools)."""
    engine_cls = engine_class(engine_type)
    kwargs = _engine_kwargs(engine_cls, pool, share, max_model_len, chat_template)
    if cfg is not None:
        kwargs.update(run_kwargs(engine_cls, cfg))
    if colocated and getattr(engine_cls, "sleep_kwarg", None):
        kwargs[engine_cls.sleep_kwarg] = True
    if pool.tensor_parallel_size > 1:
        if (
            engine_type != "transformers"
        ):  # the config refuses it: `checks._tensor_parallel_engines`
            raise ValueError(f"tensor_parallel_size: not built for engine_type {engine_type}")
        return [
            _tensor_parallel(
                groups, pool, model_path, seed, share, on_node(nodes, first + r), kwargs
            )
            for r, seed in enumerate(replica_seeds)
        ]
    actor_cls = ray.remote(engine_cls)
    return [
        actor_cls.options(
            num_cpus=share.num_cpus,
            num_gpus=share.num_gpus,
            max_restarts=pool.max_restarts,
            **on_node(nodes, first + r),
        ).remote(model_path, seed=seed, **kwargs)
        for r, seed in enumerate(replica_seeds)
    ]


def _tensor_parallel(
    groups: list[Any],
    pool: Any,
    model_path: str,
    seed: int,
    share: Share,
    pinned: dict[str, Any],
    kwargs: dict[str, Any],
) -> Any:
    """A tensor-parallel engine (`explorer/tp_engine.py`): a placement group of t bundles, each
    a t-th of `share`'s CPUs and its GPUs (a rank's, `common.resources`; a token 0.01 CPU where
    the share reserves none: a bundle cannot be empty), packed on one node (on the node `pinned` names, if any, where all
    t must fit: its ranks meet in every layer); rank 0 in bundle 0 starts the others. The
    engine's threads are divided between its ranks. Returns rank 0's handle."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from trinity.explorer.tp_engine import TensorParallelEngine

    t = pool.tensor_parallel_size
    cpus, gpus = round_resource(share.num_cpus / t), share.num_gpus  # a GPU is each rank's
    bundle = {"CPU": max(cpus, 0.01), **({"GPU": gpus} if gpus else {})}
    target = getattr(pinned.get("scheduling_strategy"), "node_id", None)
    group = placement_group(
        [dict(bundle) for _ in range(t)],
        strategy="STRICT_PACK" if target else "PACK",
        _soft_target_node_id=target,
    )
    groups.append(group)
    per_rank = {**kwargs, "num_threads": max(1, kwargs["num_threads"] // t)}
    return (
        ray.remote(TensorParallelEngine)
        .options(
            num_cpus=cpus,
            num_gpus=gpus,
            max_restarts=pool.max_restarts,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0
            ),
        )
        .remote(
            model_path,
            tensor_parallel_size=t,
            placement_group=group,
            rank_cpus=cpus,
            rank_gpus=gpus,
            seed=seed,
            **per_rank,
        )
    )
