"""`trinity run`: plan the run, start Ray, run each stage from its plan, summarise.

    result = run(cfg)        # cfg from `load_config`, past pre-flight (as `trinity run` does)

1. plan: every decision the config makes, once (`launcher.plan`: layout, stages, roles)
2. join or start Ray (a one-process run that needs none starts none: `common.local_host`);
   agree on the run's name (a fresh `<name>_<timestamp>` beside an earlier
   run's folder, or the live run another process of a split run started)
3. set up what the stages share: the monitor, the run's `ServiceHost` and its metrics hub
4. run each stage (`launcher.stage.run_stage`), each from the previous stage's model
5. summarise; a run that stops before its end says where it stood and how to continue

Every long-lived part is a Ray actor, or an object of the run's ServiceHost; the driver (this
process) only wires them together, moves metrics from the hub to the monitor, and turns any
actor's exception into a non-zero exit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from trinity.common.core_shares import REPRODUCIBLE_MKL
from trinity.common.local_host import LocalHost
from trinity.common.memory import GB, TreePssSampler
from trinity.common.placement import run_nodes
from trinity.common.seals import allow_sealing
from trinity.common.service_host import HOST_CONCURRENCY, ServiceHost, hosted
from trinity.common.startup import StartupMarks
from trinity.config import seeds
from trinity.config.run_folder import joins_existing_run, trains_from_queue
from trinity.config.secrets import redacted
from trinity.explorer.external_endpoint import endpoint_env
from trinity.launcher.naming import agree_on_name, fresh_folder_unless_continuing
from trinity.launcher.plan import RunPlan, plan_run, process_role
from trinity.launcher.ray_init import (
    init_ray,
    kill_and_wait,
    run_namespace,
    stops_as_interrupts,
    task_events_flush_s,
)
from trinity.launcher.stage import RunContext, run_stage
from trinity.launcher.summary import (
    RunResult,
    StageResult,
    StopRecord,
    print_summary,
    stop_lines,
    write_summary,
)
from trinity.monitor.backends import RunInfo, monitor_types
from trinity.monitor.hub import MetricsHub
from trinity.monitor.monitor import Monitor
from trinity.monitor.stall import StallDoctor
from trinity.trainer.checkpoint import latest_resumable

__all__ = ["RunResult", "StageResult", "init_ray", "lends_cores", "run", "run_namespace"]

ONE_PROCESS_IMPORTS = (
    "torch",
    "transformers.modeling_utils",  # the bulk of a model class's import
    "trinity.explorer.explorer",
    "trinity.trainer.trainer",
)
"""What the ServiceHost of a one-process run imports as it starts."""


def run(
    config: Any, console: Console | None = None, plan: RunPlan | None = None,
    record: Path | None = None,
) -> RunResult:  # fmt: skip
    """Run every stage of `config` in order (module docstring). `plan`: `plan_run(config)`,
    when the caller made it already; `record`: a file to keep the run's `StopRecord` in as it
    goes (`launcher.supervise`)."""
    console = console or Console(highlight=False)
    t0 = time.perf_counter()
    startup = StartupMarks()  # the start-up timeline (common.startup), from this process's start
    startup.mark("config")  # the CLI loaded and checked the config before calling this
    # 1.
    plan = plan or plan_run(config)
    if plan.lends_cores:  # a local Ray's workers inherit it (common.core_shares)
        os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_MKL)
    # 2.
    stops_as_interrupts()
    joined = False
    if plan.layout.ray:
        joined = init_ray(
            config.cluster.ray_address, run_namespace(config), endpoint_env(config.model)
        )
        stops_as_interrupts()  # Ray's core worker installs handlers of its own
    else:  # a run folder this process stopped sealing in (an earlier run of it) is new again
        allow_sealing(plan.run_dir)
    startup.mark("ray")
    pss = TreePssSampler(os.getpid()).start()
    asked = plan.cfg.name
    config, name_actor = _agree_on_name(plan.cfg, console)
    plan = plan.renamed(config.name)
    rename = config.name if config.name != asked else None  # to name in the resume command
    console.print(plan.layout.describe(), soft_wrap=True)
    # 3.
    run_dir, part = plan.run_dir, _run_part(plan.cfg)
    info = RunInfo(
        run_dir, config.project, config.group, config.name, part,
        redacted(config.model_dump(mode="json")),  # the backends' copy: no secrets
    )  # fmt: skip
    mon = config.monitor
    types = monitor_types(mon.monitor_type)
    monitor = Monitor(run_dir, types, console, part=part, info=info, monitor_args=mon.monitor_args)
    monitor.doctor = StallDoctor(
        run_dir,
        mon.stall_timeout,
        mon.on_stall,
        lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True),
    )
    # the run's small services share one process (common.service_host): the hub now, each
    # stage's synchronizer and buffer when no other process of the run shares them; in the
    # one-process layout the explorer and the trainer join them there, and the host imports
    # their torch and transformers as it starts, while this process sets the first stage up
    preload = ONE_PROCESS_IMPORTS if plan.layout.one_process else ()
    host = start_host(plan, preload)
    # reports from the explorer and trainer while the driver's `reports` call waits
    hub = hosted(host, "hub", MetricsHub, str(monitor.journal_path), max_concurrency=64)
    ctx = RunContext(
        hub, monitor, host, run_nodes(config.cluster.node_num, joined), name_actor,
        config.continue_from_checkpoint,
    )  # fmt: skip
    if record is not None:
        mode, continuing = plan.cfg.mode, config.continue_from_checkpoint

        def keep() -> None:
            last = dict(monitor.last_steps)
            StopRecord(ctx.progress, last, mode, continuing, rename).write(record)

        keep()
        monitor.watchers.append(keep)
    results: list[StageResult] = []
    try:
        # 4.
        results = _run_stages(plan, ctx, startup)
    except BaseException as stop:
        # 5. (a stop): where the run stood and the command that continues it, once the run's
        # compute is gone (a trainer left running could seal a newer checkpoint than the one named)
        ended = end_host(host, plan, stopped=True)
        lines = _stop_lines(stop, plan, ctx, config.continue_from_checkpoint, rename)
        if not ended:
            lines.append("the run's host did not end within 30 s: a newer checkpoint may appear")
        for line in lines:
            console.print(f"[yellow]{line}[/]", soft_wrap=True)
        raise
    finally:
        peak_pss = pss.stop()
        monitor.close()
        if mon.enable_ray_timeline:  # every task and actor call of the run, for chrome://tracing
            time.sleep(task_events_flush_s())  # the last calls' events reach Ray's GCS
            ray.timeline(
                filename=str(run_dir / (f"timeline.{part}.json" if part else "timeline.json"))
            )
        end_host(host, plan, stopped=False)
        role = process_role(plan.cfg)  # as `agree_on_name` attached it
        if name_actor is not None and ray.get(name_actor.detach.remote(role)) == 0:
            ray.kill(name_actor)
    # 5.
    summary_name = f"summary.{part}.json" if part else "summary.json"
    result = _result(run_dir, results, time.perf_counter() - t0, monitor, summary_name, peak_pss)
    write_summary(result, run_dir / summary_name, joined)
    print_summary(result, console, joined)
    return result


def start_host(plan: RunPlan, preload: tuple[str, ...]) -> Any:
    """The run's ServiceHost: a Ray actor, or, for a run without Ray, on a thread of this
    process (`common.local_host`)."""
    if not plan.layout.ray:
        return LocalHost(preload)
    options = {"num_cpus": 0, "max_concurrency": HOST_CONCURRENCY}
    return ray.remote(ServiceHost).options(**options).remote(preload)


def end_host(host: Any, plan: RunPlan, stopped: bool) -> bool:
    """Let the host go: at a stop, until no part of the run can seal a checkpoint any more
    (Ray: the actor is dead; this process: sealing in the run's folder stopped). False when a
    stopped host's actor still answered after `kill_and_wait`'s wait."""
    if isinstance(host, LocalHost):
        if stopped:
            host.halt(plan.run_dir)
        else:
            host.close()
    elif stopped:
        return kill_and_wait([host])
    else:
        ray.kill(host)
    return True


def _stop_lines(
    stop: BaseException, plan: RunPlan, ctx: RunContext, continuing: bool, rename: str | None
) -> list[str]:
    lines = stop_lines(ctx.progress, ctx.monitor.last_steps, plan.cfg.mode, continuing, rename)
    if plan.layout.one_process and isinstance(stop, ray.exceptions.RayActorError):
        lines.append(
            "the run's one process ended (a crash or an out-of-memory kill); with "
            "cluster.one_process: false each part has its own process, and Ray restarts a "
            "crashed engine's"
        )
    return lines


def _result(
    run_dir: Any, stages: list[StageResult], seconds: float, monitor: Monitor, summary: str,
    peak_pss: float,
) -> RunResult:  # fmt: skip
    startup = next(
        (
            {k: v for k, v in r.items() if k.startswith("startup/")}
            for r in monitor.history
            if "startup/ray_s" in r
        ),
        {},
    )
    return RunResult(
        run_dir=run_dir,
        stages=stages,
        seconds=seconds,
        metrics_file=monitor.jsonl_path.name,
        outputs=[*monitor.outputs, summary],
        peak_pss_gb=peak_pss / GB,
        startup=startup,
    )


def _run_stages(plan: RunPlan, ctx: RunContext, startup: StartupMarks) -> list[StageResult]:
    """Step 4: each stage in order, from the previous stage's final checkpoint."""
    console = ctx.monitor.console
    model_path = seeds.model_path(plan.cfg)
    results: list[StageResult] = []
    offset = 0
    for stage in plan.stages:
        console.print(f"[bold cyan]stage {stage.name}[/] mode={stage.mode} model={model_path}")
        console.print(stage.describe(), markup=False, highlight=False)
        resume = latest_resumable(stage.stage_dir) if ctx.continuing else None
        if resume is not None:
            console.print(f"resuming stage {stage.name} from {resume}", soft_wrap=True)
        first = startup if stage.index == 0 else None
        res = run_stage(stage, model_path, ctx, offset, resume, first)
        results.append(res)
        model_path = res.checkpoint or model_path
        offset += res.steps
    return results


def _agree_on_name(config: Any, console: Console) -> tuple[Any, Any]:
    """The run's name: a split run's processes agree on it through a named actor (returned,
    to detach at the end), a whole run takes a fresh one beside an earlier run's folder."""
    if config.mode in ("explore", "train", "serve") and joins_existing_run(config):
        return agree_on_name(config, console)
    return fresh_folder_unless_continuing(config, console), None


def lends_cores(config: Any) -> bool:
    """Whether a stage of this run has an explorer and a trainer computing at once in one
    process, which lend each other their idle cores (`common.core_shares`); only such a run
    asks MKL for results independent of the thread count (in lockstep each side computes
    alone, with MKL's default code paths, bit for bit as a run of several processes)."""
    return plan_run(config).lends_cores


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
