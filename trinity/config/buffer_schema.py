"""Schema of the `buffer` section: where tasks come from and where experiences go.

Batch units, because they are the most-asked question in RL fine-tuning:
- `buffer.batch_size` counts *tasks* per explore step;
- each task is rolled out `algorithm.repeat_times` times, giving that many *experiences*;
- `buffer.train_batch_size` counts *experiences* per train step (0 = tasks × samples).

Example: `buffer: {batch_size: 16, explorer_input: {taskset: {path: data/gsm8k}}}`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from trinity.config.base import ConfigSection, Inside, NotApplicable, NotBuilt, Refused, TopK


class FormatConfig(ConfigSection):
    """Which columns of a dataset row hold the prompt, the answer and the preference pair."""

    prompt_type: Literal["messages", "plaintext"] = Field(
        "plaintext",
        description="How the prompt is stored: 'plaintext' (one string in `prompt_key`) or "
        "'messages' (a chat list of {role, content} in `messages_key`).",
    )
    prompt_key: str = Field("prompt", description="Column holding the prompt text.")
    response_key: str = Field(
        "response", description="Column holding the reference answer or SFT response."
    )
    messages_key: str = Field(
        "messages", description="Column holding a chat message list (prompt_type 'messages')."
    )
    chosen_key: str = Field("chosen", description="Column holding the preferred response (DPO).")
    rejected_key: str = Field(
        "rejected", description="Column holding the dispreferred response (DPO)."
    )
    system_prompt: str | None = Field(
        None, description="System message prepended to every prompt; None = no system message."
    )
    reply_prefix: Annotated[str | None, NotBuilt("forcing the reply to start with a prefix")] = (
        Field(None, description="Text the assistant reply is forced to start with; None = nothing.")
    )
    image_key: Annotated[str | None, NotBuilt("multi-modal data (images)")] = Field(
        None, description="Column holding images (multi-modal models); None = no images."
    )
    video_key: Annotated[str | None, NotBuilt("multi-modal data (videos)")] = Field(
        None, description="Column holding videos (multi-modal models); None = no videos."
    )


class RolloutArgs(ConfigSection):
    """Per-taskset sampling settings; None inherits from `model` / `algorithm`."""

    temperature: float | None = Field(
        None, ge=0, description="Sampling temperature; None = model.temperature."
    )
    top_p: float | None = Field(
        None, gt=0, le=1, description="Nucleus-sampling mass in (0, 1]; None = model.top_p."
    )
    top_k: TopK | None = Field(None, description="Top-k cutoff (-1 = off); None = model.top_k.")
    max_tokens: int | None = Field(
        None, ge=1, description="Response length limit in tokens; None = model.max_response_tokens."
    )
    n: int | None = Field(
        None, ge=1, description="Samples per task; None = algorithm.repeat_times."
    )
    logprobs: Annotated[int | None, NotBuilt("top-k logprobs per token", inert=(None, 0))] = Field(
        None,
        ge=0,
        description="Top alternatives whose logprobs are returned per token; "
        "None = model.logprobs.",
    )


class TaskSelectorConfig(ConfigSection):
    """Order in which tasks are drawn from a taskset."""

    selector_type: Literal["sequential", "shuffle", "random"] = Field(
        "sequential",
        description="'sequential' = file order; 'shuffle' = a new permutation each epoch; "
        "'random' = sample with replacement.",
    )
    seed: int | None = Field(
        None, description="Seed for 'shuffle' and 'random'; None = the global seed."
    )


class ReplayBufferConfig(ConfigSection):
    """Experience replay from a queue: experiences are reused by priority."""

    enable: bool = Field(False, description="Reuse experiences by priority.")
    priority_fn: str = Field("linear_decay", description="Priority function (registry name).")
    reuse_cooldown_time: float | None = Field(
        None, ge=0, description="Seconds before an experience may be reused; None = no wait."
    )
    priority_fn_args: dict[str, Any] = Field(
        default_factory=lambda: {"decay": 2.0}, description="Priority function arguments."
    )


class StorageConfig(ConfigSection):
    """One dataset, queue or table: a taskset, an eval set or an experience buffer."""

    renamed_keys: ClassVar[dict[str, str]] = {"task_selector": "data_selector"}

    name: str = Field("", description="Display name; used in metric keys of eval sets.")
    storage_type: Literal["file", "queue", "sql", "synthetic"] = Field(
        "file",
        description="'file' = a local dataset (jsonl/parquet/HF folder) or hub id in `path`; "
        "'queue' = in-memory experience queue; 'sql' = SQL table at `path`; 'synthetic' = a "
        "generated taskset whose generator name is `path` (e.g. 'arithmetic').",
    )
    path: str | None = Field(
        None,
        description="Dataset path or hub id (file), database URL (sql) or generator name "
        "(synthetic). Checked to exist by the pre-flight pass (`validate` and `run`), not by the schema.",
    )
    subset_name: str | None = Field(None, description="Dataset subset (HF config name).")
    split: str = Field("train", description="Dataset split to read.")
    format: FormatConfig = Field(
        default_factory=FormatConfig, description="Which columns hold prompt and answer."
    )
    rollout_args: RolloutArgs = Field(
        default_factory=RolloutArgs, description="Sampling overrides for tasks of this set."
    )
    workflow_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed to the workflow."
    )
    reward_fn_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed to the reward function."
    )
    default_workflow_type: str | None = Field(
        None,
        description="Workflow for tasks of this set; None = explorer_input.default_workflow_type.",
    )
    default_reward_fn_type: str | None = Field(
        None,
        description="Reward function for this set; None = explorer_input.default_reward_fn_type.",
    )
    repeat_times: int | None = Field(
        None, ge=1, description="Samples per task for this set; None = algorithm.repeat_times."
    )
    capacity: int = Field(
        10000, ge=1, description="Maximum number of experiences held (queue / sql storage)."
    )
    max_read_timeout: float = Field(
        1800.0, gt=0, description="Seconds a reader waits for enough experiences before failing."
    )
    generator_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the generator (storage_type 'synthetic'), e.g. "
        "{num_tasks: 1000, max_operand: 99}.",
    )
    data_selector: TaskSelectorConfig = Field(
        default_factory=TaskSelectorConfig,
        description="Order in which tasks are drawn (was task_selector).",
    )
    replay_buffer: ReplayBufferConfig = Field(
        default_factory=ReplayBufferConfig, description="Experience replay (queue storage)."
    )
    schema_type: str | None = Field(
        None, description="Row schema of this storage (e.g. 'sft', 'dpo'); None = the algorithm's."
    )
    total_epochs: int | None = Field(
        None, ge=1, description="Passes over this set; None = buffer.total_epochs."
    )
    enable_progress_bar: Annotated[bool, NotApplicable("no progress bar while loading here")] = (
        Field(False, description="Show a progress bar while loading.")
    )
    skip_bad_rows: bool = Field(
        False,
        description="Count and skip malformed rows (invalid JSON, missing or mistyped prompt or "
        "answer) instead of refusing the dataset; validate and run report how many.",
    )


_PAIR_ONLY = "DPO preference column, read from buffer.trainer_input.experience_buffer only"
_NO_ROLLOUT = "a rollout setting; the trainer's experience buffer is not rolled out"
_TASKSET: dict[str, Any] = {  # a taskset is read from its source, whole, as tasks
    "storage_type": Refused(("queue", "sql"), "tasksets from a queue or SQL table"),
    "format.chosen_key": NotApplicable(_PAIR_ONLY),
    "format.rejected_key": NotApplicable(_PAIR_ONLY),
    "capacity": NotApplicable("queue size; a taskset is read from its source"),
    "max_read_timeout": NotApplicable("queue read timeout; not a queue"),
    "replay_buffer": NotApplicable("experience replay; tasks are not replayed"),
    "total_epochs": NotApplicable(
        "buffer.total_epochs counts passes (Trinity-RFT also sets this from it)"
    ),
    "schema_type": NotApplicable("the task schema is fixed here"),
}
_TASKSETS = _TASKSET | {
    "data_selector": NotApplicable(
        "only the first taskset's selector orders the mixed tasks; later ones are unused",
        after_first=True,
    )
}
_EVAL_TASKSETS = _TASKSET | {
    "repeat_times": NotBuilt(
        "several samples per eval task via repeat_times (rollout_args.n does it)", inert=(None, 1)
    ),
    "data_selector": NotApplicable("eval sets are run whole, in file order"),
}
_EXPERIENCE_BUFFER: dict[str, Any] = {
    "storage_type": Refused(("sql",), "SQL experience storage"),
    "replay_buffer": NotBuilt("experience replay (priority reuse of experiences)"),
    "schema_type": NotApplicable("the experience schema follows algorithm_type"),
    **{
        key: NotApplicable(_NO_ROLLOUT)
        for key in (
            "rollout_args",
            "workflow_args",
            "reward_fn_args",
            "default_workflow_type",
            "default_reward_fn_type",
            "repeat_times",
        )
    },
}


class ExplorerInput(ConfigSection):
    """Task sources of the explorer: training tasksets and evaluation sets."""

    taskset: Annotated[StorageConfig | None, Inside(_TASKSET)] = Field(
        None, description="The training taskset (or use `tasksets` for several)."
    )
    tasksets: Annotated[list[StorageConfig], Inside(_TASKSETS)] = Field(
        default_factory=list, description="Several training tasksets, mixed in order."
    )
    eval_tasksets: Annotated[list[StorageConfig], Inside(_EVAL_TASKSETS)] = Field(
        default_factory=list,
        description="Evaluation sets, run every explorer.eval_interval explore steps.",
    )
    default_workflow_type: str = Field(
        "math_workflow", description="Workflow (registry name) for tasks that name none."
    )
    default_eval_workflow_type: str | None = Field(
        None, description="Workflow for eval tasks; None = default_workflow_type."
    )
    default_reward_fn_type: str | None = Field(
        None, description="Reward function (registry name) for tasks that name none."
    )


class TrainerInput(ConfigSection):
    """Experience sources of the trainer."""

    experience_buffer: Annotated[StorageConfig | None, Inside(_EXPERIENCE_BUFFER)] = Field(
        None,
        description="Where the trainer reads experiences; required for mode 'train'. In mode "
        "'both' an in-memory queue is used when unset.",
    )
    auxiliary_buffers: dict[str, StorageConfig] = Field(
        default_factory=dict,
        description="Extra named datasets for the trainer, e.g. an SFT set for mixed training.",
    )


class BufferConfig(ConfigSection):
    """Batch sizes, run length and the data sources of explorer and trainer."""

    batch_size: int = Field(1, ge=1, description="Tasks per explore step (unit: tasks).")
    train_batch_size: int = Field(
        0,
        ge=0,
        description="Experiences per train step (unit: experiences); 0 = batch_size × "
        "algorithm.repeat_times.",
    )
    total_epochs: int = Field(1, ge=1, description="Passes over the training taskset.")
    total_steps: int | None = Field(
        None,
        ge=1,
        description="Explore/train steps to run; None = derived from the taskset size and "
        "total_epochs at run time.",
    )
    explorer_input: ExplorerInput = Field(
        default_factory=ExplorerInput, description="Tasksets read by the explorer."
    )
    trainer_input: TrainerInput = Field(
        default_factory=TrainerInput, description="Experience buffers read by the trainer."
    )
