"""`trinity run`: start Ray, run each stage's explorer/trainer/buffer/synchronizer, summarise.

Every long-lived part is a Ray actor; the driver (this process) only wires them together, moves
metrics from the hub to the monitor, and turns any actor's exception into a non-zero exit.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from trinity.buffer.queue import QueueActor
from trinity.config import format_batch_table, resolve, seeds, stage_configs
from trinity.explorer.explorer import Explorer
from trinity.monitor.hub import MetricsHub
from trinity.monitor.monitor import Monitor
from trinity.sync.schedule import versions_to_keep
from trinity.sync.synchronizer import SynchronizerActor
from trinity.trainer.runner import TrainerRunner


@dataclass
class StageResult:
    name: str
    mode: str
    steps: int
    checkpoint: str | None
    eval_start: dict[str, float] = field(default_factory=dict)
    eval_end: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class RunResult:
    run_dir: Path
    stages: list[StageResult]
    seconds: float


def init_ray(address: str) -> None:
    """Join the configured cluster, or start a private local instance.

    `auto` joins a cluster started with `ray start` (or named by RAY_ADDRESS) and otherwise starts
    a local instance that lives as long as this run. It deliberately does not use Ray's own
    `address="auto"`, which also attaches to another driver's private instance and dies with it.
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "ERROR",
        "configure_logging": True,
    }
    if address == "auto":
        ray.init(**kwargs)
    else:
        ray.init(address=address, **kwargs)


def run(config: Any, console: Console | None = None) -> RunResult:
    """Run every stage of `config` in order, each starting from the previous stage's model.

    `config` must have passed `trinity.config.preflight.preflight` (as `trinity run` does).
    """
    console = console or Console(highlight=False)
    t0 = time.perf_counter()
    stages = stage_configs(config)
    init_ray(config.cluster.ray_address)
    run_dir = Path(resolve(config).run_dir)
    types = config.monitor.monitor_type
    types = [types] if isinstance(types, str) else list(types)
    monitor = Monitor(run_dir, types, console)
    hub = ray.remote(MetricsHub).options(num_cpus=0).remote()
    model_path = seeds.model_path(config)
    results: list[StageResult] = []
    offset = 0
    try:
        for i, cfg in enumerate(stages):
            name = cfg.stage_name or ("main" if len(stages) == 1 else f"stage{i}")
            stage_dir = run_dir if len(stages) == 1 else run_dir / name
            console.print(f"[bold cyan]stage {name}[/] mode={cfg.mode} model={model_path}")
            console.print(format_batch_table(resolve(cfg)), markup=False, highlight=False)
            res = run_stage(cfg, name, model_path, stage_dir, hub, monitor, offset)
            results.append(res)
            model_path = res.checkpoint or model_path
            offset += res.steps
    finally:
        monitor.close()
        ray.kill(hub)
    result = RunResult(run_dir=run_dir, stages=results, seconds=time.perf_counter() - t0)
    print_summary(result, console)
    return result


def run_stage(
    cfg: Any,
    name: str,
    model_path: str,
    stage_dir: Path,
    hub: Any,
    monitor: Monitor,
    offset: int,
) -> StageResult:
    """One stage.

    1. start the synchronizer, the buffer (mode both/explore), the explorer (when there is
       something to explore or evaluate) and the trainer (mode both/train)
    2. load data and plan the number of steps
    3. run explorer and trainer loops concurrently, moving metrics to the monitor
    4. final evaluation with the final weights
    """
    t0 = time.perf_counter()
    mode = cfg.mode
    explores = mode in ("both", "explore")
    trains = mode in ("both", "train")
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets)
    actors: list[Any] = []
    opts = {"num_cpus": 0, "max_concurrency": 64}
    try:
        # 1.
        rcfg = resolve(cfg)
        keep = versions_to_keep(rcfg.sync_interval, rcfg.sync_offset, explores and trains)
        sync = ray.remote(SynchronizerActor).options(**opts).remote(rcfg.sync_method, keep)
        actors.append(sync)
        buffer = None
        if explores:
            eb = cfg.buffer.trainer_input.experience_buffer
            buf_name = eb.name if eb and eb.name else "experience_buffer"
            capacity = eb.capacity if eb else 10000
            buffer = (
                ray.remote(QueueActor)
                .options(**opts)
                .remote(str(stage_dir / "buffer" / f"{buf_name}.db"), capacity)
            )
            actors.append(buffer)
        explorer = None
        if explores or evaluates:
            explorer = (
                ray.remote(Explorer)
                .options(**opts)
                .remote(cfg, model_path, buffer, sync, hub, offset)
            )
            actors.append(explorer)
        trainer = None
        if trains:
            trainer = (
                ray.remote(TrainerRunner)
                .options(**opts)
                .remote(cfg, model_path, str(stage_dir), buffer, sync, hub, offset)
            )
            actors.append(trainer)
        # 2.
        prep = []
        if explorer is not None:
            prep.append(explorer.prepare.remote(with_train_tasks=explores))
        if trainer is not None:
            prep.append(trainer.prepare.remote(None, use_dataset=not explores))
        sizes: dict[str, int] = {}
        for d in ray.get(prep):
            sizes.update(d)
        total = _plan_steps(cfg, explores, sizes)
        sources = ({"explorer"} if explores else set()) | ({"trainer"} if trains else set())
        monitor.begin_stage(
            name, sources, offset + total, {"final_eval"} if evaluates else set(), first_step=offset
        )
        # 3.
        eval_start: dict[str, float] = {}
        if explorer is not None and not explores and cfg.explorer.eval_on_startup:
            eval_start = _accuracies(_wait(explorer.evaluate.remote(0), hub, monitor))
        refs = []
        if explores:
            refs.append(explorer.run.remote(total, sync=trains))
        if trainer is not None:
            # publish only for a consumer: an explorer that syncs; the final evaluation
            refs.append(trainer.run.remote(total, explores, evaluates))
        outs = _wait_all(refs, hub, monitor)
        if explores and cfg.explorer.eval_on_startup:
            first = next((r for r in monitor.history if r["step"] == offset), {})
            eval_start = {k: v for k, v in first.items() if k.endswith("/accuracy")}
        train_out = outs[-1] if trainer is not None else {}
        steps = train_out.get("train_steps", outs[0].get("explore_steps", 0) if outs else 0)
        # 4.
        eval_end: dict[str, float] = {}
        if explorer is not None and evaluates:
            if trainer is not None:
                _wait(explorer.sync_to.remote(train_out["train_steps"]), hub, monitor)
            eval_end = _accuracies(
                _wait(explorer.evaluate.remote(steps, source="final_eval"), hub, monitor)
            )
        monitor.end_stage()
        return StageResult(
            name=name,
            mode=mode,
            steps=steps,
            checkpoint=train_out.get("checkpoint"),
            eval_start=eval_start,
            eval_end=eval_end,
            seconds=time.perf_counter() - t0,
        )
    finally:
        for a in actors:
            ray.kill(a)


def _plan_steps(cfg: Any, explores: bool, sizes: dict[str, int]) -> int:
    explicit = cfg.buffer.total_steps or cfg.trainer.total_steps
    epochs = cfg.buffer.total_epochs
    if explores:
        n, per_step = sizes.get("train_tasks", 0), cfg.buffer.batch_size
    else:
        n = sizes.get("dataset_size", 0)
        per_step = cfg.buffer.train_batch_size or cfg.buffer.batch_size
        eb = cfg.buffer.trainer_input.experience_buffer
        epochs = (eb.total_epochs if eb is not None else None) or epochs  # as DatasetSource
    if n == 0:
        raise ValueError("no data: the taskset / dataset of this stage is empty")
    planned = math.ceil(n * epochs / per_step)  # selectors fill batches across epochs
    return min(explicit, planned) if explicit else planned


def _accuracies(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.endswith("/accuracy")}


def _pump(hub: Any, monitor: Monitor) -> None:
    for source, step, metrics in ray.get(hub.drain.remote()):
        monitor.add(source, step, metrics)


def _wait(ref: Any, hub: Any, monitor: Monitor) -> Any:
    return _wait_all([ref], hub, monitor)[0]


def _wait_all(refs: list[Any], hub: Any, monitor: Monitor) -> list[Any]:
    """Wait for all refs while pumping metrics. The first failure is raised at once."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            ray.get(ref)  # raises the actor's exception, with its traceback
        _pump(hub, monitor)
    _pump(hub, monitor)
    return ray.get(refs)


def print_summary(result: RunResult, console: Console) -> None:
    console.rule("[bold]summary")
    first = result.stages[0] if result.stages else None
    if first and first.eval_start:
        for k, v in first.eval_start.items():
            console.print(f"eval at start      {k:<32} {v:.3f}")
    for s in result.stages:
        for k, v in s.eval_end.items():
            console.print(f"eval after {s.name:<8} {k:<32} {v:.3f}")
        console.print(f"stage {s.name:<12} {s.mode:<6} {s.steps:>5} steps  {s.seconds:7.1f} s")
        if s.checkpoint:
            console.print(f"  checkpoint: {s.checkpoint}")
    console.print(f"wall time {result.seconds:.1f} s")
    console.print(f"outputs   {result.run_dir} (metrics.jsonl, tensorboard/)")
