"""One stage of a run, executed from its plan (`launcher.plan.StagePlan`).

    result = run_stage(stage, model_path, ctx, offset, resume)

`run_stage` reads top to bottom in numbered steps; each step is a function below it. The parts
a stage starts are actors of their own, objects of the run's `ServiceHost` (the small services
always, the explorer and the trainer in the one-process layout), or named actors shared with
the run's other processes (a split run's buffer and synchronizer); `StageParts` records which,
so the stage lets each go the right way, whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from trinity.buffer.replay import ReplaySpec
from trinity.buffer.storage import storage_class, store_name
from trinity.common import refs
from trinity.common.placement import describe as describe_nodes
from trinity.common.placement import on_node
from trinity.common.service_host import hosted
from trinity.common.startup import StartupMarks, process_started_at
from trinity.common.turns import DeviceTurns
from trinity.config import resolve
from trinity.config.problems import ConfigError, Problem
from trinity.config.run_folder import reads_experiences
from trinity.explorer import workflow_env
from trinity.explorer.engine_pools import explorer_reservation, start_engine_pools
from trinity.explorer.explorer import Explorer
from trinity.launcher.bench import bench_points, progress_line, write_samples, write_table
from trinity.launcher.placement import (
    colocated_config,
    engine_count,
    resource_plan,
    sync_by_memory,
)
from trinity.launcher.plan import StagePlan
from trinity.launcher.ray_init import kill_and_wait, run_namespace, task_events_flush_s
from trinity.launcher.reports import accuracies, wait, wait_all
from trinity.launcher.summary import Progress, StageResult
from trinity.models.lora_merge import weights_of_checkpoint
from trinity.monitor.monitor import Monitor
from trinity.sync.schedule import explorer_sync, versions_to_keep
from trinity.sync.synchronizer import SynchronizerActor
from trinity.trainer.checkpoint import checkpoint_step, latest_resumable, trained_leases
from trinity.trainer.runner import TrainerRunner

REMOVE_WAIT_S = 30.0  # the longest a stage's end waits for its hosted parts to stop


@dataclass
class RunContext:
    """What the stages of one run share, set up by `launcher.run.run`."""

    hub: Any  # the MetricsHub handle (in the run's ServiceHost)
    monitor: Monitor
    host: Any  # the run's ServiceHost actor
    nodes: list[str]  # the Ray nodes the run spreads over (empty: one node)
    run_shares: Any  # a split run's `RunName` actor, whose ledger divides the cores; or None
    continuing: bool  # continue_from_checkpoint: explorers continue after their cursors
    progress: Progress | None = None
    """Where the run is: what a stop reports."""


class StageParts:
    """The parts a stage started, and how each is let go at its end (module docstring)."""

    def __init__(self, stage: StagePlan, ctx: RunContext) -> None:
        self.stage, self.ctx = stage, ctx
        self.actors: list[Any] = []  # this process's own: killed at the end of the stage
        self.pools: list[Any] = []  # engine pools: their placement groups, freed after that
        self.in_host: list[str] = []  # objects of the run's ServiceHost: removed at the end
        self.attached: list[Any] = []  # shared with other processes of the run: detached
        self.joined_live_run = False  # the first shared actor had users already

    def start(
        self, cls: type, role: str, *args: Any, share: bool = False, service: bool = False,
        compute: bool = False, **resources: Any,
    ) -> Any:  # fmt: skip
        """An actor of its own, a named actor shared with the run's other processes (`share`),
        or an object of the run's ServiceHost (`service`; `compute` in the one-process layout),
        whose `resources` (Ray actor options: cores, GPUs, a runtime_env) are then those of the
        host."""
        name = f"{self.stage.name}/{role}"
        hosted_here = (service and self.ctx.host is not None) or (
            compute and self.stage.one_process
        )
        if hosted_here and not share:
            self.in_host.append(name)
            return hosted(self.ctx.host, name, cls, *args, max_concurrency=64)
        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_concurrency": 64,
            "name": name,
            "namespace": run_namespace(self.stage.cfg),
        } | resources
        if share:
            options |= {"get_if_exists": True, "lifetime": "detached"}
        try:
            actor = ray.remote(cls).options(**options).remote(*args)
        except ray.exceptions.ActorAlreadyExistsError:
            if share:
                raise
            raise _taken(self.stage.cfg, role) from None
        if share:
            if refs.get(actor.attach.remote(self.stage.role)) and not self.attached:
                self.joined_live_run = True
            self.attached.append(actor)
        else:
            self.actors.append(actor)
        return actor

    def release(self) -> None:
        if self.actors and self.stage.cfg.monitor.enable_ray_timeline:
            time.sleep(task_events_flush_s())  # their calls' events reach Ray before they go
        if not kill_and_wait(self.actors):  # gone before the run names its newest checkpoint
            self.ctx.monitor.console.print(
                f"[yellow]stage {self.stage.name}: an actor still answered 30 s after it was "
                "killed[/]",
                soft_wrap=True,
            )
        for pools in self.pools:  # tensor-parallel engines' placement groups
            pools.release()
        # a dead host took its services with it (and the stage's own error is the one to raise);
        # a part stuck for good (a stalled run: a hung engine thread its shutdown joins) is left
        removals = [self.ctx.host.remove.remote(n) for n in self.in_host]
        with contextlib.suppress(ray.exceptions.RayActorError):
            try:
                refs.get(removals, timeout=REMOVE_WAIT_S)
            except TimeoutError:
                self.ctx.monitor.console.print(
                    f"[yellow]stage {self.stage.name}: its parts did not stop within "
                    f"{REMOVE_WAIT_S:.0f} s (one is stuck); leaving them[/]",
                    soft_wrap=True,
                )
        for a in self.attached:  # the last process of the run to let go ends a shared actor
            if refs.get(a.detach.remote(self.stage.role)) == 0:
                ray.kill(a)


def _taken(cfg: Any, role: str) -> ConfigError:
    """Another live process of the run already runs `role` under its name (Ray refused it)."""
    if role.startswith("explorer/"):
        return ConfigError(
            [
                Problem(
                    "explorer.name",
                    f"{cfg.explorer.name!r} is running in another process of run "
                    f"{cfg.name!r} already; give each explorer or serve process of one run its "
                    f"own name (e.g. --set explorer.name={cfg.explorer.name}-2)",
                )
            ]
        )
    return ConfigError(
        [Problem("", f"{role} is running in another process of run {cfg.name!r} already")]
    )


@dataclass
class Started:
    """The handles of a stage's parts (None where the stage has no such part)."""

    sync: Any
    buffer: Any
    explorer: Any
    trainer: Any
    resume: Path | None  # the checkpoint the trainer continues from
    continuing: bool  # the explorer continues after its cursor


def run_stage(
    stage: StagePlan,
    model_path: str,
    ctx: RunContext,
    offset: int,
    resume: Path | None = None,
    startup: StartupMarks | None = None,
) -> StageResult:
    """Run one stage from its plan. `offset`: the run-wide step it starts after; `resume`: its
    newest checkpoint, which the trainer continues from; `startup`: the driver's start-up
    marks, for the run's first stage (a fresh run's first step record carries the start-up
    timeline, `common.startup`).

    1. place: shares of what Ray has free, and the weight sync they allow
    2. start the synchronizer and the buffer (shared by name, or in the run's host)
    3. start the engines, the explorer and the trainer
    4. load data and plan the number of steps
    5. run the explorer and trainer loops (or serve), moving metrics to the monitor
    6. final evaluation with the final weights
    """
    if stage.mode == "bench":
        return run_bench(stage, model_path, ctx)
    t0 = time.perf_counter()
    parts = StageParts(stage, ctx)
    try:
        # 1.
        stage, plan = _place(stage, ctx)
        # 2. + 3.
        got = _start_parts(stage, plan, parts, model_path, offset, resume)
        # 4.
        total = _prepare(stage, got, ctx, offset, startup)
        # 5.
        eval_start, steps, train_out = _loops(stage, got, ctx, offset, total)
        # 6.
        eval_end: dict[str, float] = {}
        if got.explorer is not None and stage.evaluates and not stage.serves:
            if got.trainer is not None:
                wait(got.explorer.sync_to.remote(train_out["train_steps"]), ctx.hub, ctx.monitor)
            final = got.explorer.evaluate.remote(steps, source="final_eval")
            eval_end = accuracies(wait(final, ctx.hub, ctx.monitor))
        ctx.monitor.end_stage()
        return StageResult(
            name=stage.name,
            mode=stage.mode,
            steps=steps,
            checkpoint=train_out.get("checkpoint"),
            eval_start=eval_start,
            eval_end=eval_end,
            seconds=time.perf_counter() - t0,
        )
    finally:
        parts.release()


def _place(stage: StagePlan, ctx: RunContext) -> tuple[StagePlan, Any]:
    """Step 1: the stage's resource shares (printed), and its sync method where the shares rule
    out the configured one (nccl on a shared GPU goes by memory)."""
    cfg = stage.cfg
    split = stage.shared  # another process of the run computes beside this one
    alone = stage.lockstep or stage.colocated  # each side computes alone: every core its own
    plan = resource_plan(
        cfg, stage.trains, stage.explores or stage.evaluates, alone, split,
        ctx.nodes, ctx.run_shares,
    )  # fmt: skip
    ctx.monitor.console.print(plan.describe(), soft_wrap=True)
    on_gpu = [s for s in (plan.trainer, plan.engine) if s is not None and s.num_gpus > 0]
    if stage.resolved.sync_method == "shared" and on_gpu:
        raise ValueError(
            "synchronizer.sync_method shared: the trainer and engines share CPU memory, but "
            "Ray gives this run's compute actors GPUs; use nccl or memory, or "
            "cluster.gpu_per_node: 0 to train on CPU"
        )
    if stage.one_process and on_gpu:  # the check refuses gpu_per_node; this is what Ray has
        raise ValueError(
            "cluster.one_process: not built yet on GPUs, and Ray gives this run's compute "
            "actors GPUs; set cluster.gpu_per_node: 0 to run on CPUs, or leave one_process off"
        )
    if stage.colocated:
        cfg, notes = colocated_config(cfg, bool(on_gpu))
        stage = dataclasses.replace(stage, cfg=cfg, resolved=resolve(cfg))
        for note in notes:
            ctx.monitor.console.print(f"[yellow]{note}[/]", soft_wrap=True)
    elif stage.resolved.sync_method == "nccl" and plan.gpu_shared():
        cfg, note = sync_by_memory(cfg, plan)
        stage = dataclasses.replace(stage, cfg=cfg, resolved=resolve(cfg))
        ctx.monitor.console.print(f"[yellow]{note}[/]", soft_wrap=True)
    return stage, plan


def _start_parts(
    stage: StagePlan, plan: Any, parts: StageParts, model_path: str, offset: int,
    resume: Path | None,
) -> Started:  # fmt: skip
    """Steps 2 and 3: the synchronizer and buffer, then the engines, explorer and trainer."""
    cfg, r, ctx = stage.cfg, stage.resolved, parts.ctx
    continuing = ctx.continuing
    keep = versions_to_keep(
        r.sync_interval, r.sync_offset, stage.explores and stage.trains, cfg.synchronizer.sync_style
    )
    if stage.shared:  # an explorer in another process may be loading the previous version
        keep = max(keep, 2)
    sync = parts.start(
        SynchronizerActor, "synchronizer", r.sync_method, keep, share=stage.shared, service=True
    )
    if stage.shared and parts.joined_live_run:
        # another process of this run is live (or this role's own dead process left it): this
        # process continues the run, whatever continue_from_checkpoint says
        continuing = True
        if stage.trains and resume is None:
            resume = latest_resumable(stage.stage_dir)
        ctx.monitor.console.print(
            f"joining the live run in {stage.stage_dir} (with {', '.join(refs.get(sync.users.remote()))})"
            + (f"; the trainer resumes from {resume}" if stage.trains and resume else ""),
            soft_wrap=True,
        )
    buffer = None
    eb = cfg.buffer.trainer_input.experience_buffer
    if stage.explores or stage.serves or stage.reads_queue:
        buf_name = eb.name if eb and eb.name else "experience_buffer"
        replay = ReplaySpec.of(eb.replay_buffer) if eb else None
        storage = storage_class(eb.storage_type if eb else "queue", replay is not None)
        # a configured path is the configured storage's (a queue's, served by sql for replay,
        # is not a database): a substituted storage lives in the run folder
        configured = eb.path if eb and storage_class(eb.storage_type) is storage else None
        path = storage.location(configured, stage.stage_dir, buf_name)
        # whichever process of a run creates the buffer settles the leases the run's newest
        # checkpoint trained (an explore process may come back before the train process)
        buffer = parts.start(
            storage, f"buffer/{buf_name}", path, eb.capacity if eb else 10000,
            trained_leases(resume), continuing, store_name(r.run_dir, stage.stage_dir, buf_name),
            *([replay] if replay else []), share=stage.shared, service=True,
        )  # fmt: skip
    if ctx.nodes:
        engines = engine_count(cfg) if stage.explores or stage.evaluates else 0
        ctx.monitor.console.print(describe_nodes(ctx.nodes, engines, stage.trains), soft_wrap=True)
    turns = None
    if stage.colocated and stage.trains and stage.has_explorer:
        journal = str(stage.stage_dir / "device_turns.jsonl")
        turns = parts.start(DeviceTurns, "device_turns", journal)
    explorer = None
    if stage.has_explorer:
        # the engines start beside the explorer, not from it: they import and load while its
        # process imports (`explorer.engine_pools`)
        pools = start_engine_pools(cfg, model_path, plan.engine, ctx.nodes)
        parts.actors.extend(pools.all())
        parts.pools.append(pools)
        shares = ctx.run_shares if stage.mode == "explore" else None
        explorer = parts.start(
            Explorer, f"explorer/{cfg.explorer.name}", cfg, model_path, buffer, sync, ctx.hub,
            offset, plan.engine, ctx.nodes, shares, pools, turns,
            compute=True, **explorer_reservation(cfg, plan.engine), **workflow_env.actor_options(cfg),
        )  # fmt: skip
    trainer = None
    if stage.trains:
        assert plan.trainer is not None
        share, threads, reserve = plan.trainer, plan.trainer.threads, {}
        r = resolve(cfg)
        world = r.trainer_world_size
        if r.trainer_strategy == "fsdp2":  # the share goes to the ranks
            threads = max(1, threads // world)
            rank_share = (share.num_cpus / world, share.num_gpus / world)
            reserve = {"num_cpus": 0, "num_gpus": 0}
        else:
            rank_share = (0.0, 0.0)
            reserve = {"num_cpus": share.num_cpus, "num_gpus": share.num_gpus}
        trainer = parts.start(
            TrainerRunner, "trainer", cfg, model_path, str(stage.stage_dir), buffer, sync,
            ctx.hub, offset, threads, rank_share, ctx.nodes, turns, compute=True,
            **reserve, **on_node(ctx.nodes, 0),
        )  # fmt: skip
    return Started(sync, buffer, explorer, trainer, resume, continuing)


def _prepare(
    stage: StagePlan, got: Started, ctx: RunContext, offset: int, startup: StartupMarks | None
) -> int | None:
    """Step 4: the parts load their data; the stage's steps are planned and the monitor told.
    Returns the planned steps (None: a trainer reading until its explorers end, or an endpoint
    serving until the trainer does)."""
    # a resumed or continued run's first step here is not the run's: no start-up timeline
    fresh = startup is not None and got.resume is None and not got.continuing
    at = process_started_at() if fresh else None
    prep = []
    if got.explorer is not None:
        prep.append(got.explorer.prepare.remote(stage.explores, at))
    if got.trainer is not None:
        prep.append(got.trainer.prepare.remote(None, got.buffer is None, at))
    sizes: dict[str, int] = {}
    for d in refs.get(prep):
        sizes.update(d)
    total = None if stage.serves else plan_steps(stage.cfg, stage.explores, sizes)
    ctx.progress = Progress(stage.name, offset, total, stage.stage_dir)
    sources = ({"explorer"} if stage.explores or stage.serves else set()) | (
        {"trainer"} if stage.trains else set()
    )
    refs.get(ctx.hub.begin_stage.remote(stage.name))
    ctx.monitor.begin_stage(
        stage.name,
        sources,
        offset + (total or 0),
        {"final_eval"} if stage.evaluates else set(),
        first_step=offset,
    )
    if fresh and total != 0:  # the driver's marks join the first step's record
        assert startup is not None
        ctx.monitor.add("driver", offset + 1, startup.as_metrics(at))
    return total


def _loops(
    stage: StagePlan, got: Started, ctx: RunContext, offset: int, total: int | None
) -> tuple[dict[str, float], int, dict[str, Any]]:
    """Step 5: the evaluation at start, then the explorer's and the trainer's loops (or the
    endpoint) until the stage ends. Returns (accuracies at start, steps, the trainer's
    result)."""
    cfg, hub, monitor = stage.cfg, ctx.hub, ctx.monitor
    explorer, trainer, resume = got.explorer, got.trainer, got.resume
    eval_start: dict[str, float] = {}
    startup_eval = not stage.explores and not stage.serves and cfg.explorer.eval_on_startup
    if explorer is not None and startup_eval and not resume:
        eval_start = accuracies(wait(explorer.evaluate.remote(0), hub, monitor))
    calls = []
    if stage.serves:
        url = refs.get(explorer.start_serving.remote())
        monitor.console.print(
            f"serving {cfg.model.model_path} at {url} (chat/completions, completions; "
            f"POST {url.removesuffix('/v1')}/feedback and /commit)",
            soft_wrap=True,
        )
        calls.append(explorer.serve.remote())
    if stage.explores:
        # mode both, fixed: the exact version the schedule names; explore or trainer_driven:
        # the newest, if any; explorer_driven: the trainer's current weights, on request
        weights = None
        if resume and stage.trains:  # a LoRA checkpoint's adapter, for engines on its base
            weights = (str(weights_of_checkpoint(resume)), checkpoint_step(resume))
        how = explorer_sync(cfg.synchronizer.sync_style, trainer_in_run=stage.trains)
        calls.append(explorer.run.remote(total, sync=how, resume=got.continuing, weights=weights))
    if trainer is not None:
        # publish only for a consumer: an explorer that syncs (this process's or, reading a
        # queue, another's); the final evaluation. A split run's trainer with a step budget
        # waits for an explorer started after the others finished, up to the read timeout;
        # without a budget they end it
        eb = cfg.buffer.trainer_input.experience_buffer
        linger = 0.0
        if stage.reads_queue and total is not None:
            linger = eb.max_read_timeout if eb is not None else 1800.0
        consumer = stage.explores or stage.reads_queue
        ckpt = str(resume) if resume else None
        calls.append(trainer.run.remote(total, consumer, stage.evaluates, ckpt, linger))
    outs = wait_all(calls, hub, monitor)
    if stage.explores and cfg.explorer.eval_on_startup:
        first = next((r for r in monitor.history if r["step"] == offset), {})
        eval_start = accuracies(first)
    train_out = outs[-1] if trainer is not None else {}
    steps = train_out.get("train_steps", outs[0].get("explore_steps", 0) if outs else 0)
    return eval_start, steps, train_out


def plan_steps(cfg: Any, explores: bool, sizes: dict[str, int]) -> int | None:
    """The stage's steps: the explicit budget, at most what the taskset (or dataset) gives.
    None: mode train reading a queue without a budget, trained until its explorers finish."""
    explicit = cfg.buffer.total_steps or cfg.trainer.total_steps
    eb = cfg.buffer.trainer_input.experience_buffer
    if not explores and reads_experiences(cfg):
        return int(explicit) if explicit else None
    epochs = cfg.buffer.total_epochs
    if explores:
        n, per_step = sizes.get("train_tasks", 0), cfg.buffer.batch_size
    else:
        n = sizes.get("dataset_size", 0)
        per_step = cfg.buffer.train_batch_size or cfg.buffer.batch_size
        epochs = (eb.total_epochs if eb is not None else None) or epochs  # as DatasetSource
    if n == 0:
        raise ValueError("no data: the taskset / dataset of this stage is empty")
    planned = math.ceil(n * epochs / per_step)  # selectors fill batches across epochs
    if explores and "explore_tasks" in sizes:  # tasksets mixed by ratio: the mix's own length
        planned = math.ceil(sizes["explore_tasks"] / per_step)
    return min(explicit, planned) if explicit else planned


def run_bench(stage: StagePlan, model_path: str, ctx: RunContext) -> StageResult:
    """Mode bench (`trinity.launcher.bench`): one evaluation per checkpoint, then a table. In
    the one-process layout the explorer is an object of the run's ServiceHost."""
    t0 = time.perf_counter()
    cfg, hub, monitor = stage.cfg, ctx.hub, ctx.monitor
    if not cfg.buffer.explorer_input.eval_tasksets:  # pre-flight refuses this config
        raise ValueError("mode bench: the last stage has no eval_tasksets to evaluate on")
    run_dir = Path(stage.resolved.run_dir)
    points, what = bench_points(cfg, run_dir, model_path)
    monitor.console.print(what, soft_wrap=True)
    plan = resource_plan(cfg, trains=False, has_engines=True, lockstep=True, nodes=ctx.nodes)
    monitor.console.print(plan.describe(), soft_wrap=True)
    args = (cfg, model_path, None, None, hub, 0, plan.engine, ctx.nodes)
    parts = StageParts(stage, ctx)
    role = f"explorer/{cfg.explorer.name}"
    explorer = parts.start(
        Explorer,
        role,
        *args,
        compute=True,
        **explorer_reservation(cfg, plan.engine),
        **workflow_env.actor_options(cfg),
    )
    try:
        refs.get(explorer.prepare.remote(with_train_tasks=False))
        refs.get(hub.begin_stage.remote(stage.name))
        ctx.progress = Progress(stage.name, 0, None, stage.stage_dir)
        monitor.begin_stage(stage.name, {"bench"}, points[-1].step, first_step=0)
        rows, samples, t_eval = [], [], time.perf_counter()
        for i, p in enumerate(points):
            if i > 0 or p.step > 0:  # the engines start with model.model_path loaded
                refs.get(explorer.load_weights.remote(p.path, p.step))
            call = explorer.evaluate.remote(p.step, source="bench", keep_samples=True)
            metrics = wait(call, hub, monitor)
            evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            rows.append({"checkpoint": p.label, "step": p.step, **evals})
            got = refs.get(explorer.take_eval_samples.remote())
            samples += [{"checkpoint": p.label, "step": p.step, **s} for s in got]
            done = progress_line(i + 1, len(points), time.perf_counter() - t_eval)
            monitor.console.print(done, soft_wrap=True)
        monitor.end_stage()
    finally:
        parts.release()
    sample_path = write_samples(run_dir, samples)
    path, table = write_table(run_dir, rows)
    monitor.console.print(table, markup=False, highlight=False, soft_wrap=True)
    monitor.console.print(f"bench results: {path}, {sample_path}", soft_wrap=True)
    return StageResult(
        name=stage.name,
        mode="bench",
        steps=0,
        checkpoint=None,
        # "at start" is the base model (step 0) only: a bench of checkpoints alone has no start
        eval_start=accuracies(rows[0]) if points[0].step == 0 else {},
        eval_end=accuracies(rows[-1]),
        seconds=time.perf_counter() - t0,
    )
