"""Derived run values, computed from a validated config without touching it.

`resolve(cfg)` is pure (no I/O, no filesystem): it turns the user's settings into the numbers the
runtime uses, and `format_batch_table` prints them at start-up with the unit of every number, so
"is batch_size in tasks or in samples?" is answered before the first step.

Choices left unset mean "the best available here", decided in `resolve()` and printed with the
reason: the rollout engine (`explorer.rollout_model.engine_type`), the weight-sync method
(`synchronizer.sync_method`) and the trainer strategy (`trainer.trainer_strategy`). Trinity-RFT's
defaults for these are vllm, nccl and verl's fsdp; ours are transformers (the vLLM engine is
optional: `engine_type: vllm` where it is installed), memory and torch. The config is the
effective one from `load_config` (verl `trainer.trainer_config` values already at our keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trinity.config.run_folder import trains_from_queue
from trinity.config.schema import TrinityConfig

# when unset, each "best available here" key gets (value, why)
BEST_ENGINE = (
    "transformers",
    "unset: transformers serves rollouts everywhere (engine_type: vllm where vLLM is installed)",
)
EXTERNAL_ENGINE = (
    "external",
    "model.external_model.enable: the OpenAI-compatible endpoint samples (explorer/external_engine.py)",
)
BEST_SYNC = ("memory", "unset: trainer and explorer share one Ray cluster, the object store")
BEST_SYNC_SPLIT = (
    "checkpoint",
    "unset: explorer and trainer run as separate processes (mode explore / train), files "
    "outlive either of them",
)
BEST_SYNC_ONE_PROCESS = (
    "shared",
    "unset: one process, strictly on-policy (cluster.one_process, sync_interval 1, sync_offset "
    "0): the engines use the trainer's weights in place, no copy",
)
BEST_SYNC_LORA = (
    "memory",
    "unset: one process, strictly on-policy, but with model.lora_configs: a sync sends only "
    "the adapter, which the engines merge into weights of their own (shared maps full weights)",
)
BEST_STRATEGY = ("torch", "unset: single-process PyTorch trainer on one device")
OPEN_RUN_SAVE_INTERVAL = 10
"""Train steps per checkpoint of a run whose length is not known (no step budget)."""


@dataclass(frozen=True)
class ResolvedConfig:
    """Numbers derived from a `TrinityConfig`; units are in each field's comment. A `*_source`
    field says the key a value came from, or why it was chosen."""

    run_dir: str  # <checkpoint_root_dir>/<project>/<name>, joined as text
    mode: str
    algorithm_type: str
    stage_name: str
    tasks_per_step: int  # tasks per explore step (buffer.batch_size)
    samples_per_task: int  # experiences per task (algorithm.repeat_times)
    experiences_per_explore_step: int  # tasks_per_step × samples_per_task
    train_batch_size: int  # experiences per train step read from the experience buffer
    train_batch_size_derived: bool  # True when buffer.train_batch_size was 0
    expert_rows: int  # rows per train step from an auxiliary SFT buffer (sample_strategy mix)
    expert_rows_source: str  # "" without them
    micro_batch_size: int  # experiences per micro-batch per GPU (fixed-size mode)
    use_dynamic_bsz: bool  # micro-batches packed by tokens instead of a fixed size
    max_token_len_per_micro_batch: int | None  # tokens per micro-batch per GPU (dynamic mode)
    grad_accum_steps: int | None  # micro-batches per train step (per rank); None = dynamic
    total_steps: int | None  # None = from taskset size × total_epochs at run time, or (mode
    # train reading a queue) until every writer has closed the buffer
    total_steps_source: str  # "" when None
    save_interval: int | None  # train steps per checkpoint; 0 = only at the end; None = a
    # tenth of the steps planned at run time (`save_interval_for`)
    save_interval_source: str
    sync_interval: int  # train steps between weight syncs
    sync_offset: int  # explore steps the explorer runs ahead
    sync_method: str  # memory | checkpoint | nccl | shared
    sync_method_source: str
    engine_type: str  # rollout engine of explorer.rollout_model
    engine_type_source: str
    engine_ranks: int  # processes per rollout engine (explorer.rollout_model.tensor_parallel_size)
    trainer_strategy: str  # torch | fsdp2 (fsdp is sharded by FSDP2)
    trainer_strategy_source: str
    trainer_world_size: int  # ranks of the trainer (1 with torch)
    trainer_world_size_source: str
    sequence_parallel_size: int  # ranks one sequence is split over (1: none)
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
        return (
            OPEN_RUN_SAVE_INTERVAL if total_steps is None else max(1, math.ceil(total_steps / 10))
        )


def engines_in_explorer(cfg: TrinityConfig) -> bool:
    """Whether the rollout engines run on threads of the explorer's process (no actors):
    `explorer.rollout_model.in_explorer_process`, or `cluster.one_process` (which implies it)."""
    return bool(cfg.explorer.rollout_model.in_explorer_process or cfg.cluster.one_process)


def in_lockstep(cfg: TrinityConfig) -> bool:
    """Whether the stage's trainer and rollout engines never compute at the same time: on-policy
    `mode: both` (`sync_style: fixed`, `sync_interval: 1`, `sync_offset: 0`: explore step k
    waits for train step k-1's weights, train step k for explore step k's experiences), and a
    train stage from a dataset (its engines only evaluate before and after training). Then each
    side uses every core while it runs (`common.resources`), and in `cluster.one_process` they
    take turns on the process's compute lane (`common.compute`)."""
    if cfg.mode == "train":
        return not trains_from_queue(cfg)
    if cfg.mode != "both" or cfg.synchronizer.sync_style != "fixed":
        return False
    r = resolve(cfg)
    return r.sync_interval == 1 and r.sync_offset == 0


def overlaps_in_one_process(cfg: TrinityConfig) -> bool:
    """Whether the stage's trainer and rollout engines compute at once in one process
    (`cluster.one_process`, not `in_lockstep`): each on a thread of its own, lending the other
    its cores while idle (`common.core_shares`)."""
    return cfg.cluster.one_process and not in_lockstep(cfg)


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
    engine = cfg.explorer.rollout_model.engine_type
    sync = cfg.synchronizer.sync_method
    best_sync = BEST_SYNC_SPLIT if cfg.mode in ("explore", "train") else BEST_SYNC
    sc = cfg.synchronizer
    lockstep = sc.sync_style == "fixed" and sc.sync_interval == 1 and sc.sync_offset == 0
    if cfg.mode == "both" and cfg.cluster.one_process and lockstep:
        best_sync = BEST_SYNC_ONE_PROCESS  # what `_shared_weights_never_race` asks, on CPUs
        if cfg.model.lora_configs:  # `_one_lora_adapter`: shared maps full weights
            best_sync = BEST_SYNC_LORA
    chosen = {
        "engine_type": (
            EXTERNAL_ENGINE
            if cfg.model.external_model.enable
            else (engine, "explorer.rollout_model.engine_type")
            if engine
            else BEST_ENGINE
        ),
        "sync_method": (sync, "synchronizer.sync_method") if sync else best_sync,
        "trainer_strategy": trainer_strategy(cfg),
    }
    if sync in ("nccl", "shared") and cfg.mode != "both":
        chosen["sync_method"] = (
            "checkpoint",
            f"synchronizer.sync_method {sync} needs trainer and engines in one run (mode both); "
            f"mode {cfg.mode} sends weights by checkpoint, as Trinity-RFT does",
        )
    tasks, groups = cfg.buffer.batch_size, samples_per_task(cfg)
    samples = groups[0] if len(groups) == 1 else cfg.algorithm.repeat_times
    derived = cfg.buffer.train_batch_size <= 0
    train_batch = tasks * samples if derived else cfg.buffer.train_batch_size
    train_batch, experts, experts_source = mixed_rows(cfg, train_batch, derived)
    micro, dynamic = cfg.trainer.micro_batch_size_per_gpu, cfg.trainer.use_dynamic_bsz
    total, total_source = cfg.buffer.total_steps, "buffer.total_steps"
    if total is None:
        total, total_source = cfg.trainer.total_steps, "trainer.total_steps"
    if total is None:
        open_run = "until every writer has closed the buffer (mode train, queue)"
        total_source = open_run if trains_from_queue(cfg) else ""
    save, save_source = cfg.trainer.save_interval, "trainer.save_interval"
    if save is None and total is not None:
        save, save_source = (
            max(1, math.ceil(total / 10)),
            f"unset: a tenth of the run, ceil({total} / 10)",
        )
    elif save is None and trains_from_queue(cfg):
        save = OPEN_RUN_SAVE_INTERVAL
        save_source = f"unset, and the run's length is open: every {save} train steps"
    elif save is None:
        save_source = "unset: a tenth of the steps planned at run time"
    clip = cfg.trainer.grad_clip
    world, world_source = trainer_world_size(cfg, chosen["trainer_strategy"][0])
    sp = cfg.trainer.ulysses_sequence_parallel_size
    groups = max(world // sp, 1)  # data-parallel groups: the ways the rows are split
    return ResolvedConfig(
        run_dir=f"{cfg.checkpoint_root_dir.rstrip('/')}/{cfg.project}/{cfg.name}",
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
        expert_rows=experts,
        expert_rows_source=experts_source,
        grad_accum_steps=None
        if dynamic
        else math.ceil(math.ceil((train_batch + experts) / groups) / micro),
        total_steps=total,
        total_steps_source=total_source,
        save_interval=save,
        save_interval_source=save_source,
        sync_interval=cfg.synchronizer.sync_interval,
        sync_offset=cfg.synchronizer.sync_offset,
        **{key: value for key, (value, _) in chosen.items()},
        **{f"{key}_source": why for key, (_, why) in chosen.items()},
        engine_ranks=cfg.explorer.rollout_model.tensor_parallel_size,
        trainer_world_size=world,
        trainer_world_size_source=world_source,
        sequence_parallel_size=sp,
        ppo_epochs=cfg.trainer.ppo_epochs,
        ppo_mini_batch_size=cfg.trainer.ppo_mini_batch_size,
        grad_clip=clip if clip is not None else cfg.algorithm.optimizer.clip_grad,
    )


def mixed_rows(cfg: TrinityConfig, written: int, derived: bool) -> tuple[int, int, str]:
    """(rollouts per train step, expert rows per train step, where the split comes from).

    With `sample_strategy: mix` (the `mix` and `mix_chord` algorithms' own), a train step also
    holds expert rows from the auxiliary SFT buffer, ρ = `expert_data_ratio` of it. A written
    `buffer.train_batch_size` T counts both, as Trinity-RFT's: E = ceil(ρ·T) experts and T - E
    rollouts (its mix_chord example: 320 = 256 + 64). Derived (0), the rollouts are an explore
    step's and the experts come on top: E = ceil(ρ/(1 - ρ)·rollouts). Without mix: (written, 0).
    """
    from trinity.algorithm.algorithms import known_algorithm

    spec = known_algorithm(cfg.algorithm.algorithm_type)
    strategy = cfg.algorithm.sample_strategy or getattr(spec, "sample_strategy", None)
    args = cfg.algorithm.sample_strategy_args
    rho = args.get("expert_data_ratio", 0.5)
    if strategy != "mix" or not isinstance(rho, int | float) or not 0 <= rho < 1:
        return written, 0, ""  # an invalid ratio is the pre-flight pass's to report
    source = args.get("sft_dataset_name", "sft_dataset")
    if derived:
        experts = math.ceil(rho / (1 - rho) * written)
        why = f"sample_strategy mix: ceil({rho:g} / (1 - {rho:g}) × {written} rollouts)"
        return written, experts, f"{why} from auxiliary_buffers.{source}"
    experts = math.ceil(rho * written)
    why = f"sample_strategy mix: ceil({rho:g} × buffer.train_batch_size {written})"
    return written - experts, experts, f"{why} from auxiliary_buffers.{source}"


def trainer_strategy(cfg: TrinityConfig) -> tuple[str, str]:
    """The trainer strategy (torch or fsdp2) and why: the key's value (fsdp, verl's FSDP1, is
    sharded by FSDP2); unset, fsdp2 where `trainer.ulysses_sequence_parallel_size` > 1 asks for
    ranks (Trinity-RFT's trainer is always sharded), else torch."""
    strategy, sp = cfg.trainer.trainer_strategy, cfg.trainer.ulysses_sequence_parallel_size
    if strategy == "fsdp":
        return "fsdp2", (
            "trainer.trainer_strategy fsdp (verl's FSDP1): sharded by FSDP2 here, the same "
            "parameter sharding with PyTorch's current API"
        )
    if strategy is not None:
        return strategy, "trainer.trainer_strategy"
    if sp > 1:
        return "fsdp2", (
            f"unset, and trainer.ulysses_sequence_parallel_size {sp} splits sequences over "
            "ranks (Trinity-RFT's default is verl's fsdp)"
        )
    return BEST_STRATEGY


def trainer_world_size(cfg: TrinityConfig, strategy: str) -> tuple[int, str]:
    """The trainer's ranks and where the number came from (`trainer.world_size`'s doc)."""
    if strategy != "fsdp2":
        return 1, "one process (trainer_strategy torch)"
    if cfg.trainer.world_size is not None:
        return cfg.trainer.world_size, "trainer.world_size"
    c, rm = cfg.cluster, cfg.explorer.rollout_model
    if c.gpu_per_node:
        total = (c.node_num or 1) * c.gpu_per_node
        engines = rm.engine_num * rm.tensor_parallel_size if cfg.mode != "train" else 0
        if total > engines:
            return total - engines, (
                f"unset: {total} GPUs (cluster.node_num × gpu_per_node) less {engines} for the "
                "rollout engines"
            )
    sp = cfg.trainer.ulysses_sequence_parallel_size
    if sp > 1:
        return sp, "unset: trainer.ulysses_sequence_parallel_size, one group of ranks"
    return 1, "unset: 1 (set trainer.world_size)"


def format_batch_table(r: ResolvedConfig) -> str:
    """An aligned table of the derived values, each with its unit and where it came from.

    Example line: `tasks per explore step            16  (buffer.batch_size)`.
    """
    if r.use_dynamic_bsz:
        micro = "tokens per micro-batch", str(r.max_token_len_per_micro_batch or "unset")
        micro_note = "trainer.max_token_len_per_gpu, per GPU; use_dynamic_bsz packs by tokens"
        if r.sequence_parallel_size > 1:  # each rank holds 1/sp of the micro-batch's columns
            micro_note += f" (× {r.sequence_parallel_size} per micro-batch: sequences are split)"
        accum, accum_note = "dynamic", "depends on sequence lengths"
    else:
        micro = "experiences per micro-batch", str(r.micro_batch_size)
        micro_note = "trainer.micro_batch_size_per_gpu, per GPU"
        accum = str(r.grad_accum_steps)
        rows = r.train_batch_size + r.expert_rows
        accum_note = f"gradient accumulation = ceil({rows} / {r.micro_batch_size})"
        if r.sequence_parallel_size > 1:
            accum_note = (
                f"per rank: ceil(ceil({rows} / "
                f"{r.trainer_world_size // r.sequence_parallel_size} data-parallel groups) / "
                f"{r.micro_batch_size})"
            )
        elif r.trainer_world_size > 1:
            accum_note = (
                f"per rank: ceil(ceil({rows} / {r.trainer_world_size} ranks) / "
                f"{r.micro_batch_size})"
            )
    if r.total_steps is not None or r.total_steps_source:
        steps = (str(r.total_steps) if r.total_steps is not None else "open", r.total_steps_source)
    else:
        steps = ("auto", "from taskset size × buffer.total_epochs at run time")
    train_note = "buffer.train_batch_size" + (
        " is 0 → tasks × samples" if r.train_batch_size_derived else ""
    )
    if r.expert_rows and not r.train_batch_size_derived:
        train_note = f"buffer.train_batch_size less the expert rows: {r.expert_rows_source}"
    checkpoint = "end only" if r.save_interval == 0 else str(r.save_interval or "auto")
    rows = [
        ("run directory", r.run_dir, ""),
        ("mode", r.mode, ""),
        ("algorithm", r.algorithm_type, ""),
        *([("stage", r.stage_name, "")] if r.stage_name else []),
        ("tasks per explore step", str(r.tasks_per_step), "buffer.batch_size"),
        ("samples per task", str(r.samples_per_task), "algorithm.repeat_times"),
        ("experiences per explore step", str(r.experiences_per_explore_step), "tasks × samples"),
        ("experiences per train step", str(r.train_batch_size), train_note),
        *(
            [("expert rows per train step", str(r.expert_rows), r.expert_rows_source)]
            if r.expert_rows
            else []
        ),
        (*micro, micro_note),
        ("micro-batches per train step", accum, accum_note),
        *(
            [("trainer ranks", str(r.trainer_world_size), r.trainer_world_size_source)]
            if r.trainer_strategy == "fsdp2"
            else []
        ),
        *(
            [
                (
                    "ranks per sequence",
                    str(r.sequence_parallel_size),
                    "trainer.ulysses_sequence_parallel_size; each a slice of every sequence",
                )
            ]
            if r.sequence_parallel_size > 1
            else []
        ),
        ("total steps", *steps),
        ("train steps per checkpoint", checkpoint, r.save_interval_source),
        ("train steps per weight sync", str(r.sync_interval), "synchronizer.sync_interval"),
        ("explore steps ahead (offset)", str(r.sync_offset), "synchronizer.sync_offset"),
        ("weight sync method", r.sync_method, r.sync_method_source),
        ("rollout engine", r.engine_type, r.engine_type_source),
        *(
            [
                (
                    "ranks per rollout engine",
                    str(r.engine_ranks),
                    "explorer.rollout_model.tensor_parallel_size: tensor-parallel",
                )
            ]
            if r.engine_ranks > 1
            else []
        ),
        ("trainer strategy", r.trainer_strategy, r.trainer_strategy_source),
    ]
    label_w = max(len(label) for label, _, _ in rows)
    value_w = max(len(value) for _, value, note in rows if note)
    return "\n".join(
        f"{label:<{label_w}}  {value:>{value_w}}  ({note})"
        if note
        else f"{label:<{label_w}}  {value}"
        for label, value, note in rows
    )


def chat_template_kwargs(cfg: TrinityConfig) -> dict[str, Any]:
    """Extra variables every chat template is rendered with (rollout prompts and SFT prompts).

    `enable_thinking` (reasoning models such as Qwen3 branch on it) is passed when
    `explorer.rollout_model.enable_thinking` or else `model.enable_thinking` is set; templates
    that do not use it ignore it.
    """
    own = cfg.explorer.rollout_model.enable_thinking
    value = cfg.model.enable_thinking if own is None else own
    return {} if value is None else {"enable_thinking": value}
