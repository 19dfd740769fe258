"""`trinity run`: start Ray, run each stage's explorer/trainer/buffer/synchronizer, summarise.

Every long-lived part is a Ray actor; the driver (this process) only wires them together, moves
metrics from the hub to the monitor, and turns any actor's exception into a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import storage_class
from trinity.common.core_shares import REPRODUCIBLE_MKL
from trinity.common.memory import GB, TreePssSampler
from trinity.common.placement import describe as describe_nodes
from trinity.common.placement import node_resources, on_node, run_nodes
from trinity.common.plugins import plugin_env
from trinity.common.resources import ResourcePlan, plan_resources
from trinity.common.service_host import HOST_CONCURRENCY, ServiceHost, hosted
from trinity.common.shared import RunName
from trinity.common.startup import StartupMarks, process_started_at, timeline
from trinity.config import format_batch_table, resolve, seeds, stage_configs
from trinity.config.resolved import in_lockstep, overlaps_in_one_process
from trinity.config.run_folder import (
    fresh_name,
    has_content,
    joins_existing_run,
    trains_from_queue,
)
from trinity.explorer.engine_pools import explorer_reservation, start_engine_pools
from trinity.explorer.explorer import Explorer
from trinity.launcher.bench import bench_points, write_table
from trinity.monitor.backends import RunInfo, monitor_types
from trinity.monitor.hub import MetricsHub
from trinity.monitor.monitor import Monitor
from trinity.sync.schedule import explorer_sync, versions_to_keep
from trinity.sync.synchronizer import SynchronizerActor
from trinity.trainer.checkpoint import checkpoint_step, latest_resumable, trained_leases
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
    metrics_file: str = "metrics.jsonl"
    outputs: list[str] = field(default_factory=lambda: ["metrics.jsonl"])
    peak_pss_gb: float | None = None
    """Peak PSS of this process and its descendants during the run (sampled every 2 s): with a
    Ray instance this process started, that is the driver, Ray's own processes and every actor."""
    startup: dict[str, float] = field(default_factory=dict)
    """The start-up timeline (`startup/<mark>_s`, seconds since the driver's process start) of
    the run's first step, when this process ran it (`common.startup`)."""


REPORTS_WAIT_S = 5.0  # the longest one `MetricsHub.reports` call waits (the driver calls again)
ONE_PROCESS_IMPORTS = (
    "torch",
    "transformers.modeling_utils",  # the bulk of a model class's import
    "trinity.explorer.explorer",
    "trinity.trainer.trainer",
)
"""What the ServiceHost of a `cluster.one_process` run imports as it starts."""


def run_namespace(cfg: Any) -> str:
    """The Ray namespace of a run, `trinity:<project>/<group>/<name>`: its actors' names live
    there, so two processes of one run (mode explore + mode train) find each other by name and
    two runs never do."""
    return "trinity:" + "/".join(p for p in (cfg.project, cfg.group, cfg.name) if p)


def init_ray(address: str, namespace: str | None = None) -> bool:
    """Join the configured cluster, or start a private local instance.

    `auto` joins a cluster started with `ray start` (its address file, or RAY_ADDRESS) and
    otherwise starts a local instance that lives as long as this run; `RAY_ADDRESS=local` (Ray's
    own name for a new instance, which the test suite sets) announces no cluster, so `auto` then
    starts a local instance even where an address file names a live one. It deliberately does not
    use Ray's own `address="auto"`, which also attaches to another driver's private instance and
    dies with it. A cluster that is named but does not answer (a `ray start --head` that was
    killed leaves its address file behind) is reported and replaced by a local instance within
    seconds, instead of Ray retrying the dead address for half a minute and failing. An explicit
    `ray_address` that does not answer is an error. Returns whether it joined a cluster (False:
    a local instance of this process).

    The user's plugin directories (`TRINITY_PLUGIN_DIRS`, which `--plugin-dir` sets) reach every
    actor of the run, engines included, as the job's runtime_env: the workers of a `ray start`
    cluster never see this process's environment, and an actor loads them on its first registry
    miss (`trinity.common.plugins`). A caller that started Ray itself passes that env itself.
    """
    if ray.is_initialized():
        return True
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "ERROR",
        "configure_logging": True,
        "namespace": namespace,
    }
    if env_vars := plugin_env():
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if address == "local":  # Ray's name for a new local instance
        ray.init(address="local", **kwargs)
        return False
    if address != "auto":
        if "://" not in address and not _answers(address):
            raise ConnectionError(
                f"cluster.ray_address={address!r}: no Ray cluster answers there "
                "(start one with `ray start --head`, or use ray_address: auto)"
            )
        ray.init(address=address, **kwargs)
        return address != "local"
    found, source = _announced_address()
    if found is not None and "://" not in found and not _answers(found):
        Console(stderr=True, highlight=False).print(
            f"[yellow]the Ray cluster at {found} ({source}) does not answer; "
            "starting a local instance[/]",
            soft_wrap=True,
        )
        ray.init(address="local", **kwargs)
        return False
    ray.init(**kwargs)
    return found is not None


def _announced_address() -> tuple[str | None, str]:
    """The cluster `ray.init()` would join: RAY_ADDRESS, else `ray start`'s address file."""
    env = os.environ.get("RAY_ADDRESS")
    if env == "local":
        return None, "RAY_ADDRESS=local"
    if env and env != "auto":
        return env, "RAY_ADDRESS"
    from ray._private.utils import get_ray_address_file, read_ray_address

    return read_ray_address(), f"from {get_ray_address_file(None)}"


def _answers(address: str, timeout: float = 2.0) -> bool:
    """Does something accept TCP connections at `host:port` (a Ray GCS, if anything)?"""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def run(config: Any, console: Console | None = None) -> RunResult:
    """Run every stage of `config` in order, each starting from the previous stage's model.

    `config` must have passed `trinity.config.preflight.preflight` (as `trinity run` does).
    """
    console = console or Console(highlight=False)
    t0 = time.perf_counter()
    startup = StartupMarks()  # the start-up timeline (common.startup), from this process's start
    startup.mark("config")  # the CLI loaded and checked the config before calling this
    if lends_cores(config):  # a local Ray's workers inherit it (common.core_shares)
        os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_MKL)
    joined = init_ray(config.cluster.ray_address, run_namespace(config))
    startup.mark("ray")
    pss = TreePssSampler(os.getpid()).start()
    name_actor = None
    if config.mode in ("explore", "train", "serve") and joins_existing_run(config):
        config, name_actor = agree_on_name(config, console)
    else:
        config = _fresh_folder_unless_continuing(config, console)
    stages = stage_configs(config)
    if config.mode == "bench" and config.stages:  # bench the run its stages wrote
        stages = [stages[-1].model_copy(update={"mode": "bench", "stage_name": "bench"})]
    nodes = run_nodes(config.cluster.node_num, joined)
    run_dir = Path(resolve(config).run_dir)
    part = _run_part(config)
    info = RunInfo(
        run_dir, config.project, config.group, config.name, part, config.model_dump(mode="json")
    )
    mon = config.monitor
    types = monitor_types(mon.monitor_type)
    monitor = Monitor(run_dir, types, console, part=part, info=info, monitor_args=mon.monitor_args)
    # the run's small services share one process (common.service_host): the hub now, each
    # stage's synchronizer and buffer when no other process of the run shares them
    # cluster.one_process: the explorer and the trainer join them there, and the host imports
    # their torch and transformers as it starts, while this process sets the first stage up
    preload = ONE_PROCESS_IMPORTS if config.cluster.one_process else ()
    host = (
        ray.remote(ServiceHost)
        .options(num_cpus=0, max_concurrency=HOST_CONCURRENCY)
        .remote(preload)
    )
    # reports from the explorer and trainer while the driver's `reports` call waits
    hub = hosted(host, "hub", MetricsHub, str(monitor.journal_path), max_concurrency=64)
    model_path = seeds.model_path(config)
    results: list[StageResult] = []
    offset = 0
    try:
        for i, cfg in enumerate(stages):
            name = cfg.stage_name or ("main" if len(stages) == 1 else f"stage{i}")
            stage_dir = run_dir if len(stages) == 1 else run_dir / name
            console.print(f"[bold cyan]stage {name}[/] mode={cfg.mode} model={model_path}")
            console.print(format_batch_table(resolve(cfg)), markup=False, highlight=False)
            resume = latest_resumable(stage_dir) if config.continue_from_checkpoint else None
            if resume is not None:
                console.print(f"resuming stage {name} from {resume}", soft_wrap=True)
            res = run_stage(
                cfg, name, model_path, stage_dir, hub, monitor, offset,
                config.continue_from_checkpoint, resume, nodes, name_actor,
                startup if i == 0 else None, host,
            )  # fmt: skip
            results.append(res)
            model_path = res.checkpoint or model_path
            offset += res.steps
    finally:
        peak_pss = pss.stop()
        monitor.close()
        if mon.enable_ray_timeline:  # every task and actor call of the run, for chrome://tracing
            time.sleep(_task_events_flush_s())  # the last calls' events reach Ray's GCS
            ray.timeline(
                filename=str(run_dir / (f"timeline.{part}.json" if part else "timeline.json"))
            )
        ray.kill(host)
        if name_actor is not None and ray.get(name_actor.detach.remote(_process_role(config))) == 0:
            ray.kill(name_actor)
    summary_name = f"summary.{part}.json" if part else "summary.json"
    result = RunResult(
        run_dir=run_dir,
        stages=results,
        seconds=time.perf_counter() - t0,
        metrics_file=monitor.jsonl_path.name,
        outputs=[*monitor.outputs, summary_name],
        peak_pss_gb=peak_pss / GB,
        startup=next(
            (
                {k: v for k, v in r.items() if k.startswith("startup/")}
                for r in monitor.history
                if "startup/ray_s" in r
            ),
            {},
        ),
    )
    write_summary(result, run_dir / summary_name, joined)
    print_summary(result, console, joined)
    return result


def lends_cores(config: Any) -> bool:
    """Whether a stage of this run has an explorer and a trainer computing at once in one
    process, which lend each other their idle cores (`common.core_shares`); only such a run
    asks MKL for results independent of the thread count (in lockstep each side computes
    alone, with MKL's default code paths, bit for bit as a run of several processes)."""
    return any(overlaps_in_one_process(stage) for stage in stage_configs(config))


def _task_events_flush_s() -> float:
    """How long until every live worker has sent Ray the events of the calls it finished: its
    report interval (`RAY_task_events_report_interval_ms`, 1 s by default) and a margin."""
    return int(os.environ.get("RAY_task_events_report_interval_ms", "1000")) / 1000 + 0.5  # noqa: SIM112


def write_summary(result: RunResult, path: Path, joined: bool) -> None:
    """What the closing summary prints, as JSON beside the metrics (replaced atomically): each
    stage's steps, seconds, evals and checkpoint, the wall time and the peak PSS with its scope
    (`tree`: driver, Ray and every actor; `driver`: this process only, in a cluster it joined)."""
    record = {
        "wall_seconds": result.seconds,
        "peak_pss_gb": result.peak_pss_gb,
        "peak_pss_scope": "driver" if joined else "tree",
        "startup_seconds": {k.removeprefix("startup/"): v for k, v in result.startup.items()},
        "stages": [dataclasses.asdict(s) for s in result.stages],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def _process_role(cfg: Any) -> str:
    """Who this process is in a split run: a process started again under its role (after a
    crash) takes its own place (`common.shared.RefCounted`)."""
    return f"explorer/{cfg.explorer.name}" if cfg.mode in ("explore", "serve") else "trainer"


def agree_on_name(config: Any, console: Console) -> tuple[Any, Any]:
    """The run (folder and actors' namespace) a process of a split run belongs to.

    While any process of the run lives, every process joins it, whatever
    `continue_from_checkpoint` says: that is what a second process, or a crashed one started
    again alone, is for. The first process of a run decides: with `continue_from_checkpoint:
    false` on a folder of a run that ended (its trainer finished its buffer), the run is
    `<name>_<timestamp>` (as a single-process run), so it neither trains the earlier run's
    leftover experiences nor mixes groups with them; a folder whose trainer has not finished
    (explorers ran first, the trainer comes now) is this run's. Returns the config under the agreed name and the actor holding it (detach at the end).
    """
    run_dir = Path(resolve(config).run_dir)
    # a folder whose run ended (its trainer finished the buffer) is an earlier run; one whose
    # trainer has not come yet (explorers first, then the trainer) is this run
    logs = list(run_dir.glob("**/buffer/*.db"))
    ended = bool(logs) and all(SQLiteLog.run_finished(p) for p in logs)
    fresh = not config.continue_from_checkpoint and has_content(run_dir) and ended
    proposal = fresh_name(config.name) if fresh else config.name
    actor = (
        ray.remote(RunName)
        .options(num_cpus=0, name="run-name", get_if_exists=True, lifetime="detached")
        .remote(proposal)
    )
    ray.get(actor.attach.remote(_process_role(config)))
    name = ray.get(actor.get.remote())
    if name != config.name:
        console.print(
            f"[yellow]{run_dir} is in use by an earlier run (continue_from_checkpoint: false): "
            f"this run is named {name!r}[/]",
            soft_wrap=True,
        )
        config = config.model_copy(update={"name": name})
    return config, actor


def _fresh_folder_unless_continuing(config: Any, console: Console) -> Any:
    """`continue_from_checkpoint: false` on a folder in use: run as `<name>_<timestamp>`."""
    run_dir = Path(resolve(config).run_dir)
    if config.continue_from_checkpoint or joins_existing_run(config) or not has_content(run_dir):
        return config
    name = fresh_name(config.name)
    console.print(
        f"[yellow]{run_dir} is in use by an earlier run (continue_from_checkpoint: false): "
        f"this run is named {name!r}[/]",
        soft_wrap=True,
    )
    return config.model_copy(update={"name": name})


def run_stage(
    cfg: Any,
    name: str,
    model_path: str,
    stage_dir: Path,
    hub: Any,
    monitor: Monitor,
    offset: int,
    continuing: bool = False,
    resume: Path | None = None,
    nodes: list[str] | None = None,
    run_shares: Any = None,
    startup: StartupMarks | None = None,
    host: Any = None,
) -> StageResult:
    """One stage. `continuing` (`continue_from_checkpoint`): the explorer continues after its
    cursor in the buffer; `resume`: the stage's newest checkpoint, the trainer continues from it
    (and an explorer of the same process starts from its weights); `nodes`: the Ray nodes the
    run spreads over (`common.placement.run_nodes`; empty: one node); `run_shares`: a split
    run's `RunName` actor, whose ledger divides the cluster's cores among its processes;
    `startup`: the driver's start-up marks, for the run's first stage (its first step's record
    carries the start-up timeline, `common.startup`); `host`: the run's `ServiceHost`, which
    holds the synchronizer and the buffer when no other process shares them (else each is a
    named actor of its own).

    1. start the synchronizer, the buffer (mode both/explore), the explorer (when there is
       something to explore or evaluate) and the trainer (mode both/train)
    2. load data and plan the number of steps
    3. run explorer and trainer loops concurrently, moving metrics to the monitor
    4. final evaluation with the final weights
    """
    t0 = time.perf_counter()
    mode = cfg.mode
    if mode == "bench":
        return run_bench(cfg, name, model_path, hub, monitor, nodes or [], host)
    explores = mode in ("both", "explore")
    serves = mode == "serve"  # the endpoint for external agents: a writer of the buffer
    trains = mode in ("both", "train")
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets)
    eb = cfg.buffer.trainer_input.experience_buffer
    # mode train reading a queue: the experiences come from `mode: explore` processes
    reads_queue = trains_from_queue(cfg)
    # explore / train as separate processes share the buffer and the synchronizer (a train
    # stage from a dataset runs alone: its services are the run's ServiceHost's)
    shared = mode in ("explore", "serve") or reads_queue
    # who this process is in the run: a process started again under its role takes its place
    process_role = _process_role(cfg)
    actors: list[Any] = []  # this process's own: killed at the end of the stage
    in_host: list[str] = []  # this stage's services in the run's ServiceHost: removed at its end
    attached: list[Any] = []  # shared with other processes of the run: detached when done
    joined_live_run = [False]

    one_process = cfg.cluster.one_process and host is not None

    def start(
        cls: type, role: str, *args: Any, share: bool = False, service: bool = False,
        compute: bool = False, **resources: float,
    ) -> Any:  # fmt: skip
        """An actor of its own, or (`service`, and `compute` with `cluster.one_process`) an
        object of the run's ServiceHost, whose `resources` are then those of the host."""
        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_concurrency": 64,
            "name": f"{name}/{role}",
            "namespace": run_namespace(cfg),
        }
        options |= resources
        if share:
            options |= {"get_if_exists": True, "lifetime": "detached"}
        elif (service and host is not None) or (compute and one_process):
            in_host.append(options["name"])
            return hosted(host, options["name"], cls, *args, max_concurrency=64)
        actor = ray.remote(cls).options(**options).remote(*args)
        if share:
            if ray.get(actor.attach.remote(process_role)) and not attached:
                joined_live_run[0] = True  # the first shared actor had users already
            attached.append(actor)
        else:
            actors.append(actor)
        return actor

    try:
        # 1.
        rcfg = resolve(cfg)
        style = cfg.synchronizer.sync_style
        lockstep = in_lockstep(cfg)  # trainer and engines never compute at the same time
        # a process of a split run: another process computes beside it on the same cluster
        split = mode in ("explore", "serve") or reads_queue
        nodes = nodes or []
        plan = _resource_plan(
            cfg, trains, explores or evaluates, lockstep, split, nodes, run_shares
        )
        monitor.console.print(plan.describe(), soft_wrap=True)
        on_gpu = [s for s in (plan.trainer, plan.engine) if s is not None and s.num_gpus > 0]
        if rcfg.sync_method == "shared" and on_gpu:
            raise ValueError(
                "synchronizer.sync_method shared: the trainer and engines share CPU memory, but "
                "Ray gives this run's compute actors GPUs; use nccl or memory, or "
                "cluster.gpu_per_node: 0 to train on CPU"
            )
        if one_process and on_gpu:  # the check refuses gpu_per_node; this is what Ray has
            raise ValueError(
                "cluster.one_process: not built yet on GPUs, and Ray gives this run's compute "
                "actors GPUs; set cluster.gpu_per_node: 0 to run on CPUs, or leave one_process off"
            )
        if rcfg.sync_method == "nccl" and plan.gpu_shared():
            cfg, note = _sync_by_memory(cfg, plan)
            rcfg = resolve(cfg)
            monitor.console.print(f"[yellow]{note}[/]", soft_wrap=True)
        keep = versions_to_keep(rcfg.sync_interval, rcfg.sync_offset, explores and trains, style)
        if shared:  # an explorer in another process may be loading the previous version
            keep = max(keep, 2)
        sync = start(
            SynchronizerActor, "synchronizer", rcfg.sync_method, keep, share=shared, service=True
        )
        if shared and joined_live_run[0]:
            # another process of this run is live (or this role's own dead process left it):
            # this process continues the run, whatever continue_from_checkpoint says
            continuing = True
            if trains and resume is None:
                resume = latest_resumable(stage_dir)
            monitor.console.print(
                f"joining the live run in {stage_dir} (with {', '.join(ray.get(sync.users.remote()))})"
                + (f"; the trainer resumes from {resume}" if trains and resume else ""),
                soft_wrap=True,
            )
        buffer = None
        if explores or serves or reads_queue:
            buf_name = eb.name if eb and eb.name else "experience_buffer"
            capacity = eb.capacity if eb else 10000
            storage = storage_class(eb.storage_type if eb else "queue")
            path = str(stage_dir / "buffer" / f"{buf_name}.db")
            # whichever process of a run creates the buffer settles the leases the run's newest
            # checkpoint trained (an explore process may come back before the train process)
            settled = trained_leases(resume)
            buffer = start(
                storage, f"buffer/{buf_name}", path, capacity, settled, continuing,
                share=shared, service=True,
            )  # fmt: skip
        if nodes:
            engines = _engine_count(cfg) if explores or evaluates else 0
            monitor.console.print(describe_nodes(nodes, engines, trains), soft_wrap=True)
        explorer = None
        if explores or serves or evaluates:
            # the engines start beside the explorer, not from it: they import and load while
            # its process imports (`explorer.engine_pools`)
            pools = start_engine_pools(cfg, model_path, plan.engine, nodes)
            actors.extend(pools.all())
            explorer = start(
                Explorer, f"explorer/{cfg.explorer.name}", cfg, model_path, buffer, sync, hub,
                offset, plan.engine, nodes, run_shares if mode == "explore" else None, pools,
                compute=True, **explorer_reservation(cfg, plan.engine),
            )  # fmt: skip
        trainer = None
        if trains:
            assert plan.trainer is not None
            trainer = start(
                TrainerRunner, "trainer", cfg, model_path, str(stage_dir), buffer, sync, hub,
                offset, plan.trainer.threads, compute=True,
                num_cpus=plan.trainer.num_cpus, num_gpus=plan.trainer.num_gpus,
                **on_node(nodes, 0),
            )  # fmt: skip
        # 2.
        prep = []
        # a resumed or continued run's first step here is not the run's: no start-up timeline
        fresh = startup is not None and resume is None and not continuing
        started_at = process_started_at() if fresh else None
        if explorer is not None:
            prep.append(explorer.prepare.remote(explores, started_at))
        if trainer is not None:
            prep.append(trainer.prepare.remote(None, buffer is None, started_at))
        sizes: dict[str, int] = {}
        for d in ray.get(prep):
            sizes.update(d)
        # None: a trainer reading until explorers end, or an endpoint serving until it does
        total = None if serves else _plan_steps(cfg, explores, sizes)
        sources = ({"explorer"} if explores or serves else set()) | (
            {"trainer"} if trains else set()
        )
        ray.get(hub.begin_stage.remote(name))
        monitor.begin_stage(
            name,
            sources,
            offset + (total or 0),
            {"final_eval"} if evaluates else set(),
            first_step=offset,
        )
        if fresh and total != 0:  # the driver's marks join the first step's record
            monitor.add("driver", offset + 1, startup.as_metrics(started_at))
        # 3.
        eval_start: dict[str, float] = {}
        startup_eval = not explores and not serves and cfg.explorer.eval_on_startup
        if explorer is not None and startup_eval and not resume:
            eval_start = _accuracies(_wait(explorer.evaluate.remote(0), hub, monitor))
        refs = []
        if serves:
            url = ray.get(explorer.start_serving.remote())
            monitor.console.print(
                f"serving {cfg.model.model_path} at {url} (chat/completions, completions; "
                f"POST {url.removesuffix('/v1')}/feedback and /commit)",
                soft_wrap=True,
            )
            refs.append(explorer.serve.remote())
        if explores:
            # mode both, fixed: the exact version the schedule names; explore or trainer_driven:
            # the newest, if any; explorer_driven: the trainer's current weights, on request
            weights = (str(resume), checkpoint_step(resume)) if resume and trains else None
            how = explorer_sync(style, trainer_in_run=trains)
            refs.append(explorer.run.remote(total, sync=how, resume=continuing, weights=weights))
        if trainer is not None:
            # publish only for a consumer: an explorer that syncs (this process's or, reading a
            # queue, another's); the final evaluation
            # a split run's trainer with a step budget waits for an explorer started after the
            # others finished, up to the read timeout; without a budget they end it
            linger = 0.0
            if reads_queue and total is not None:
                linger = eb.max_read_timeout if eb is not None else 1800.0
            refs.append(
                trainer.run.remote(
                    total,
                    explores or reads_queue,
                    evaluates,
                    str(resume) if resume else None,
                    linger,
                )
            )
        outs = _wait_all(refs, hub, monitor)
        if explores and cfg.explorer.eval_on_startup:
            first = next((r for r in monitor.history if r["step"] == offset), {})
            eval_start = {k: v for k, v in first.items() if k.endswith("/accuracy")}
        train_out = outs[-1] if trainer is not None else {}
        steps = train_out.get("train_steps", outs[0].get("explore_steps", 0) if outs else 0)
        # 4.
        eval_end: dict[str, float] = {}
        if explorer is not None and evaluates and not serves:
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
        if actors and cfg.monitor.enable_ray_timeline:
            time.sleep(_task_events_flush_s())  # their calls' events reach Ray before they go
        for a in actors:
            ray.kill(a)
        # a dead host took its services with it (and the stage's own error is the one to raise)
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get([host.remove.remote(n) for n in in_host])
        for a in attached:  # the last process of the run to let go ends a shared actor
            if ray.get(a.detach.remote(process_role)) == 0:
                ray.kill(a)


def run_bench(
    cfg: Any,
    name: str,
    model_path: str,
    hub: Any,
    monitor: Monitor,
    nodes: list[str],
    host: Any = None,
) -> StageResult:
    """Mode bench (`trinity.launcher.bench`): one evaluation per checkpoint, then a table. With
    `cluster.one_process` the explorer is an object of the run's ServiceHost (`host`)."""
    t0 = time.perf_counter()
    if not cfg.buffer.explorer_input.eval_tasksets:  # pre-flight refuses this config
        raise ValueError("mode bench: the last stage has no eval_tasksets to evaluate on")
    run_dir = Path(resolve(cfg).run_dir)
    points, what = bench_points(cfg, run_dir, model_path)
    monitor.console.print(what, soft_wrap=True)
    plan = _resource_plan(cfg, trains=False, has_engines=True, lockstep=True, nodes=nodes)
    monitor.console.print(plan.describe(), soft_wrap=True)
    role = f"{name}/explorer/{cfg.explorer.name}"
    args = (cfg, model_path, None, None, hub, 0, plan.engine, nodes)
    one_process = cfg.cluster.one_process and host is not None
    explorer = (
        hosted(host, role, Explorer, *args, max_concurrency=64)
        if one_process
        else ray.remote(Explorer)
        .options(max_concurrency=64, name=role, **explorer_reservation(cfg, plan.engine))
        .remote(*args)
    )
    try:
        ray.get(explorer.prepare.remote(with_train_tasks=False))
        ray.get(hub.begin_stage.remote(name))
        monitor.begin_stage(name, {"bench"}, points[-1].step, first_step=0)
        rows = []
        for i, p in enumerate(points):
            if i > 0 or p.step > 0:  # the engines start with model.model_path loaded
                ray.get(explorer.load_weights.remote(p.path, p.step))
            metrics = _wait(explorer.evaluate.remote(p.step, source="bench"), hub, monitor)
            rows.append({"checkpoint": p.label, "step": p.step, **_accuracies(metrics)})
        monitor.end_stage()
    finally:
        if one_process:
            with contextlib.suppress(ray.exceptions.RayActorError):  # a dead host took it along
                ray.get(host.remove.remote(role))
        else:
            ray.kill(explorer)
    path, table = write_table(run_dir, rows)
    monitor.console.print(table, markup=False, highlight=False, soft_wrap=True)
    monitor.console.print(f"bench results: {path}", soft_wrap=True)
    return StageResult(
        name=name,
        mode="bench",
        steps=0,
        checkpoint=None,
        # "at start" is the base model (step 0) only: a bench of checkpoints alone has no start
        eval_start={k: v for k, v in rows[0].items() if k.endswith("/accuracy")}
        if points[0].step == 0
        else {},
        eval_end={k: v for k, v in rows[-1].items() if k.endswith("/accuracy")},
        seconds=time.perf_counter() - t0,
    )


def _sync_by_memory(cfg: Any, plan: ResourcePlan) -> tuple[Any, str]:
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


def _resource_plan(
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
    have = _settled_resources(split)
    rm = cfg.explorer.rollout_model
    engines = _engine_count(cfg) if has_engines else 0
    if nodes:
        have = node_resources(nodes)
        engines = len(range(0, engines, len(nodes)))  # those on the first node
    cpus, note = have.get("CPU", 0.0), ""
    if split and run_shares is not None:
        role = _process_role(cfg)
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
    )
    return dataclasses.replace(plan, run_share=note)


def _engine_count(cfg: Any) -> int:
    """The explorer's engines: the rollout model's and those of the auxiliary models it serves
    (`explorer.auxiliary`); each takes one engine share."""
    from trinity.explorer.auxiliary import auxiliary_engines

    return cfg.explorer.rollout_model.engine_num + auxiliary_engines(cfg)


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


def _run_part(cfg: Any) -> str:
    """This process's share of a run split over processes ("" for a whole run): mode explore,
    or mode train reading a queue that explore processes fill. Names its metrics file."""
    if cfg.mode == "bench":
        return "bench"
    if cfg.mode in ("explore", "serve"):
        return f"explorer-{cfg.explorer.name}"
    if trains_from_queue(cfg):
        return "trainer"
    return ""


def _plan_steps(cfg: Any, explores: bool, sizes: dict[str, int]) -> int | None:
    """The stage's steps: the explicit budget, at most what the taskset (or dataset) gives.
    None: mode train reading a queue without a budget, trained until its explorers finish."""
    explicit = cfg.buffer.total_steps or cfg.trainer.total_steps
    eb = cfg.buffer.trainer_input.experience_buffer
    if not explores and eb is not None and eb.storage_type == "queue":
        return int(explicit) if explicit else None
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


def _merge(reports: list[Any], monitor: Monitor) -> None:
    for source, step, metrics, replay in reports:
        monitor.add(source, step, metrics, replay)


def _pump(hub: Any, monitor: Monitor) -> None:
    _merge(ray.get(hub.drain.remote()), monitor)


def _wait(ref: Any, hub: Any, monitor: Monitor) -> Any:
    return _wait_all([ref], hub, monitor)[0]


def _wait_all(refs: list[Any], hub: Any, monitor: Monitor) -> list[Any]:
    """Wait for all refs while merging the hub's reports as they come (`MetricsHub.reports`).
    The first failure is raised at once, after what the other actors reported is kept."""
    pending = list(refs)
    news = hub.reports.remote(REPORTS_WAIT_S)
    try:
        while pending:
            done, _ = ray.wait([*pending, news], num_returns=1)
            if done[0] == news:
                _merge(ray.get(news), monitor)
                news = hub.reports.remote(REPORTS_WAIT_S)
                continue
            pending.remove(done[0])
            ray.get(done[0])  # raises the actor's exception, with its traceback
    except BaseException as err:
        try:
            _settle(hub, news, monitor)
        except Exception as lost:
            err.add_note(f"the reports made before this failure were not merged: {lost!r}")
        raise
    _settle(hub, news, monitor)
    return ray.get(refs)


def _settle(hub: Any, news: Any, monitor: Monitor) -> None:
    """Merge the waiting `reports` call's reports (ended now) and any left in the hub."""
    hub.wake.remote()
    _merge(ray.get(news), monitor)
    _pump(hub, monitor)


def print_summary(result: RunResult, console: Console, joined: bool = False) -> None:
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
    if line := timeline(result.startup):
        console.print(f"start-up  {line} (since the driver's start)", soft_wrap=True)
    if result.peak_pss_gb is not None:
        whose = (
            "this process only: the Ray cluster it joined is not its child"
            if joined
            else "driver, Ray and every actor"
        )
        console.print(f"peak PSS  {result.peak_pss_gb:.2f} GB ({whose}; sampled every 2 s)")
    console.print(f"outputs   {result.run_dir} ({', '.join(result.outputs)})", soft_wrap=True)
    console.print(f"plots     trinity report {result.run_dir}", soft_wrap=True)
