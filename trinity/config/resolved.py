"""Derived run values, computed from a validated config without touching it.

`resolve(cfg)` is pure (no I/O, no filesystem): it turns the user's settings into the numbers the
runtime uses, and `format_batch_table` prints them at start-up with the unit of every number, so
"is batch_size in tasks or in samples?" is answered before the first step.

Choices left unset mean "the best available here", decided in `resolve()` and printed with the
reason: the rollout engine (`explorer.rollout_model.engine_type`), the weight-sync method
(`synchronizer.sync_method`) and the trainer strategy (`trainer.trainer_strategy`). Trinity-RFT's
defaults for these (vllm, nccl, verl's fsdp) are not built here. The config is the effective one
from `load_config` (verl `trainer.trainer_config` values already at our keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trinity.config.run_folder import trains_from_queue
from trinity.config.schema import TrinityConfig

# (value, why) chosen for each "best available here" key when it is unset
BEST_ENGINE = ("transformers", "unset: the vLLM engine is not built, transformers serves rollouts")
BEST_SYNC = ("memory", "unset: trainer and explorer share one Ray cluster, the object store")
BEST_SYNC_SPLIT = (
    "checkpoint",
    "unset: explorer and trainer run as separate processes (mode explore / train), files "
    "outlive either of them",
)
BEST_STRATEGY = ("torch", "unset: single-process PyTorch trainer on one device")


@dataclass(frozen=True)
class ResolvedConfig:
    """Numbers derived from a `TrinityConfig`; units are in each field's comment."""

    run_dir: str  # <checkpoint_root_dir>/<project>/<name>, joined as text
    mode: str
    algorithm_type: str
    stage_name: str
    tasks_per_step: int  # tasks per explore step (buffer.batch_size)
    samples_per_task: int  # experiences per task (algorithm.repeat_times)
    experiences_per_explore_step: int  # tasks_per_step × samples_per_task
    train_batch_size: int  # experiences per train step
    train_batch_size_derived: bool  # True when buffer.train_batch_size was 0
    micro_batch_size: int  # experiences per micro-batch per GPU (fixed-size mode)
    use_dynamic_bsz: bool  # micro-batches packed by tokens instead of a fixed size
    max_token_len_per_micro_batch: int | None  # tokens per micro-batch per GPU (dynamic mode)
    grad_accum_steps: int | None  # micro-batches per train step; None = dynamic (token packing)
    total_steps: int | None  # None = from taskset size × total_epochs at run time, or (mode
    # train reading a queue) until every writer has closed the buffer
    total_steps_source: str  # the key total_steps came from, "" when None
    save_interval: int | None  # train steps per checkpoint; 0 = only at the end; None = a
    # tenth of the steps planned at run time (`save_interval_for`)
    save_interval_source: str
    sync_interval: int  # train steps between weight syncs
    sync_offset: int  # explore steps the explorer runs ahead
    sync_method: str  # memory | checkpoint | nccl
    sync_method_source: str  # the key, or why it was chosen when unset
    engine_type: str  # rollout engine of explorer.rollout_model
    engine_type_source: str
    trainer_strategy: str  # torch | fsdp | fsdp2
    trainer_strategy_source: str
    ppo_epochs: int  # passes over each train batch
    ppo_mini_batch_size: int | None  # experiences per optimizer update; None = whole batch
    grad_clip: float  # max global gradient norm

    def save_interval_for(self, total_steps: int | None) -> int:
        """Train steps per checkpoint for a run of `total_steps` train steps: the resolved
        `save_interval`, or (unset) a tenth of the run, ceil(total_steps / 10), so a crash costs
        at most a tenth of the steps; 0 = only at the end. A run with no step budget (None:
        mode train reading a queue until its writers close it) checkpoints every
        `OPEN_RUN_SAVE_INTERVAL` steps."""
        if self.save_interval is not None:
            return self.save_interval
        return save_interval_of(None, total_steps) or OPEN_RUN_SAVE_INTERVAL


OPEN_RUN_SAVE_INTERVAL = 10
"""Train steps per checkpoint of a run whose length is not known (no step budget)."""


def save_interval_of(explicit: int | None, total_steps: int | None) -> int | None:
    """`trainer.save_interval` when set, else ceil(total_steps / 10) (None while unknown)."""
    if explicit is not None:
        return explicit
    return None if total_steps is None else max(1, math.ceil(total_steps / 10))


def samples_per_task(cfg: TrinityConfig) -> list[int]:
    """The distinct group sizes (experiences per task) of the training tasksets, in order: each
    taskset's `rollout_args.n`, else its `repeat_times`, else `algorithm.repeat_times` (as the
    explorer draws them); `[algorithm.repeat_times]` without tasksets."""
    inp = cfg.buffer.explorer_input
    sets = [inp.taskset] if inp.taskset is not None else list(inp.tasksets)
    found = [s.rollout_args.n or s.repeat_times or cfg.algorithm.repeat_times for s in sets]
    return list(dict.fromkeys(found)) or [cfg.algorithm.repeat_times]


def resolve(cfg: TrinityConfig) -> ResolvedConfig:
    """Derive the run directory, batch numbers and sync settings of `cfg` (pure function)."""
    engine, engine_src = _chosen(
        cfg.explorer.rollout_model.engine_type, "explorer.rollout_model.engine_type", BEST_ENGINE
    )
    best_sync = BEST_SYNC_SPLIT if cfg.mode in ("explore", "train") else BEST_SYNC
    sync, sync_src = _chosen(cfg.synchronizer.sync_method, "synchronizer.sync_method", best_sync)
    if sync == "nccl" and cfg.mode != "both":
        sync, sync_src = (
            "checkpoint",
            (
                f"synchronizer.sync_method nccl needs trainer and engines in one run (mode both); "
                f"mode {cfg.mode} sends weights by checkpoint, as Trinity-RFT does"
            ),
        )
    strategy, strategy_src = _chosen(
        cfg.trainer.trainer_strategy, "trainer.trainer_strategy", BEST_STRATEGY
    )
    clip = cfg.trainer.grad_clip
    tasks = cfg.buffer.batch_size
    groups = samples_per_task(cfg)
    samples = groups[0] if len(groups) == 1 else cfg.algorithm.repeat_times
    derived = cfg.buffer.train_batch_size <= 0
    train_batch = tasks * samples if derived else cfg.buffer.train_batch_size
    micro = cfg.trainer.micro_batch_size_per_gpu
    dynamic = cfg.trainer.use_dynamic_bsz
    if cfg.buffer.total_steps is not None:
        total, total_source = cfg.buffer.total_steps, "buffer.total_steps"
    elif cfg.trainer.total_steps is not None:
        total, total_source = cfg.trainer.total_steps, "trainer.total_steps"
    elif trains_from_queue(cfg):
        total, total_source = None, "until every writer has closed the buffer (mode train, queue)"
    else:
        total, total_source = None, ""
    save = save_interval_of(cfg.trainer.save_interval, total)
    if cfg.trainer.save_interval is not None:
        save_source = "trainer.save_interval"
    elif total is not None:
        save_source = f"unset: a tenth of the run, ceil({total} / 10)"
    elif trains_from_queue(cfg):
        save = OPEN_RUN_SAVE_INTERVAL
        save_source = f"unset, and the run's length is open: every {save} train steps"
    else:
        save_source = "unset: a tenth of the steps planned at run time"
    root = cfg.checkpoint_root_dir.rstrip("/")
    return ResolvedConfig(
        run_dir=f"{root}/{cfg.project}/{cfg.name}",
        mode=cfg.mode,
        algorithm_type=cfg.algorithm.algorithm_type,
        stage_name=cfg.stage_name,
        tasks_per_step=tasks,
        samples_per_task=samples,
        experiences_per_explore_step=tasks * samples,
        train_batch_size=train_batch,
        train_batch_size_derived=derived,
        micro_batch_size=micro,
        use_dynamic_bsz=dynamic,
        max_token_len_per_micro_batch=cfg.trainer.max_token_len_per_gpu,
        grad_accum_steps=None if dynamic else math.ceil(train_batch / micro),
        total_steps=total,
        total_steps_source=total_source,
        save_interval=save,
        save_interval_source=save_source,
        sync_interval=cfg.synchronizer.sync_interval,
        sync_offset=cfg.synchronizer.sync_offset,
        sync_method=sync,
        sync_method_source=sync_src,
        engine_type=engine,
        engine_type_source=engine_src,
        trainer_strategy=strategy,
        trainer_strategy_source=strategy_src,
        ppo_epochs=cfg.trainer.ppo_epochs,
        ppo_mini_batch_size=cfg.trainer.ppo_mini_batch_size,
        grad_clip=clip if clip is not None else cfg.algorithm.optimizer.clip_grad,
    )


def _chosen(value: str | None, key: str, best: tuple[str, str]) -> tuple[str, str]:
    """(value, where it came from): the user's value, or the best available here and why."""
    return (value, key) if value is not None else best


def format_batch_table(r: ResolvedConfig) -> str:
    """An aligned table of the derived values, each with its unit and where it came from.

    Example line: `tasks per explore step            16  (buffer.batch_size)`.
    """
    train_note = (
        "buffer.train_batch_size is 0 → tasks × samples"
        if r.train_batch_size_derived
        else "buffer.train_batch_size"
    )
    if r.use_dynamic_bsz:
        tokens = r.max_token_len_per_micro_batch
        micro_rows = [
            (
                "tokens per micro-batch",
                "unset" if tokens is None else str(tokens),
                "trainer.max_token_len_per_gpu, per GPU; use_dynamic_bsz packs by tokens",
            ),
            ("micro-batches per train step", "dynamic", "depends on sequence lengths"),
        ]
    else:
        micro_rows = [
            (
                "experiences per micro-batch",
                str(r.micro_batch_size),
                "trainer.micro_batch_size_per_gpu, per GPU",
            ),
            (
                "micro-batches per train step",
                str(r.grad_accum_steps),
                f"gradient accumulation = ceil({r.train_batch_size} / {r.micro_batch_size})",
            ),
        ]
    steps = (
        ("total steps", str(r.total_steps), r.total_steps_source)
        if r.total_steps is not None
        else ("total steps", "open", r.total_steps_source)
        if r.total_steps_source
        else ("total steps", "auto", "from taskset size × buffer.total_epochs at run time")
    )
    rows = [
        ("run directory", r.run_dir, ""),
        ("mode", r.mode, ""),
        ("algorithm", r.algorithm_type, ""),
        *([("stage", r.stage_name, "")] if r.stage_name else []),
        ("tasks per explore step", str(r.tasks_per_step), "buffer.batch_size"),
        ("samples per task", str(r.samples_per_task), "algorithm.repeat_times"),
        (
            "experiences per explore step",
            str(r.experiences_per_explore_step),
            "tasks × samples",
        ),
        ("experiences per train step", str(r.train_batch_size), train_note),
        *micro_rows,
        steps,
        (
            "train steps per checkpoint",
            "end only" if r.save_interval == 0 else str(r.save_interval or "auto"),
            r.save_interval_source,
        ),
        ("train steps per weight sync", str(r.sync_interval), "synchronizer.sync_interval"),
        ("explore steps ahead (offset)", str(r.sync_offset), "synchronizer.sync_offset"),
        ("weight sync method", r.sync_method, r.sync_method_source),
        ("rollout engine", r.engine_type, r.engine_type_source),
        ("trainer strategy", r.trainer_strategy, r.trainer_strategy_source),
    ]
    label_w = max(len(label) for label, _, _ in rows)
    value_w = max(len(value) for _, value, note in rows if note)
    lines = []
    for label, value, note in rows:
        if note:
            lines.append(f"{label:<{label_w}}  {value:>{value_w}}  ({note})")
        else:
            lines.append(f"{label:<{label_w}}  {value}")
    return "\n".join(lines)


def chat_template_kwargs(cfg: TrinityConfig) -> dict[str, Any]:
    """Extra variables every chat template is rendered with (rollout prompts and SFT prompts).

    `enable_thinking` (reasoning models such as Qwen3 branch on it) is passed when
    `explorer.rollout_model.enable_thinking` or else `model.enable_thinking` is set; templates
    that do not use it ignore it.
    """
    own = cfg.explorer.rollout_model.enable_thinking
    value = cfg.model.enable_thinking if own is None else own
    return {} if value is None else {"enable_thinking": value}
