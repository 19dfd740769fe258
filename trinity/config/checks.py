"""Checks that span several fields or sections. Pure functions: no I/O, no rewriting.

Each check names the key paths it reads. A check runs only when nothing at or under those paths
failed validation, so one typo never causes a second, knock-on complaint. To add a check, write a
generator of `Problem`s and decorate it with `@_check("dotted.key.path", ...)`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from numbers import Real
from pathlib import PurePath
from typing import Any

from trinity.common.rollout import VLLM_MAX_LOGPROBS
from trinity.config.buffer_schema import EXPERIENCE_FILE_SUFFIXES as SUFFIXES
from trinity.config.problems import Problem
from trinity.config.resolved import (
    mixed_rows,
    samples_per_task,
    trainer_strategy,
    trainer_world_size,
)
from trinity.config.run_folder import trains_from_queue, writes_experience_file
from trinity.config.schema import TrinityConfig

CheckFn = Callable[[TrinityConfig], Iterator[Problem]]
Loc = tuple[str | int, ...]
_CHECKS: list[tuple[tuple[str, ...], CheckFn]] = []


def _check(*reads: str) -> Callable[[CheckFn], CheckFn]:
    """Register a cross-field check that reads the given dotted key paths."""

    def register(fn: CheckFn) -> CheckFn:
        _CHECKS.append((reads, fn))
        return fn

    return register


def blocked(skip: Collection[Loc], *paths: str) -> bool:
    """True when one of the dotted `paths` (`a.b[0].c`) lies inside a key path of `skip` or
    holds one."""
    for path in paths:
        loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path))
        if any(loc[: len(s)] == s[: len(loc)] for s in skip):
            return True
    return False


def check_config(cfg: TrinityConfig, skip: Collection[Loc] = ()) -> list[Problem]:
    """Run every cross-field check on `cfg`.

    Args:
        cfg: a validated config (values at the paths in `skip` may be stand-in defaults).
        skip: key paths (as tuples) that failed validation; checks reading them are skipped.
    """
    return [p for reads, fn in _CHECKS if not blocked(skip, *reads) for p in fn(cfg)]


@_check("model.model_path")
def _model_path_given(cfg: TrinityConfig) -> Iterator[Problem]:
    if not cfg.model.model_path.strip():
        yield Problem("model.model_path", "required: a local path or hub id of the policy model")


@_check("model.max_model_len", "model.max_prompt_tokens", "model.max_response_tokens")
def _lengths_fit(cfg: TrinityConfig) -> Iterator[Problem]:
    m = cfg.model
    if m.max_model_len and m.max_prompt_tokens and m.max_response_tokens:
        total = m.max_prompt_tokens + m.max_response_tokens
        if total > m.max_model_len:
            yield Problem(
                "model.max_model_len",
                f"max_prompt_tokens + max_response_tokens = {m.max_prompt_tokens} + "
                f"{m.max_response_tokens} = {total} tokens exceeds max_model_len "
                f"({m.max_model_len} tokens)",
            )


@_check("mode", "algorithm.loss_agg_mode", "model.max_response_tokens")
def _norm_horizon_given(cfg: TrinityConfig) -> Iterator[Problem]:
    if (
        cfg.mode in ("both", "train")
        and cfg.algorithm.loss_agg_mode == "seq-mean-token-sum-norm"
        and cfg.model.max_response_tokens is None
    ):
        yield Problem(
            "model.max_response_tokens",
            "required by algorithm.loss_agg_mode 'seq-mean-token-sum-norm': it is the fixed "
            "horizon L (tokens) that every sequence's token sum is divided by",
        )


@_check("mode", "buffer.explorer_input.taskset", "buffer.explorer_input.tasksets")
def _explorer_has_tasks(cfg: TrinityConfig) -> Iterator[Problem]:
    inp = cfg.buffer.explorer_input
    if cfg.mode in ("both", "explore") and inp.taskset is None and not inp.tasksets:
        yield Problem(
            "buffer.explorer_input.taskset",
            f"mode '{cfg.mode}' needs a taskset: set buffer.explorer_input.taskset "
            "(or a non-empty tasksets list)",
        )
    if inp.taskset is not None and inp.tasksets:
        yield Problem("buffer.explorer_input.tasksets", "set either taskset or tasksets, not both")


@_check("buffer.explorer_input.tasksets", "buffer.explorer_input.taskset_ratios")
def _mixed_tasksets_are_told_apart(cfg: TrinityConfig) -> Iterator[Problem]:
    """`taskset_ratios` gives one share per set of `tasksets`; mixed sets have distinct names
    (their metrics and their experiences' ids carry them)."""
    inp = cfg.buffer.explorer_input
    at = "buffer.explorer_input"
    if inp.taskset_ratios and len(inp.taskset_ratios) != len(inp.tasksets):
        yield Problem(
            f"{at}.taskset_ratios",
            f"{len(inp.taskset_ratios)} ratios for {len(inp.tasksets)} tasksets: give one per "
            "set of buffer.explorer_input.tasksets (a single `taskset` is not mixed)",
        )
    names = [s.name or str(s.path) for s in inp.tasksets]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield Problem(
                f"{at}.tasksets[{i}].name",
                f"{name!r} names tasksets[{names.index(name)}] too: mixed tasksets need distinct "
                "names (their metrics are reported per set)",
            )


@_check("mode", "buffer.trainer_input.experience_buffer")
def _trainer_has_experiences(cfg: TrinityConfig) -> Iterator[Problem]:
    if cfg.mode == "train" and cfg.buffer.trainer_input.experience_buffer is None:
        yield Problem(
            "buffer.trainer_input.experience_buffer",
            "mode 'train' needs an experience buffer to read from",
        )


@_check("buffer.trainer_input.experience_buffer")
def _sql_buffer_names_a_database(cfg: TrinityConfig) -> Iterator[Problem]:
    """`storage_type: sql`: `path` is a SQLite file or a database URL we run on (checked by its
    form: no connection is made here)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is None or eb.storage_type != "sql":
        return
    from trinity.buffer.sql_url import url_problem

    if (why := url_problem(eb.path)) is not None:
        yield Problem("buffer.trainer_input.experience_buffer.path", f"storage_type sql: {why}")


@_check("buffer.trainer_input.experience_buffer")
def _replay_settings(cfg: TrinityConfig) -> Iterator[Problem]:
    """`replay_buffer.enable`: an experience storage that keeps priorities (queue or sql) and a
    priority function that takes the arguments given."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is None or not eb.replay_buffer.enable:
        return
    at = "buffer.trainer_input.experience_buffer"
    if eb.storage_type not in ("queue", "sql"):
        yield Problem(
            f"{at}.replay_buffer.enable",
            f"replay reuses rollout experiences of a queue or sql storage; storage_type "
            f"{eb.storage_type!r} is read once, in order",
        )
    from trinity.buffer.replay import priority_args_problem

    rb = eb.replay_buffer
    if (why := priority_args_problem(rb.priority_fn, rb.priority_fn_args)) is not None:
        yield Problem(f"{at}.replay_buffer.priority_fn_args", why)


@_check("buffer.trainer_input.experience_buffer")
def _experience_file_format(cfg: TrinityConfig) -> Iterator[Problem]:
    """Explorers of the `file` experience storage write a `.jsonl` file or a `.parquet` folder
    of parts (`buffer/record_format.py`); any other name is a `datasets` save folder, which a
    train run reads and nobody writes (what the path holds is the pre-flight pass's to check)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is None or eb.storage_type != "file" or not eb.path or not writes_experience_file(cfg):
        return
    if cfg.mode in ("both", "explore") and not eb.path.endswith(SUFFIXES):
        suffix = PurePath(eb.path).suffix or "no extension"
        yield Problem(
            "buffer.trainer_input.experience_buffer.path",
            f"storage_type file as an experience buffer that explorers write is a JSONL file "
            f"(.jsonl) or a folder of Parquet parts (.parquet), not {suffix!r} (another name is "
            "a `datasets` save folder, which a train run reads and nobody writes)",
        )


@_check("mode", "algorithm.algorithm_type")
def _pairwise_trains_offline(cfg: TrinityConfig) -> Iterator[Problem]:
    from trinity.algorithm.algorithms import is_pairwise

    if is_pairwise(cfg.algorithm.algorithm_type) and cfg.mode != "train":
        yield Problem(
            "mode",
            f"algorithm_type {cfg.algorithm.algorithm_type!r} trains on (chosen, rejected) pairs "
            "of an offline dataset: use mode 'train' with buffer.trainer_input.experience_buffer",
        )


def _spec(cfg: TrinityConfig) -> Any:
    """The config's algorithm record; None for a name the pre-flight pass reports."""
    from trinity.algorithm.algorithms import known_algorithm

    return known_algorithm(cfg.algorithm.algorithm_type)


@_check(
    "algorithm.rollout_correction",
    "algorithm.filter_groups",
    "algorithm.overlong_penalty",
    "algorithm.algorithm_type",
)
def _correction_needs_rollouts(cfg: TrinityConfig) -> Iterator[Problem]:
    if getattr(_spec(cfg), "use_rollout", True):
        return
    why = f"{cfg.algorithm.algorithm_type!r} trains on a dataset"
    if cfg.algorithm.rollout_correction.enabled:
        yield Problem(
            "algorithm.rollout_correction",
            f"{why}: there are no engine logprobs to correct against; turn rollout_is and "
            "rollout_rs off",
        )
    for key, what in (("filter_groups", "no groups to filter"), ("overlong_penalty", "no reward")):
        if getattr(cfg.algorithm, key).enable:
            yield Problem(f"algorithm.{key}.enable", f"{why}: {what}; set it false or remove it")


@_check("algorithm.kl_ctrl", "algorithm.kl_penalty_fn")
def _adaptive_kl_has_a_penalty(cfg: TrinityConfig) -> Iterator[Problem]:
    algo = cfg.algorithm
    if algo.kl_ctrl.type == "adaptive" and (
        algo.kl_penalty_fn or getattr(_spec(cfg), "kl_penalty_fn", None)
    ) in (None, "none"):
        yield Problem(
            "algorithm.kl_ctrl.type",
            "'adaptive' steers the KL reward penalty's coefficient: set algorithm.kl_penalty_fn "
            "(e.g. k1) with kl_penalty_fn_args.kl_coef as its starting value",
        )


@_check("algorithm.overlong_penalty", "model.max_response_tokens")
def _overlong_fits(cfg: TrinityConfig) -> Iterator[Problem]:
    from trinity.algorithm.algorithms import record_flag

    if _spec(cfg) is None or not record_flag(cfg.algorithm, "overlong_penalty"):
        return
    horizon, buffer_len = cfg.model.max_response_tokens, cfg.algorithm.overlong_penalty.buffer_len
    if horizon is None:
        yield Problem(
            "model.max_response_tokens",
            "the overlong penalty (algorithm.overlong_penalty) needs L_max: set it",
        )
    elif buffer_len is not None and buffer_len > horizon:
        yield Problem(
            "algorithm.overlong_penalty.buffer_len",
            f"{buffer_len} exceeds model.max_response_tokens={horizon}",
        )


@_check("explorer.malformed_tool_calls")
def _penalty_has_its_policy(cfg: TrinityConfig) -> Iterator[Problem]:
    m = cfg.explorer.malformed_tool_calls
    if m.penalty is not None and m.policy != "penalize":
        yield Problem(
            "explorer.malformed_tool_calls.penalty",
            f"is used by policy 'penalize' only, but policy is {m.policy!r}: set "
            "policy: penalize, or drop the penalty",
        )


@_check("mode", "buffer.explorer_input.eval_tasksets")
def _bench_has_eval_tasksets(cfg: TrinityConfig) -> Iterator[Problem]:
    if cfg.mode == "bench" and not cfg.stages and not cfg.buffer.explorer_input.eval_tasksets:
        yield Problem(
            "buffer.explorer_input.eval_tasksets",
            "mode 'bench' evaluates checkpoints on the eval tasksets: set at least one",
        )


@_check(
    "mode",
    "stages",
    "model.external_model",
    "explorer.rollout_model.engine_type",
    "explorer.rollout_model.tensor_parallel_size",
)
def _external_model_is_benched(cfg: TrinityConfig) -> Iterator[Problem]:
    ext = cfg.model.external_model
    if not ext.enable:
        return
    if cfg.mode != "bench" or cfg.stages:
        what = "stages" if cfg.stages else f"mode {cfg.mode!r}"
        yield Problem(
            "model.external_model.enable",
            f"an external model is evaluated with mode 'bench' only, not {what}: it has no "
            "weights here to train, sync or save, and its rollouts carry no engine logprobs a "
            "trainer could correct with; set mode: bench (no stages), or enable: false",
        )
    if not (ext.model_name or "").strip():
        yield Problem(
            "model.external_model.model_name",
            "required with enable: true: the model name the endpoint serves (GET /v1/models)",
        )
    rm = cfg.explorer.rollout_model
    if rm.engine_type is not None:
        yield Problem(
            "explorer.rollout_model.engine_type",
            f"is {rm.engine_type!r}, but model.external_model samples the rollouts (engine "
            "'external'): leave engine_type unset",
        )
    if rm.tensor_parallel_size > 1:
        yield Problem(
            "explorer.rollout_model.tensor_parallel_size",
            f"is {rm.tensor_parallel_size}, but model.external_model's endpoint holds the model "
            "(its server splits it, if at all): use 1",
        )


@_check("explorer.bench_on_latest_checkpoint", "explorer.bench_checkpoints")
def _one_checkpoint_choice(cfg: TrinityConfig) -> Iterator[Problem]:
    e = cfg.explorer
    if e.bench_on_latest_checkpoint and e.bench_checkpoints not in ("all", "latest"):
        yield Problem(
            "explorer.bench_checkpoints",
            f"is {e.bench_checkpoints!r} but explorer.bench_on_latest_checkpoint is true (that is "
            "'latest'): set one of them",
        )


@_check("cluster.ray_address", "cluster.node_num")
def _local_instance_is_one_node(cfg: TrinityConfig) -> Iterator[Problem]:
    # with `auto` or an address, the node count is the cluster's: `trinity run` checks it there
    if cfg.cluster.ray_address == "local" and (cfg.cluster.node_num or 1) > 1:
        yield Problem(
            "cluster.node_num",
            f"{cfg.cluster.node_num} nodes, but ray_address 'local' starts a local Ray instance, "
            "which is one node; join a cluster (ray_address: auto, or its address)",
        )


@_check("synchronizer", "cluster.node_num", "cluster.gpu_per_node")
def _shared_weights_never_race(cfg: TrinityConfig) -> Iterator[Problem]:
    """`sync_method: shared` gives the engines the trainer's live weights (trinity/sync/shared.py):
    only a schedule where nothing samples while the trainer trains may use them."""
    sync = cfg.synchronizer
    if sync.sync_method != "shared" or cfg.mode != "both":
        return  # other modes fall back to checkpoint (resolve)
    why = "sync_method shared: the engines sample with the trainer's live weights, so"
    if sync.sync_style != "fixed":
        yield Problem(
            "synchronizer.sync_style",
            f"{why} the schedule must be fixed (got {sync.sync_style!r}); use sync_method memory",
        )
    if sync.sync_interval != 1 or sync.sync_offset != 0:
        yield Problem(
            "synchronizer.sync_offset" if sync.sync_offset else "synchronizer.sync_interval",
            f"{why} the run must be strictly on-policy (sync_interval 1, sync_offset 0; got "
            f"{sync.sync_interval}, {sync.sync_offset}): otherwise the explorer samples while the "
            "trainer updates; use sync_method memory",
        )
    if (cfg.cluster.node_num or 1) > 1:
        yield Problem(
            "cluster.node_num",
            f"{why} trainer and engines share one machine's memory; use memory or nccl across "
            f"{cfg.cluster.node_num} nodes",
        )
    if cfg.cluster.gpu_per_node:
        yield Problem(
            "cluster.gpu_per_node",
            f"{why} the weights must be in CPU memory; use nccl or memory with GPUs",
        )


@_check("model.lora_configs", "synchronizer.sync_method")
def _one_lora_adapter(cfg: TrinityConfig) -> Iterator[Problem]:
    """`model.lora_configs` trains one adapter on linear layers (docs/lora.md)."""
    adapters = cfg.model.lora_configs or []
    if len(adapters) > 1:
        yield Problem(
            "model.lora_configs",
            f"{len(adapters)} adapters; one LoRA adapter is trained here (as Trinity-RFT): "
            "keep one",
        )
    for i, lora in enumerate(adapters):
        targets = [lora.target_modules] if isinstance(lora.target_modules, str) else []
        targets += [] if isinstance(lora.target_modules, str) else lora.target_modules
        heads = [t for t in targets if t.rsplit(".", 1)[-1] in ("lm_head", "embed_tokens")]
        if heads:
            yield Problem(
                f"model.lora_configs[{i}].target_modules",
                f"{heads}: embeddings and the output head get no adapter here (the engines "
                "merge adapters into linear layers); adapt the decoder's linear layers",
            )
    if adapters and cfg.synchronizer.sync_method == "shared":
        yield Problem(
            "synchronizer.sync_method",
            "sync_method shared maps the trainer's full weights into the engines, and with "
            "model.lora_configs the engines serve base + adapter merged into weights of their "
            "own; use memory (or checkpoint, nccl): a sync then sends only the adapter",
        )


@_check(
    "mode",
    "cluster",
    "synchronizer.sync_method",
    "buffer.trainer_input.experience_buffer",
    "explorer.rollout_model",
    "trainer.num_threads",
)
def _one_process_is_one_local_process(cfg: TrinityConfig) -> Iterator[Problem]:
    """`cluster.one_process` hosts the explorer and the trainer in one worker process on one
    machine's CPUs (trinity/common/service_host.py)."""
    if not cfg.cluster.one_process:
        return
    why = "cluster.one_process: the explorer and the trainer are objects of one process, so"
    if cfg.mode in ("explore", "serve") or trains_from_queue(cfg):
        yield Problem(
            "cluster.one_process",
            f"{why} it cannot be one part of a run split over processes (mode {cfg.mode}); "
            "remove it, or run mode both",
        )
    if cfg.synchronizer.sync_method == "nccl":
        yield Problem(
            "synchronizer.sync_method",
            f"{why} the engines load weights by memory, checkpoint or shared, not by a "
            "collective between processes (nccl); use memory or shared",
        )
    if (cfg.cluster.node_num or 1) > 1:
        yield Problem("cluster.node_num", f"{why} the run is one node, not {cfg.cluster.node_num}")
    if cfg.cluster.gpu_per_node:
        yield Problem(
            "cluster.gpu_per_node",
            f"not built yet: {why} it runs on CPUs (set gpu_per_node: 0, or leave one_process "
            "off on GPUs)",
        )
    rm = cfg.explorer.rollout_model
    if "in_explorer_process" in rm.model_fields_set and not rm.in_explorer_process:
        yield Problem(
            "explorer.rollout_model.in_explorer_process",
            f"{why} the rollout engines are threads of that process; remove "
            "in_explorer_process: false",
        )
    threads = (cfg.trainer.num_threads, rm.num_threads)
    if None not in threads and threads[0] != threads[1]:
        yield Problem(
            "explorer.rollout_model.num_threads",
            f"{why} torch's thread count is the process's: trainer.num_threads "
            f"({threads[0]}) and explorer.rollout_model.num_threads ({threads[1]}) must agree",
        )


@_check("mode", "cluster", "synchronizer.sync_method", "explorer", "buffer.trainer_input")
def _colocation_is_one_device(cfg: TrinityConfig) -> Iterator[Problem]:
    """`cluster.colocate: true`: the trainer and the rollout engines of one run take turns on
    one device (trinity/common/turns.py)."""
    c = cfg.cluster
    if not c.colocate:
        return
    why = "cluster.colocate: the trainer and the rollout engines take turns on one device, so"
    if cfg.mode not in ("both", "train") or trains_from_queue(cfg):
        yield Problem(
            "cluster.colocate",
            f"{why} the run must hold both (mode both, or train with eval tasksets), not mode "
            f"{cfg.mode}" + (" reading another process's queue" if trains_from_queue(cfg) else ""),
        )
    if c.one_process:
        yield Problem(
            "cluster.one_process",
            f"{why} they are processes that sleep and wake in turn; one process lends cores "
            "instead: remove one of them",
        )
    if (c.node_num or 1) > 1:
        yield Problem("cluster.node_num", f"{why} the run is one node, not {c.node_num}")
    if (c.gpu_per_node or 0) > 1:
        yield Problem(
            "cluster.gpu_per_node",
            f"{why} it uses one GPU, not {c.gpu_per_node}: with more, give each side its own",
        )
    if cfg.synchronizer.sync_method == "shared":
        yield Problem(
            "synchronizer.sync_method",
            f"{why} each side's copy of the weights leaves the device in its turn; shared maps "
            "one copy into both: use memory",
        )
    if cfg.explorer.auxiliary_models:
        yield Problem(
            "explorer.auxiliary_models",
            f"{why} auxiliary models would hold the device while the trainer steps (as "
            "Trinity-RFT, colocation refuses them)",
        )
    if cfg.explorer.rollout_model.tensor_parallel_size > 1:
        yield Problem(
            "explorer.rollout_model.tensor_parallel_size",
            f"{why} an engine is one process on it, not "
            f"{cfg.explorer.rollout_model.tensor_parallel_size}",
        )


@_check("trainer", "cluster.one_process", "synchronizer.sync_method", "algorithm.optimizer")
def _sharded_trainer_is_processes(cfg: TrinityConfig) -> Iterator[Problem]:
    """A sharded trainer (`trainer_strategy: fsdp2`, or unset with sequence parallelism) is
    `world_size` processes of its own."""
    t = cfg.trainer
    sharded = trainer_strategy(cfg)[0] == "fsdp2"
    if not sharded:
        if (t.world_size or 1) > 1:
            yield Problem(
                "trainer.world_size",
                f"{t.world_size} ranks need a sharded trainer: set trainer.trainer_strategy: "
                "fsdp2 (torch is one process)",
            )
        return
    if cfg.mode in ("explore", "bench", "serve"):
        return
    what = f"trainer.trainer_strategy {t.trainer_strategy}"
    if t.trainer_strategy is None:
        what = f"trainer.ulysses_sequence_parallel_size {t.ulysses_sequence_parallel_size}"
    if cfg.cluster.one_process:
        yield Problem(
            "cluster.one_process",
            f"{what}: the trainer's ranks are processes "
            "of their own, not objects of the run's one process; remove one_process",
        )
    if cfg.synchronizer.sync_method == "shared":
        yield Problem(
            "synchronizer.sync_method",
            f"{what}: shared maps the trainer's own "
            "tensors into the engines, and a sharded trainer holds only shards; use memory, "
            "checkpoint or nccl",
        )
    if cfg.algorithm.optimizer.state_dtype == "bfloat16":
        yield Problem(
            "algorithm.optimizer.state_dtype",
            f"not built yet with {what}: bf16 moments "
            "with stochastic rounding on sharded parameters; use float32 (sharding already "
            "divides the moments' memory by the ranks)",
        )


@_check("trainer", "cluster", "explorer.rollout_model", "mode")
def _sequence_parallel_fits(cfg: TrinityConfig) -> Iterator[Problem]:
    """`ulysses_sequence_parallel_size` ranks split each sequence: a sharded trainer whose
    world they divide into data-parallel groups (the model's heads: pre-flight)."""
    t, key = cfg.trainer, "trainer.ulysses_sequence_parallel_size"
    sp = t.ulysses_sequence_parallel_size
    if sp == 1:
        return
    strategy, _ = trainer_strategy(cfg)
    if strategy != "fsdp2":
        yield Problem(
            key,
            f"{sp} ranks per sequence need a sharded trainer: set trainer.trainer_strategy: "
            f"fsdp2 (trainer_strategy {t.trainer_strategy} is one process)",
        )
        return
    world, source = trainer_world_size(cfg, strategy)
    if world % sp:
        yield Problem(
            key,
            f"{sp} must divide trainer.world_size {world} ({source}): the ranks form "
            f"world_size / {sp} data-parallel groups of {sp} ranks, each a slice of every "
            "sequence",
        )


@_check("buffer.explorer_input")
def _readable_tasksets_have_paths(cfg: TrinityConfig) -> Iterator[Problem]:
    what = {"synthetic": "a generator name", "file": "a dataset path", "sql": "the database"}
    for path, storage, _ in cfg.buffer.explorer_input.storages():
        kind = storage.storage_type
        if kind in what and not storage.path:
            yield Problem(f"{path}.path", f"required for storage_type '{kind}': {what[kind]}")
        if kind != "sql":
            continue
        from trinity.buffer.sql_url import url_problem

        if storage.path and (why := url_problem(storage.path)) is not None:
            yield Problem(f"{path}.path", f"storage_type sql: {why}")
        if not storage.name:
            yield Problem(
                f"{path}.name",
                "required for storage_type 'sql': the table holding the tasks (as Trinity-RFT)",
            )


@_check("buffer.explorer_input")
def _reward_limits_valid(cfg: TrinityConfig) -> Iterator[Problem]:
    """The keys of `reward_fn_args` that bound each reward call (`rewards/limits.py`)."""
    from trinity.rewards.limits import limit_problems

    for path, storage, _ in cfg.buffer.explorer_input.storages():
        for key, why in limit_problems(storage.reward_fn_args):
            yield Problem(f"{path}.reward_fn_args.{key}", why)


@_check("buffer.total_steps", "trainer.total_steps")
def _one_total_steps(cfg: TrinityConfig) -> Iterator[Problem]:
    a, b = cfg.buffer.total_steps, cfg.trainer.total_steps
    if a is not None and b is not None and a != b:
        yield Problem(
            "trainer.total_steps",
            f"disagrees with buffer.total_steps ({b} vs {a}); set only one of them",
        )


@_check("algorithm.policy_loss_fn_args")
def _clip_ranges_positive(cfg: TrinityConfig) -> Iterator[Problem]:
    args = cfg.algorithm.policy_loss_fn_args
    for key in (k for k in ("clip_range", "clip_range_low", "clip_range_high") if k in args):
        if isinstance(args[key], bool) or not isinstance(args[key], Real) or args[key] <= 0:
            why = f"must be a positive number, got {args[key]!r}"
            yield Problem(f"algorithm.policy_loss_fn_args.{key}", why)


@_check("stages")
def _stage_names_unique(cfg: TrinityConfig) -> Iterator[Problem]:
    counts = Counter(stage.stage_name for stage in cfg.stages)
    for i, stage in enumerate(cfg.stages):
        if counts[stage.stage_name] > 1:
            yield Problem(
                f"stages[{i}].stage_name", f"stage name '{stage.stage_name}' is used more than once"
            )


@_check("mode", "explorer.auxiliary_models", "model", "algorithm.algorithm_type")
def _auxiliary_models_serve(cfg: TrinityConfig) -> Iterator[Problem]:
    """Each auxiliary model names its weights and has a unique name; mode serve (no workflows)
    has none. Lengths are not checked against each other: a reply's budget is what its prompt
    leaves under max_model_len (the engine's rule), as Trinity-RFT's judge configs expect."""
    aux = cfg.explorer.auxiliary_models
    if getattr(_spec(cfg), "teacher_from_auxiliary", False) and not aux:
        yield Problem(
            "explorer.auxiliary_models",
            f"{cfg.algorithm.algorithm_type!r} needs its teacher: set auxiliary_models[0].model_path",
        )
    if cfg.mode == "serve" and aux:
        yield Problem(
            "explorer.auxiliary_models",
            "mode 'serve' runs no workflows, and auxiliary models serve workflows: remove them "
            "(or run the workflows in mode both/explore)",
        )
    seen: dict[str, int] = {}
    for i, m in enumerate(aux):
        at = f"explorer.auxiliary_models[{i}]"
        if not m.model_path:
            yield Problem(f"{at}.model_path", "required for an auxiliary model")
        if m.name is not None:
            if not m.name.strip():
                yield Problem(f"{at}.name", "an empty name; remove it or name the model")
            elif m.name in seen:
                yield Problem(
                    f"{at}.name",
                    f"{m.name!r} already names auxiliary_models[{seen[m.name]}]; names are unique",
                )
            seen.setdefault(m.name, i)


@_check("explorer.rollout_model", "explorer.auxiliary_models", "synchronizer.sync_method")
def _engines_in_the_explorer_load_by_memory(cfg: TrinityConfig) -> Iterator[Problem]:
    """`in_explorer_process` engines are threads of the explorer (`explorer.in_process.InThread`):
    they load weights by checkpoint, memory or shared, and only the rollout model has them."""
    if (
        cfg.explorer.rollout_model.in_explorer_process
        and not cfg.cluster.one_process  # its own check says it
        and cfg.synchronizer.sync_method == "nccl"
    ):
        yield Problem(
            "explorer.rollout_model.in_explorer_process",
            "not built yet: collective (nccl) weight sync to engines in the explorer's process; "
            "use sync_method memory, or engines in processes of their own",
        )
    for i, m in enumerate(cfg.explorer.auxiliary_models):
        if m.in_explorer_process:
            yield Problem(
                f"explorer.auxiliary_models[{i}].in_explorer_process",
                "not built yet for auxiliary models: only the rollout model's engines run in the "
                "explorer's process; remove it",
            )


@_check(
    "explorer.rollout_model",
    "explorer.auxiliary_models",
    "synchronizer.sync_method",
    "cluster.one_process",
)
def _vllm_engines_can_run(cfg: TrinityConfig) -> Iterator[Problem]:
    """The vLLM engine runs in engine processes of its own that copy the weights they load:
    vLLM loads weights into its own layout, and its engine core sets up process-wide state (its
    torch thread count, a default process group) that the trainer's process must not share.
    (Whether vLLM is installed here is `support.own_problems`'s: a config that names it loads
    anywhere.)"""
    rm = cfg.explorer.rollout_model
    if rm.engine_type != "vllm":
        return
    if cfg.synchronizer.sync_method == "shared" and cfg.mode == "both":
        yield Problem(
            "synchronizer.sync_method",
            "shared: the engines would sample with the trainer's own tensors, and the vLLM "
            "engine loads weights into its own layout (a copy); use memory, checkpoint or nccl",
        )
    if cfg.cluster.one_process:
        yield Problem(
            "cluster.one_process",
            "the vLLM engine runs in a process of its own (its engine core sets the process's "
            "torch threads and default process group); remove one_process, or use "
            "engine_type transformers",
        )
    elif rm.in_explorer_process:
        yield Problem(
            "explorer.rollout_model.in_explorer_process",
            "the vLLM engine runs in a process of its own, not on a thread of the explorer; "
            "remove in_explorer_process",
        )


@_check("explorer.rollout_model.engine_type", "model.logprobs", "buffer.explorer_input")
def _vllm_top_logprobs(cfg: TrinityConfig) -> Iterator[Problem]:
    """The vLLM engine returns at most 20 top-k alternatives per token (`max_logprobs`)."""
    if cfg.explorer.rollout_model.engine_type != "vllm":
        return
    asked = [("model.logprobs", cfg.model.logprobs)]
    asked += [
        (f"{path}.rollout_args.logprobs", s.rollout_args.logprobs)
        for path, s, _ in cfg.buffer.explorer_input.storages()
        if s.rollout_args is not None
    ]
    for path, k in asked:
        if k is not None and k > VLLM_MAX_LOGPROBS:
            yield Problem(
                path,
                f"{k}: the vLLM engine returns at most {VLLM_MAX_LOGPROBS} alternatives per "
                "token (vLLM's max_logprobs); use engine_type transformers for more",
            )


@_check(
    "explorer.rollout_model",
    "explorer.auxiliary_models",
    "synchronizer.sync_method",
    "cluster.one_process",
)
def _tensor_parallel_engines(cfg: TrinityConfig) -> Iterator[Problem]:
    """A tensor-parallel engine (`tensor_parallel_size` > 1, `explorer/tp_engine.py`) is that
    many processes of the transformers engine, each holding slices of the weights. (Whether
    the size divides the model's heads is pre-flight's: it reads the model's config; so is the
    refusal with engine_type vllm, a feature not built, as every not-built key's.)"""
    pools = [("rollout_model", cfg.explorer.rollout_model)]
    pools += [(f"auxiliary_models[{i}]", m) for i, m in enumerate(cfg.explorer.auxiliary_models)]
    for at, pool in pools:
        t, key = pool.tensor_parallel_size, f"explorer.{at}.tensor_parallel_size"
        if t == 1:
            continue
        if at != "rollout_model":  # auxiliary engines are actors in every layout
            continue
        if pool.in_explorer_process:
            yield Problem(
                key,
                f"{t}: a tensor-parallel engine is {t} processes, and in_explorer_process "
                "makes the engines threads of the explorer; remove one of them",
            )
        if cfg.cluster.one_process:
            yield Problem(
                "cluster.one_process",
                f"{key} {t}: a tensor-parallel engine's ranks are processes of their own, not "
                "objects of the run's one process; remove one_process",
            )
        if cfg.synchronizer.sync_method == "shared":
            yield Problem(
                "synchronizer.sync_method",
                f"shared: the engines would sample with the trainer's own tensors, and each "
                f"rank of a tensor-parallel engine ({key} {t}) keeps a copy of its slices; use "
                "memory, checkpoint or nccl",
            )


# advantage fns that score each sample on its own: a train step may split a task's samples
_PER_SAMPLE_ADVANTAGES = frozenset(
    {"gae", "ppo", "reinforce", "reinforceplusplus", "on_policy_distill", "none"}
)


def _uses_groups(cfg: TrinityConfig) -> bool:
    """The algorithm trains on rollouts and normalises each task's samples as a group."""
    spec = _spec(cfg)
    if spec is None:
        return False
    advantage = cfg.algorithm.advantage_fn or spec.advantage_fn
    return spec.use_rollout and advantage is not None and advantage not in _PER_SAMPLE_ADVANTAGES


@_check(
    "mode",
    "algorithm",
    "buffer.batch_size",
    "buffer.train_batch_size",
    "buffer.explorer_input",
    "buffer.trainer_input.experience_buffer",
    "synchronizer.sync_style",
)
def _batches_run_exactly(cfg: TrinityConfig) -> Iterator[Problem]:
    """Batch sizes whose steps cannot run exactly are refused (finding 2). With

        g = samples per task (a taskset's rollout_args.n, else its repeat_times, else
            algorithm.repeat_times; one value per training taskset),
        E = buffer.batch_size × g, experiences per explore step (DAPO's filter_groups refills
            the groups it drops, so a step still holds E), and
        T = buffer.train_batch_size, experiences per train step (0 = derived: E; with
            sample_strategy mix, its rollouts: the expert rows are not the explorer's),

    1. mode both with sync_style fixed: T == E. The fixed schedule pairs one explore step with
       one train step: T > E waits for experiences that come only after the next weight sync
       (a stall until max_read_timeout), T < E leaves E - T experiences of every step behind.
       With tasksets of different g, E varies from step to step: refused unless they agree.
    2. every mode that trains on rollouts (both, or train reading a queue) when the algorithm
       normalises a task's samples as a group (its advantage fn is not per-sample) and g > 1:
       T is a multiple of every g, so no group is split across two train steps.

    Multi-stage runs: each stage is checked as its own merged config; a base with stages only
    through its stages (it does not run as written).
    """
    if cfg.stages:
        return
    trains_rollouts = cfg.mode == "both" or trains_from_queue(cfg)
    if not trains_rollouts:
        return
    groups = samples_per_task(cfg)
    tasks, written = cfg.buffer.batch_size, cfg.buffer.train_batch_size
    if written > 0:  # sample_strategy mix: the rollouts part of it (`resolved.mixed_rows`)
        written = mixed_rows(cfg, written, derived=False)[0]
    where = "buffer.train_batch_size"
    if cfg.mode == "both" and cfg.synchronizer.sync_style == "fixed":
        if len(groups) > 1:
            yield Problem(
                "buffer.explorer_input.tasksets",
                f"the training tasksets draw different samples per task ({groups}), so an "
                "explore step's experience count varies, which sync_style 'fixed' cannot pair "
                "with one train step: give them one repeat_times, or use sync_style "
                "'trainer_driven'",
            )
            return
        per_step = tasks * groups[0]
        if written and written != per_step:
            effect = (
                "the trainer would wait for experiences that come only after the next weight "
                "sync (a stall until max_read_timeout)"
                if written > per_step
                else f"{per_step - written} experiences of every explore step would be left behind"
            )
            yield Problem(
                where,
                f"{written} experiences per train step, but an explore step makes "
                f"batch_size × samples per task = {tasks} × {groups[0]} = {per_step}, and "
                f"sync_style 'fixed' trains one explore step per train step: {effect}; set it "
                f"to {per_step} or remove it (0 = derived)",
            )
            return
    if not _uses_groups(cfg):
        return
    size = written or tasks * groups[0]
    for g in groups:
        if g > 1 and size % g:
            what = f"{size} experiences per train step" + ("" if written else " (derived)")
            yield Problem(
                where,
                f"{what} is not a multiple of the {g} samples per task, so "
                f"{cfg.algorithm.algorithm_type!r}'s groups would be split across train steps; "
                f"use a multiple of {g} (e.g. {size // g * g or g} or {(size // g + 1) * g})",
            )
