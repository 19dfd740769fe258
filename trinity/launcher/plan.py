"""The run's plan: every decision `trinity run` makes from the config, made once.

    plan = plan_run(cfg)              # pure but for one probe: does this machine have a GPU?
    print(plan.describe())            # what `trinity validate` shows and `trinity run` prints
    for stage in plan.stages: ...     # each stage's effective config, derived numbers and roles

A stage's config enters the launcher once, as a `StagePlan`: its effective config (the layout and
the run's agreed name applied), its derived numbers (`ResolvedConfig`), its run folder, and the
mode flags that decide which parts start (explorer, trainer, buffer, endpoint) and how they meet
(shared by name with other processes, or held by this run alone). Nothing downstream re-derives
them. What the plan cannot know comes at run time: the name a split run agrees on (`renamed`),
the cores and GPUs Ray has free (`common.resources`), the newest checkpoint to resume from.

The layout: with `cluster.one_process` unset, a run whose every stage can be one process (one
CPU-only node, mode both / train from a dataset / bench, no collective weight sync, our own
rollout engine, no process of it started elsewhere) runs its explorer, engines and trainer as objects of one process
(`common.service_host`): torch and transformers load once, and the sides lend each other their
cores. Such a run starts no Ray instance unless something in it needs one (`with_ray_or_not`:
auxiliary model engines, a Ray timeline, a cluster to join; `common.local_host`). As
Trinity-RFT colocates explorer and trainer by itself on a one-GPU cluster, this is the fastest
safe plan for a laptop; `cluster.one_process: false` keeps a process per part (an engine that
crashes is then restarted by Ray; in one process a crash ends the run, and the run says how to
resume it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity.config import format_batch_table, resolve, stage_configs
from trinity.config.resolved import ResolvedConfig, in_lockstep, trainer_strategy
from trinity.config.run_folder import trains_from_queue
from trinity.config.schema import TrinityConfig

ONE_PROCESS_MODES = ("both", "train", "bench")


@dataclass(frozen=True)
class Layout:
    """Whether the run's compute parts share one worker process, and why; whether the run
    starts (or joins) a Ray instance, and why."""

    one_process: bool
    why: str
    ray: bool = True
    ray_why: str = ""
    colocate: bool = False  # trainer and engines take turns on one device (`common.turns`)
    colocate_why: str = ""

    def describe(self) -> str:
        what = "one process" if self.one_process else "a process per part"
        line = f"layout: {what} ({self.why})"
        if self.colocate:
            line += (
                f"\ncolocation: trainer and rollout engines take turns on one device, the "
                f"engines asleep while the trainer steps ({self.colocate_why})"
            )
        if self.one_process:
            line += "\n" + (
                f"on Ray: {self.ray_why}" if self.ray else f"without Ray: {self.ray_why}"
            )
        return line


@dataclass(frozen=True)
class StagePlan:
    """One stage, decided: who starts, who is shared, and the stage's derived numbers."""

    index: int
    name: str  # "main" for a run of one stage, else `stage_name` or `stage<i>`
    cfg: TrinityConfig  # effective: layout and agreed name applied
    resolved: ResolvedConfig
    stage_dir: Path  # the run folder, or `<run folder>/<name>` in a staged run
    explores: bool  # runs explore steps (mode both / explore)
    serves: bool  # the endpoint for outside agents (mode serve)
    trains: bool  # mode both / train
    evaluates: bool  # has eval tasksets
    reads_queue: bool  # mode train fed by `mode: explore` processes of the run
    shared: bool  # buffer and synchronizer are named actors other processes of the run share
    lockstep: bool  # trainer and engines never compute at once (`in_lockstep`)
    one_process: bool  # explorer and trainer are objects of the run's ServiceHost
    colocated: bool  # trainer and engines take turns on one device (`common.turns`)
    role: str  # this process in a split run: `trainer` or `explorer/<name>`

    @property
    def mode(self) -> str:
        return self.cfg.mode

    @property
    def overlaps(self) -> bool:
        """Explorer and trainer compute at once in one process, lending each other cores."""
        return self.one_process and not self.lockstep

    @property
    def has_explorer(self) -> bool:
        return self.explores or self.serves or self.evaluates

    def describe(self) -> str:
        parts = [p for p, on in self._parts() if on]
        head = f"stage {self.name}: mode {self.mode}, starts {', '.join(parts) or 'nothing'}"
        if self.shared:
            head += "; buffer and synchronizer shared by name with the run's other processes"
        if self.trains and (self.explores or self.evaluates):
            head += "; trainer and engines " + (
                "take turns on one device (colocated)"
                if self.colocated
                else "take turns (on-policy)"
                if self.lockstep
                else "compute at once"
            )
        return head + "\n" + format_batch_table(self.resolved)

    def _parts(self) -> list[tuple[str, bool]]:
        return [
            ("explorer", self.explores),
            ("endpoint", self.serves),
            ("explorer (evaluation only)", self.evaluates and not (self.explores or self.serves)),
            ("trainer", self.trains),
            ("buffer", self.explores or self.serves or self.reads_queue),
        ]


@dataclass(frozen=True)
class RunPlan:
    """The whole run: its layout, its folder and one `StagePlan` per stage, in order."""

    cfg: TrinityConfig  # the base config, layout applied
    layout: Layout
    stages: tuple[StagePlan, ...]
    gpus_here: bool

    @property
    def run_dir(self) -> Path:
        return Path(resolve(self.cfg).run_dir)

    @property
    def lends_cores(self) -> bool:
        """A stage has explorer and trainer computing at once in one process
        (`common.core_shares`)."""
        return any(s.overlaps for s in self.stages)

    def renamed(self, name: str) -> RunPlan:
        """The same plan under the run name the launcher agreed on (`<name>_<timestamp>`)."""
        if name == self.cfg.name:
            return self
        return plan_run(self.cfg.model_copy(update={"name": name}), self.gpus_here, self.layout)

    def describe(self) -> str:
        return "\n".join([self.layout.describe(), *(s.describe() for s in self.stages)])


def plan_run(
    cfg: TrinityConfig, gpus_here: bool | None = None, layout: Layout | None = None
) -> RunPlan:
    """The plan of `cfg` (from `load_config`, past pre-flight). `gpus_here`: whether this
    machine has a GPU that Ray would hand the run (probed when None). `layout`: keep a layout
    already chosen (a renamed plan)."""
    gpus = gpu_here() if gpus_here is None else gpus_here
    stages = [_named(c, cfg.name) for c in stage_configs(cfg)]
    if cfg.mode == "bench" and cfg.stages:  # bench the checkpoints the run's stages wrote
        stages = [stages[-1].model_copy(update={"mode": "bench", "stage_name": "bench"})]
    if layout is None:
        layout = with_ray_or_not(cfg, stages, choose_layout(cfg, stages, gpus))
        on, why = colocation(cfg, stages, gpus)
        layout = dataclasses.replace(layout, colocate=on, colocate_why=why)
    base = _with_layout(cfg, layout)
    run_dir = Path(resolve(base).run_dir)
    plans = tuple(
        _stage_plan(i, _with_layout(c, layout), len(stages), run_dir) for i, c in enumerate(stages)
    )
    return RunPlan(cfg=base, layout=layout, stages=plans, gpus_here=gpus)


def choose_layout(cfg: TrinityConfig, stages: list[TrinityConfig], gpus_here: bool) -> Layout:
    """`cluster.one_process` as set, else one process where every stage can be one (module
    docstring), else a process per part, naming the first reason."""
    if cfg.cluster.one_process is not None:
        said = str(cfg.cluster.one_process).lower()  # as YAML spells it
        return Layout(cfg.cluster.one_process, f"cluster.one_process: {said}")
    for c in stages:
        if (why := _needs_processes(c, gpus_here)) is not None:
            where = f"stage {c.stage_name}: " if c.stage_name else ""
            return Layout(False, f"chosen: {where}{why}")
    return Layout(
        True,
        "chosen: one CPU-only node, and every stage runs whole in this run; "
        "cluster.one_process: false keeps a process per part",
    )


def colocation(
    cfg: TrinityConfig, stages: list[TrinityConfig], gpus_here: bool
) -> tuple[bool, str]:
    """Whether the run's trainer and engines take turns on one device, and why:
    `cluster.colocate` as set, else on where the cluster has exactly one GPU on one node and a
    stage both trains and samples (Trinity-RFT's automatic colocate mode)."""
    said = cfg.cluster.colocate
    if said is not None:
        return said, f"cluster.colocate: {str(said).lower()}"
    if not any(_trains_and_samples(c) for c in stages) or (cfg.cluster.node_num or 1) > 1:
        return False, ""
    gpus = cfg.cluster.gpu_per_node
    if gpus is None and gpus_here:
        gpus = gpu_count()
    if gpus != 1:
        return False, ""
    if cfg.explorer.auxiliary_models or cfg.explorer.rollout_model.tensor_parallel_size > 1:
        return False, ""  # they need more than the one GPU; resources refuse the run
    return True, "chosen: one GPU on one node; cluster.colocate: false gives each side a share"


def _trains_and_samples(cfg: TrinityConfig) -> bool:
    """A stage with a trainer and rollout engines (mode both, or train with evaluation)."""
    if cfg.mode == "both":
        return True
    return cfg.mode == "train" and bool(cfg.buffer.explorer_input.eval_tasksets)


def with_ray_or_not(cfg: TrinityConfig, stages: list[TrinityConfig], layout: Layout) -> Layout:
    """`layout` with the run on Ray or not: a one-process run needs no Ray instance unless
    something in it is a Ray actor or the run joins a cluster (`common.local_host`)."""
    if not layout.one_process:
        return layout
    why = _needs_ray(cfg, stages)
    if why is not None:
        return dataclasses.replace(layout, ray=True, ray_why=why)
    return dataclasses.replace(
        layout,
        ray=False,
        ray_why="nothing in the run spans processes (cluster.ray_address: local starts a "
        "private Ray instance for it)",
    )


def _needs_ray(cfg: TrinityConfig, stages: list[TrinityConfig]) -> str | None:
    """Why a one-process run needs Ray, or None."""
    from trinity.explorer.auxiliary import auxiliary_engines
    from trinity.launcher.ray_init import announced_cluster

    address = cfg.cluster.ray_address
    if address != "auto":
        return f"cluster.ray_address: {address}"
    if (found := announced_cluster()) is not None:
        return f"a Ray cluster answers at {found}, and the run joins it"
    if cfg.monitor.enable_ray_timeline:
        return "monitor.enable_ray_timeline records Ray's tasks"
    for c in stages:
        if auxiliary_engines(c):
            return "explorer.auxiliary_models run as Ray actors"
    return None


def _needs_processes(cfg: TrinityConfig, gpus_here: bool) -> str | None:
    """Why this stage cannot run in one process, or None."""
    rm = cfg.explorer.rollout_model
    if cfg.cluster.colocate:
        return "cluster.colocate: the trainer and engines are processes that take turns"
    if cfg.mode not in ONE_PROCESS_MODES or trains_from_queue(cfg):
        return f"mode {cfg.mode} is one process of a run split over processes"
    if (cfg.cluster.node_num or 1) > 1:
        return f"the run spreads over {cfg.cluster.node_num} nodes"
    if (strategy := trainer_strategy(cfg))[0] == "fsdp2":
        return f"trainer strategy fsdp2 ({strategy[1]}): its ranks are processes"
    if rm.tensor_parallel_size > 1:
        return (
            f"explorer.rollout_model.tensor_parallel_size {rm.tensor_parallel_size}: an "
            "engine's ranks are processes"
        )
    if cfg.cluster.gpu_per_node or (cfg.cluster.gpu_per_node is None and gpus_here):
        return "the run has GPUs (one process is built for CPUs)"
    if cfg.synchronizer.sync_method == "nccl":
        return "synchronizer.sync_method nccl is a collective between processes"
    if rm.engine_type == "vllm":
        return "explorer.rollout_model.engine_type vllm runs in engine processes of its own"
    if "in_explorer_process" in rm.model_fields_set and not rm.in_explorer_process:
        return "explorer.rollout_model.in_explorer_process: false asks for engine processes"
    if "max_restarts" in rm.model_fields_set and rm.max_restarts:
        return "explorer.rollout_model.max_restarts asks Ray to restart engine processes"
    threads = (cfg.trainer.num_threads, rm.num_threads)
    if None not in threads and threads[0] != threads[1]:
        return "trainer and engines ask for different thread counts"
    return None


def gpu_count() -> int:
    """The GPUs torch sees here (0 without a GPU driver)."""
    from trinity.config.preflight import gpu_driver_present

    if not gpu_driver_present():
        return 0
    import torch

    return int(torch.cuda.device_count())


def gpu_here() -> bool:
    """Whether torch sees a GPU here (asked only where a GPU driver is present)."""
    from trinity.config.preflight import gpu_driver_present

    if not gpu_driver_present():
        return False
    import torch

    return bool(torch.cuda.is_available())


def _stage_plan(i: int, cfg: TrinityConfig, count: int, run_dir: Path) -> StagePlan:
    name = cfg.stage_name or ("main" if count == 1 else f"stage{i}")
    mode, reads_queue = cfg.mode, trains_from_queue(cfg)
    return StagePlan(
        index=i,
        name=name,
        cfg=cfg,
        resolved=resolve(cfg),
        stage_dir=run_dir if count == 1 else run_dir / name,
        explores=mode in ("both", "explore"),
        serves=mode == "serve",
        trains=mode in ("both", "train"),
        evaluates=bool(cfg.buffer.explorer_input.eval_tasksets),
        reads_queue=reads_queue,
        shared=mode in ("explore", "serve") or reads_queue,
        lockstep=in_lockstep(cfg),
        one_process=bool(cfg.cluster.one_process),
        colocated=bool(cfg.cluster.colocate) and _trains_and_samples(cfg),
        role=process_role(cfg),
    )


def process_role(cfg: Any) -> str:
    """Who this process is in a split run: a process started again under its role (after a
    crash) takes its own place (`common.shared.RefCounted`)."""
    return f"explorer/{cfg.explorer.name}" if cfg.mode in ("explore", "serve") else "trainer"


def _named(cfg: TrinityConfig, name: str) -> TrinityConfig:
    """A stage config under the run's name (stages merge onto the config as written, which
    holds the name before the launcher agreed on one)."""
    return cfg if cfg.name == name else cfg.model_copy(update={"name": name})


def _with_layout(cfg: TrinityConfig, layout: Layout) -> TrinityConfig:
    """`cfg` with the layout's choices written in (`cluster.one_process`, `cluster.colocate`)."""
    chosen = {"one_process": layout.one_process, "colocate": layout.colocate}
    if all(getattr(cfg.cluster, k) is v for k, v in chosen.items()):
        return cfg
    cluster = cfg.cluster.model_copy(update=chosen)
    return cfg.model_copy(update={"cluster": cluster})
