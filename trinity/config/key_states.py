"""The declared table of key states: every schema field is acted upon, not built yet, or not
applicable here. The mechanism that reads it (refusals, notes, the schema walk) is `support.py`.

A section's entry covers the fields under it that have no entry of their own; `[*]` stands for
every item of a list or mapping. To add a key to the schema, add its entry here:
`tests/test_config_support.py` fails on a field without a state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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
        unless: not_built only: a config for which the key is acted upon after all (the part
            of the feature that is built), so not refused.
    """

    path: str
    state: State
    reason: str
    inert: Any = _DEFAULT
    refused: tuple[Any, ...] = ()
    refused_reason: str = ""
    first_only: bool = False
    unless: Callable[[Any], bool] | None = None


def acted(path: str, reason: str, **kw: Any) -> KeyState:
    """A key the runtime reads; `refused=(values...)` with `refused_reason` for unbuilt values."""
    return KeyState(path, "acted", reason, **kw)


def not_built(
    path: str, feature: str, inert: Any = _DEFAULT, unless: Callable[[Any], bool] | None = None
) -> KeyState:
    """A key whose feature is missing; refused unless its value is `inert` (a tuple = any of)
    or `unless(config)` says this config uses the part that is built."""
    return KeyState(path, "not_built", feature, inert=inert, unless=unless)


def _reads_a_teacher(cfg: Any) -> bool:
    """The config's algorithm takes its teacher from explorer.auxiliary_models[0]."""
    from trinity.algorithm.algorithms import ALGORITHM, ALIASES

    name = ALIASES.get(cfg.algorithm.algorithm_type, cfg.algorithm.algorithm_type)
    return name in ALGORITHM.names() and ALGORITHM.get(name).teacher_from_auxiliary


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
_PAIR_ONLY = "DPO preference column, read from buffer.trainer_input.experience_buffer only"


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
            not_applicable(f"{p}.format.chosen_key", _PAIR_ONLY),
            not_applicable(f"{p}.format.rejected_key", _PAIR_ONLY),
            not_applicable(f"{p}.capacity", "queue size; a taskset is read from its source"),
            not_applicable(f"{p}.max_read_timeout", "queue read timeout; not a queue"),
            not_applicable(f"{p}.replay_buffer", "experience replay; tasks are not replayed"),
            not_applicable(
                f"{p}.total_epochs",
                "buffer.total_epochs counts passes (Trinity-RFT also sets this from it)",
            ),
            not_applicable(f"{p}.enable_progress_bar", "no progress bar while loading here"),
            not_applicable(f"{p}.schema_type", "the task schema is fixed here"),
            acted(f"{p}.skip_bad_rows", "load_taskset and the pre-flight row check"),
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
        acted(f"{e}.format.chosen_key", "DPO pairs: sft_data.DatasetSource (algorithm_type dpo)"),
        acted(f"{e}.format.rejected_key", "DPO pairs: sft_data.DatasetSource (algorithm_type dpo)"),
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
        acted(f"{e}.skip_bad_rows", "the train dataset's loader and the pre-flight row check"),
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
        acted(f"{p}.num_threads", "torch threads of each engine (unset: its share of the cores)"),
        acted(f"{p}.max_restarts", "a crashed engine is restarted and given its weights again"),
        not_built(f"{p}.enable_openai_api", "the OpenAI-compatible endpoint"),
        not_built(f"{p}.enable_history", "recording model calls for workflows"),
        acted(f"{p}.enable_thinking", "chat templates of rollout prompts (overrides model.*)"),
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
        refused=("serve",),
        refused_reason="mode serve (the OpenAI-compatible endpoint)",
    ),
    acted("project", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    acted("name", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    acted("checkpoint_root_dir", "the run folder <checkpoint_root_dir>/<project>/<name>"),
    not_applicable("group", f"run group {_WANDB}"),
    acted(
        "continue_from_checkpoint",
        "run_folder.py: false gives a folder in use a fresh <name>_<timestamp>; true resumes "
        "trainer, explorers and buffer from the folder",
    ),
    acted("seed", "torch seed of the trainer"),
    acted("stage_name", "set by stage_configs()"),
    not_applicable("schema_type", "the experience schema follows algorithm.algorithm_type"),
    acted("stages", "stage_configs(): each stage is validated and checked as a whole config"),
    # algorithm
    acted("algorithm", "resolve_algorithm() and the train step"),
    acted("algorithm.optimizer", "build_optimizer()"),
    acted("algorithm.rollout_correction", "the train step: rollout_correction() weights and mask"),
    acted("trainer.critic", "trinity/trainer/critic.py (algorithm_type ppo)"),
    acted("algorithm.kl_ctrl", "the train step: AdaptiveKLController sets the penalty's kl_coef"),
    acted("algorithm.filter_groups", "Explorer.explore_step drops all-equal groups and refills"),
    acted("algorithm.overlong_penalty", "the train step: shaping.overlong_penalty on the reward"),
    not_applicable(
        "algorithm.optimizer.optimizer_type", "always AdamW here ('adam' and 'adamw' both name it)"
    ),
    # model
    acted("model.model_path", "engines and trainer load it"),
    acted("model.critic_model_path", "the critic's start model (algorithm_type ppo)"),
    acted("model.max_model_len", "engine length limit"),
    acted(
        "model.max_prompt_tokens",
        "rollout prompts cut to it (enable_prompt_truncation) and SFT prompt truncation",
    ),
    acted("model.max_response_tokens", "rollout length limit"),
    acted("model.temperature", "rollout sampling"),
    acted("model.top_p", "rollout sampling"),
    acted("model.top_k", "rollout sampling"),
    acted("model.custom_chat_template", "tokenizer chat template"),
    not_built("model.lora_configs", "LoRA"),
    acted("model.enable_thinking", "chat templates of rollout and SFT prompts"),
    acted(
        "model.enable_prompt_truncation",
        "TaskModelHandle: a rollout prompt over max_prompt_tokens is cut and its experiences "
        "get a zero action mask (rollout/prompt_truncated)",
    ),
    not_built("model.logprobs", "top-k logprobs per token", inert=(0,)),
    not_built("model.external_model", "rollouts from an externally served model"),
    not_built("model.tinker", "the Tinker training backend"),
    # cluster
    acted("cluster.ray_address", "ray.init"),
    acted(
        "cluster.node_num",
        "the run waits for this many Ray nodes; trainer on the first, engine i on node i mod N",
    ),
    acted("cluster.gpu_per_node", "at most this many GPUs are reserved for trainer and engines"),
    # buffer
    acted("buffer.batch_size", "tasks per explore step"),
    acted("buffer.train_batch_size", "experiences per train step"),
    acted("buffer.total_epochs", "passes over the taskset"),
    acted("buffer.total_steps", "run length"),
    acted("buffer.explorer_input.default_workflow_type", "workflow of tasks that name none"),
    acted("buffer.explorer_input.default_eval_workflow_type", "workflow of eval tasks"),
    acted("buffer.explorer_input.default_reward_fn_type", "reward of tasks that name none"),
    *_storage_entries(),
    acted(
        "buffer.trainer_input.auxiliary_buffers",
        "sft_data.AuxiliaryReader: expert rows for sample_strategy mix",
    ),
    # explorer
    not_applicable("explorer.name", "Ray actor name; actors are unnamed here"),
    acted("explorer.runner_per_model", "concurrent workflow runs per engine"),
    acted("explorer.max_timeout", "workflow timeout"),
    acted("explorer.max_retry_times", "workflow retries"),
    acted("explorer.max_failure_fraction", "failed tasks dropped up to this share of a step"),
    acted("explorer.eval_interval", "evaluation schedule"),
    acted("explorer.eval_on_startup", "evaluation at step 0"),
    *_model_entries("explorer.rollout_model", rollout=True),
    not_built(
        "explorer.auxiliary_models",
        "auxiliary models (extra engines for workflows); algorithm_type on_policy_distill reads "
        "the first one's model_path as its teacher",
        unless=_reads_a_teacher,
    ),
    not_built("explorer.env_vars", "environment variables for workflow runners"),
    not_applicable(
        "explorer.max_repeat_times_per_runner",
        "all samples of a task run in one workflow call here; splitting them over runners "
        "changes scheduling, not results",
    ),
    acted("explorer.bench_on_latest_checkpoint", "mode bench: only the newest checkpoint"),
    # synchronizer
    acted(
        "synchronizer.sync_method",
        "how weights travel (unset = best available, see resolve()); nccl is gloo on CPU",
    ),
    acted(
        "synchronizer.sync_style",
        "when weights travel (trinity.sync.schedule)",
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
