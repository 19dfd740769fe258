"""What this build does with each config key: acted upon, not built yet, or not applicable here.

Every field of the schema (all sections, list and mapping items included) is in exactly one state,
declared in `KEY_STATES` below; a section's entry covers the fields under it that have none.

* acted upon: the runtime reads it and it changes what happens. Some values of an acted-upon key
  may name a feature that is not built (`refused`, e.g. `mode: bench`): those are refused.
* not built yet: accepted because Trinity-RFT configs use it, but the feature is missing here; a
  config that sets it to anything but its inert value (the default unless stated) is refused
  with exit code 2 and a message naming the feature.
* not applicable here: it configures something this build does not run (a vLLM memory knob while
  the transformers engine serves rollouts); when a config sets it, `validate` and `run` print one
  line naming the key and the reason.

    from trinity.config.support import not_built_problems, not_applicable_notes
    problems = not_built_problems(cfg)   # list[Problem], each naming the key and the feature
    notes = not_applicable_notes(cfg)    # list[str], printed by validate and run

`not_applicable_notes` also carries the notes about deprecated spellings the file used
(`task_selector` read as `data_selector`, ...), so `validate` prints everything said about keys in
one place. `tests/test_config_support.py` walks the schema and fails on a field without a state
and on an entry naming a field that does not exist; `docs/architecture.md` lists the not-built
entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from trinity.config.problems import Problem, _strip
from trinity.config.schema import TrinityConfig
from trinity.config.trainer_config import unmapped_keys

State = Literal["acted", "not_built", "not_applicable"]
_DEFAULT = object()  # inert value of a not-built key: the schema default


@dataclass(frozen=True)
class KeyState:
    """The state of one key (or of every field under a section without its own entry).

    Attributes:
        path: key pattern; `[*]` stands for every item of a list or mapping.
        state: acted, not_built or not_applicable.
        reason: acted: what reads it; not_built: the missing feature; not_applicable: why it has
            no effect here. Printed in refusals and notes.
        inert: not_built only: values accepted without refusal (default: the schema default).
        refused: values whose feature is not built (any state), with `reason` naming it.
        first_only: acted only for the first item of the list in `path`; the later items' values
            are noted as not applicable with `reason`.
    """

    path: str
    state: State
    reason: str
    inert: Any = _DEFAULT
    refused: tuple[Any, ...] = ()
    refused_reason: str = ""
    first_only: bool = False


def acted(path: str, reason: str, **kw: Any) -> KeyState:
    """A key the runtime reads; `refused=(values...)` with `refused_reason` for unbuilt values."""
    return KeyState(path, "acted", reason, **kw)


def not_built(path: str, feature: str, inert: Any = _DEFAULT) -> KeyState:
    """A key whose feature is missing; refused unless its value is `inert` (a tuple = any of)."""
    return KeyState(path, "not_built", feature, inert=inert)


def not_applicable(path: str, reason: str, **kw: Any) -> KeyState:
    """A key with no effect in this build; noted when set."""
    return KeyState(path, "not_applicable", reason, **kw)


_VLLM = "vLLM engine knob; the transformers engine serves rollouts"
_OPENAI = "OpenAI-compatible endpoint setting; the endpoint is not built (enable_openai_api)"
_WANDB = "for wandb/mlflow/swanlab monitors, which are not built"
_NO_ROLLOUT = "a rollout setting; the trainer's experience buffer is not rolled out"
_TASKSETS = ("buffer.explorer_input.taskset", "buffer.explorer_input.tasksets[*]")
_EVAL = "buffer.explorer_input.eval_tasksets[*]"
_EXP = "buffer.trainer_input.experience_buffer"


def _storage_entries() -> list[KeyState]:
    """The fields of StorageConfig at each place it is used (tasksets, eval sets, buffer)."""
    out: list[KeyState] = []
    for p in (*_TASKSETS, _EVAL):
        out += [
            acted(f"{p}.name", "taskset name in task ids and eval metric keys"),
            acted(
                f"{p}.storage_type",
                "load_taskset: files or a synthetic generator",
                refused=("queue", "sql"),
                refused_reason="tasksets from a queue or SQL table",
            ),
            *(
                acted(f"{p}.{k}", "load_taskset")
                for k in ("path", "subset_name", "split", "format", "generator_args")
            ),
            *(
                acted(f"{p}.{k}", "the explorer's workflow runs")
                for k in ("rollout_args", "workflow_args", "reward_fn_args")
            ),
            acted(f"{p}.default_workflow_type", "the explorer's workflow choice"),
            acted(f"{p}.default_reward_fn_type", "the reward function choice"),
            not_built(f"{p}.format.reply_prefix", "forcing the reply to start with a prefix"),
            not_built(f"{p}.rollout_args.logprobs", "top-k logprobs per token", inert=(None, 0)),
            not_built(f"{p}.format.image_key", "multi-modal tasks (images)"),
            not_built(f"{p}.format.video_key", "multi-modal tasks (videos)"),
            not_applicable(f"{p}.format.chosen_key", "DPO preference column; DPO is not built"),
            not_applicable(f"{p}.format.rejected_key", "DPO preference column; DPO is not built"),
            not_applicable(f"{p}.capacity", "queue size; a taskset is read from its source"),
            not_applicable(f"{p}.max_read_timeout", "queue read timeout; not a queue"),
            not_applicable(f"{p}.replay_buffer", "experience replay; tasks are not replayed"),
            not_applicable(
                f"{p}.total_epochs",
                "buffer.total_epochs counts passes (Trinity-RFT also sets this from it)",
            ),
            not_applicable(f"{p}.enable_progress_bar", "no progress bar while loading here"),
            not_applicable(f"{p}.schema_type", "the task schema is fixed here"),
        ]
    out += [
        *(acted(f"{p}.repeat_times", "samples per task of this set") for p in _TASKSETS),
        not_built(
            f"{_EVAL}.repeat_times",
            "several samples per eval task via repeat_times (rollout_args.n does it)",
            inert=(None, 1),
        ),
        acted(
            "buffer.explorer_input.taskset.data_selector",
            "the order of training tasks",
        ),
        acted(
            "buffer.explorer_input.tasksets[*].data_selector",
            "only the first taskset's selector orders the mixed tasks; later ones are unused",
            first_only=True,
        ),
        not_applicable(f"{_EVAL}.data_selector", "eval sets are run whole, in file order"),
    ]
    e = _EXP
    out += [
        acted(f"{e}.name", "the experience queue's name"),
        acted(
            f"{e}.storage_type",
            "queue in mode both; the SFT/DPO dataset (file) in mode train",
            refused=("sql",),
            refused_reason="SQL experience storage",
        ),
        acted(f"{e}.capacity", "size of the experience queue (mode both)"),
        acted(f"{e}.max_read_timeout", "the trainer's wait for experiences"),
        *(
            acted(f"{e}.{k}", "the train dataset in mode train")
            for k in (
                "path",
                "subset_name",
                "split",
                "format",
                "generator_args",
                "data_selector",
                "total_epochs",
            )
        ),
        not_built(f"{e}.format.reply_prefix", "forcing the reply to start with a prefix"),
        not_built(f"{e}.format.image_key", "multi-modal data (images)"),
        not_built(f"{e}.format.video_key", "multi-modal data (videos)"),
        not_applicable(f"{e}.format.chosen_key", "DPO preference column; DPO is not built"),
        not_applicable(f"{e}.format.rejected_key", "DPO preference column; DPO is not built"),
        not_built(f"{e}.replay_buffer", "experience replay (priority reuse of experiences)"),
        *(
            not_applicable(f"{e}.{k}", _NO_ROLLOUT)
            for k in (
                "rollout_args",
                "workflow_args",
                "reward_fn_args",
                "default_workflow_type",
                "default_reward_fn_type",
                "repeat_times",
            )
        ),
        not_applicable(f"{e}.enable_progress_bar", "no progress bar while loading here"),
        not_applicable(f"{e}.schema_type", "the experience schema follows algorithm_type"),
    ]
    return out


def _model_entries(p: str, rollout: bool) -> list[KeyState]:
    """Fields of one inference model (explorer.rollout_model)."""
    limits = "set from model.* (Trinity-RFT overwrites these on the rollout model too)"
    return [
        not_applicable(
            f"{p}.model_path", "the rollout model is model.model_path (or the last stage's)"
        ),
        acted(
            f"{p}.engine_type",
            "the rollout engine (unset = best available, see resolve())",
            refused=("vllm",),
            refused_reason="the vLLM engine",
        ),
        acted(f"{p}.engine_num", "number of engine replicas"),
        not_built(f"{p}.tensor_parallel_size", "tensor-parallel inference"),
        acted(f"{p}.dtype", "engine weight dtype"),
        acted(f"{p}.seed", "engine sampling seed"),
        acted(f"{p}.max_batch_size", "sequences per generate call"),
        not_built(f"{p}.enable_openai_api", "the OpenAI-compatible endpoint"),
        not_built(f"{p}.enable_history", "recording model calls for workflows"),
        not_built(f"{p}.enable_thinking", "the chat-template enable_thinking switch"),
        *(
            not_applicable(f"{p}.{k}", _VLLM)
            for k in (
                "use_v1",
                "enforce_eager",
                "enable_prefix_caching",
                "enable_chunked_prefill",
                "gpu_memory_utilization",
                "enable_log_requests",
            )
        ),
        *(
            not_applicable(f"{p}.{k}", _OPENAI)
            for k in ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser")
        ),
        *(
            not_applicable(f"{p}.{k}", limits)
            for k in ("max_model_len", "max_prompt_tokens", "max_response_tokens")
            if rollout
        ),
    ]


KEY_STATES: tuple[KeyState, ...] = (
    # top level
    acted(
        "mode",
        "which loops run",
        refused=("bench", "serve"),
        refused_reason="modes bench (evaluate checkpoints) and serve",
    ),
    acted("project", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    acted("name", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    acted("checkpoint_root_dir", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    not_applicable("group", f"run group {_WANDB}"),
    not_applicable(
        "continue_from_checkpoint",
        "resume is not built yet: a run starts from model.model_path and an existing run folder "
        "is not resumed. Noted rather than refused because true is Trinity-RFT's default and "
        "behaves like false on a fresh run folder",
    ),
    acted("seed", "torch seed of the trainer"),
    acted("stage_name", "set by stage_configs()"),
    not_applicable("schema_type", "the experience schema follows algorithm.algorithm_type"),
    acted("stages", "stage_configs(): each stage is validated and checked as a whole config"),
    # algorithm
    acted("algorithm", "resolve_algorithm() and the train step"),
    acted("algorithm.optimizer", "build_optimizer()"),
    not_applicable(
        "algorithm.optimizer.optimizer_type", "always AdamW here ('adam' and 'adamw' both name it)"
    ),
    # model
    acted("model.model_path", "engines and trainer load it"),
    not_applicable("model.critic_model_path", "no critic model here (GAE critics not built)"),
    acted("model.max_model_len", "engine length limit"),
    acted("model.max_prompt_tokens", "SFT prompt truncation"),
    acted("model.max_response_tokens", "rollout length limit"),
    acted("model.temperature", "rollout sampling"),
    acted("model.top_p", "rollout sampling"),
    acted("model.top_k", "rollout sampling"),
    acted("model.custom_chat_template", "tokenizer chat template"),
    not_built("model.lora_configs", "LoRA"),
    not_built("model.enable_thinking", "the chat-template enable_thinking switch"),
    not_applicable(
        "model.enable_prompt_truncation",
        "rollout prompts are not truncated here: one too long for max_model_len is an error "
        "(as with false); SFT truncates to max_prompt_tokens",
    ),
    not_built("model.logprobs", "top-k logprobs per token", inert=(0,)),
    not_built("model.external_model", "rollouts from an externally served model"),
    not_built("model.tinker", "the Tinker training backend"),
    # cluster
    acted("cluster.ray_address", "ray.init"),
    not_built("cluster.node_num", "multi-node runs", inert=(None, 1)),
    not_applicable(
        "cluster.gpu_per_node", "the trainer uses one device: the GPU when there is one, else CPU"
    ),
    # buffer
    acted("buffer.batch_size", "tasks per explore step"),
    acted("buffer.train_batch_size", "experiences per train step"),
    acted("buffer.total_epochs", "passes over the taskset"),
    acted("buffer.total_steps", "run length"),
    acted("buffer.explorer_input.default_workflow_type", "workflow of tasks that name none"),
    acted("buffer.explorer_input.default_eval_workflow_type", "workflow of eval tasks"),
    acted("buffer.explorer_input.default_reward_fn_type", "reward of tasks that name none"),
    *_storage_entries(),
    not_built("buffer.trainer_input.auxiliary_buffers", "auxiliary buffers (mixed SFT + RL)"),
    # explorer
    not_applicable("explorer.name", "Ray actor name; actors are unnamed here"),
    acted("explorer.runner_per_model", "concurrent workflow runs per engine"),
    acted("explorer.max_timeout", "workflow timeout"),
    acted("explorer.max_retry_times", "workflow retries"),
    acted("explorer.eval_interval", "evaluation schedule"),
    acted("explorer.eval_on_startup", "evaluation at step 0"),
    *_model_entries("explorer.rollout_model", rollout=True),
    not_built("explorer.auxiliary_models", "auxiliary models (extra engines for workflows)"),
    not_built("explorer.env_vars", "environment variables for workflow runners"),
    not_applicable(
        "explorer.max_repeat_times_per_runner",
        "all samples of a task run in one workflow call here; splitting them over runners "
        "changes scheduling, not results",
    ),
    not_built("explorer.bench_on_latest_checkpoint", "mode bench"),
    # synchronizer
    acted(
        "synchronizer.sync_method",
        "how weights travel (unset = best available, see resolve())",
        refused=("nccl",),
        refused_reason="collective (nccl) weight sync; use memory or checkpoint",
    ),
    acted(
        "synchronizer.sync_style",
        "when weights travel",
        refused=("explorer_driven", "trainer_driven"),
        refused_reason="dynamic sync styles; use fixed",
    ),
    acted("synchronizer.sync_interval", "train steps between syncs"),
    acted("synchronizer.sync_offset", "explorer lead in steps"),
    acted("synchronizer.sync_timeout", "wait for a weight sync"),
    # trainer
    not_applicable("trainer.name", "Ray actor name; actors are unnamed here"),
    not_applicable(
        "trainer.trainer_type",
        "the built-in PyTorch trainer trains, not verl; the trainer_config keys that mean "
        "something here are read",
        refused=("tinker",),
        refused_reason="the Tinker training backend",
    ),
    acted(
        "trainer.trainer_strategy",
        "the trainer (unset = best available, see resolve())",
        refused=("fsdp", "fsdp2"),
        refused_reason="multi-rank training; use torch",
    ),
    *(
        acted(f"trainer.{k}", "the train step")
        for k in (
            "save_interval",
            "total_steps",
            "grad_clip",
            "micro_batch_size_per_gpu",
            "use_dynamic_bsz",
            "max_token_len_per_gpu",
            "max_checkpoints_to_keep",
            "dtype",
            "num_threads",
            "logprob_chunk_size",
            "ppo_epochs",
            "ppo_mini_batch_size",
        )
    ),
    not_built("trainer.ulysses_sequence_parallel_size", "sequence parallelism", inert=(1,)),
    acted(
        "trainer.trainer_config",
        "its verl keys that mean something here set our fields (trainer_config.py); the others "
        "are noted as not applicable",
    ),
    not_applicable("trainer.enable_preview", f"rollout preview {_WANDB}"),
    # monitor
    acted(
        "monitor.monitor_type",
        "metrics backends",
        refused=("wandb", "mlflow", "swanlab"),
        refused_reason="wandb/mlflow/swanlab monitors; use tensorboard, jsonl or console",
    ),
    not_applicable("monitor.monitor_args", f"backend arguments {_WANDB}"),
    not_applicable("monitor.enable_console", "not read here; use monitor_type console"),
    # data_processor, service, log
    not_built("data_processor.task_pipeline", "task pipelines (Data-Juicer)"),
    not_built("data_processor.experience_pipeline.operators", "experience pipeline operators"),
    not_applicable(
        "data_processor.experience_pipeline",
        "the experience pipeline is a pass-through here (no operators): nothing is saved or read",
    ),
    not_built("service.data_juicer", "the Data-Juicer service"),
    not_applicable(
        "log", "log files and levels are not configurable here; output goes to the console"
    ),
)
"""Every key's state; a section's entry covers the fields under it that have no entry."""

_BY_PATH: dict[str, KeyState] = {k.path: k for k in KEY_STATES}


# --- the schema, walked ------------------------------------------------------------------------


def _sections_below(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """(section reached through Optional / list / dict, the '[*]' suffixes on the way)."""
    ann, suffix = _strip(annotation), ""
    while True:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return ann, suffix
        args = getattr(ann, "__args__", ())
        origin = getattr(ann, "__origin__", None)
        if origin in (list, dict) and args:
            ann, suffix = _strip(args[-1]), suffix + "[*]"
            continue
        return None, suffix


def schema_paths(root: type[BaseModel] = TrinityConfig, prefix: str = "") -> list[str]:
    """Every field path of the schema, items of lists and mappings written `[*]`."""
    out: list[str] = []
    for name, info in root.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        out.append(path)
        section, suffix = _sections_below(info.annotation)
        if section is not None:
            out += schema_paths(section, path + suffix)
    return out


def leaf_paths() -> list[str]:
    """The schema's fields that hold values rather than sections: each needs a state."""
    sections = {p for p in schema_paths() for q in schema_paths() if q.startswith(p + ".")}
    sections |= {p for p in schema_paths() for q in schema_paths() if q.startswith(p + "[*].")}
    return [p for p in schema_paths() if p not in sections]


def state_of(path: str) -> KeyState | None:
    """The entry for a field path: its own, else the nearest section's above it."""
    while path:
        if path in _BY_PATH:
            return _BY_PATH[path]
        cut = max(path.rfind("."), path.rfind("[*]"))
        path = path[:cut] if cut > 0 else ""
    return None


# --- the values of a config, by entry ---------------------------------------------------------


def _values(
    node: Any, parts: list[str], where: str, is_set: bool
) -> Iterator[tuple[str, Any, bool]]:
    """(concrete path, value, explicitly set?) for each place a key pattern matches in a config."""
    if not parts:
        yield where, node, is_set
        return
    part, rest = parts[0], parts[1:]
    if part == "[*]":
        items = node.items() if isinstance(node, dict) else enumerate(node or [])
        for key, item in items:
            yield from _values(item, rest, f"{where}[{key}]", is_set)
        return
    if not isinstance(node, BaseModel):
        return
    value = getattr(node, part)
    if value is None and rest:
        return
    here = f"{where}.{part}" if where else part
    yield from _values(value, rest, here, part in node.model_fields_set)


def _split(pattern: str) -> list[str]:
    return [p for p in pattern.replace("[*]", ".[*]").split(".") if p]


def _default(pattern: str) -> Any:
    """The schema default of the field at `pattern`."""
    parts = _split(pattern)
    model: Any = TrinityConfig
    for part in parts[:-1]:
        if part == "[*]":
            continue
        model, _ = _sections_below(model.model_fields[part].annotation)
    value = model.model_fields[parts[-1]].get_default(call_default_factory=True)
    return value


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _is_inert(entry: KeyState, value: Any) -> bool:
    if entry.inert is _DEFAULT:
        return _plain(value) == _plain(_default(entry.path))
    return value in entry.inert


def _refused(entry: KeyState, value: Any) -> Any:
    """The first refused value in `value` (a value or a list of them), else None."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and v in entry.refused:
            return v
    return None


def _own_problems(cfg: TrinityConfig) -> list[Problem]:
    problems: list[Problem] = []
    for entry in KEY_STATES:
        for path, value, _ in _values(cfg, _split(entry.path), "", True):
            bad = _refused(entry, value) if entry.refused else None
            if bad is not None:
                problems.append(Problem(path, f"{bad!r} is not built yet ({entry.refused_reason})"))
            elif entry.state == "not_built" and not _is_inert(entry, value):
                problems.append(
                    Problem(
                        path,
                        f"not built yet: {entry.reason}; remove the key (or set its default) to run",
                    )
                )
    return problems


def _own_notes(cfg: TrinityConfig) -> list[str]:
    notes: list[str] = []
    for entry in KEY_STATES:
        for path, value, is_set in _values(cfg, _split(entry.path), "", True):
            later_item = entry.first_only and "[0]" not in path
            refused = entry.refused and _refused(entry, value) is not None  # said as a problem
            if is_set and not refused and (entry.state == "not_applicable" or later_item):
                notes.append(f"{path}: not applicable here ({entry.reason})")
    notes += [
        f"trainer.trainer_config.{key}: not applicable here (verl setting with no counterpart)"
        for key in unmapped_keys(cfg)
    ]
    return notes


def _with_stages(cfg: TrinityConfig, own: Any) -> list[Any]:
    """`own(cfg)` plus, for each stage, what is new in that stage's merged config."""
    found = list(own(cfg))
    if not cfg.stages:
        return found
    from trinity.config.loader import stage_configs

    seen = {str(x) for x in found}
    for i, stage_cfg in enumerate(stage_configs(cfg)):
        for item in own(stage_cfg):
            if str(item) in seen:
                continue
            seen.add(str(item))
            if isinstance(item, Problem):
                found.append(item.with_prefix(f"stages[{i}]"))
            else:
                found.append(f"stages[{i}].{item}")
    return found


def not_built_problems(cfg: TrinityConfig) -> list[Problem]:
    """One problem per key set to a value whose feature is not built yet (pure: no I/O)."""
    return _with_stages(cfg, _own_problems)


def not_applicable_notes(cfg: TrinityConfig) -> list[str]:
    """One line per deprecated spelling the file used and per key that is set but has no effect
    here, with the reason (pure: no I/O)."""
    return [*cfg.rename_notes, *_with_stages(cfg, _own_notes)]


def not_built_markdown() -> str:
    """The not-built part of the table as Markdown, one line per feature (for the docs)."""
    by_feature: dict[str, list[str]] = {}
    for k in KEY_STATES:
        if k.refused:
            values = "|".join(str(v) for v in k.refused)
            by_feature.setdefault(k.refused_reason, []).append(f"`{k.path}`: {values}")
        elif k.state == "not_built":
            by_feature.setdefault(k.reason, []).append(f"`{k.path}`")
    return "\n".join(f"- {feature}: {', '.join(keys)}" for feature, keys in by_feature.items())
