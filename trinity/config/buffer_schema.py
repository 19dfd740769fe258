"""Schema of the `buffer` section: where tasks come from and where experiences go. Batch units,
the most-asked question in RL fine-tuning, are in each field's docs (`batch_size` counts tasks,
`train_batch_size` experiences).

    buffer: {batch_size: 16, explorer_input: {taskset: {path: data/gsm8k}}}
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from trinity.config.base import ConfigSection, Inside, NotApplicable, NotBuilt, Refused, TopK

EXPERIENCE_STORAGES = ("queue", "sql", "file")
"""Storage types of an experience buffer that explorers write and a trainer reads (an
`ExperienceStorage`): with one of these, mode train reads what `mode: explore` processes write;
`file` only with an algorithm that trains on rollouts (`run_folder.reads_experiences`: with SFT
or DPO a file is a dataset of rows)."""
EXPERIENCE_FILE_SUFFIXES = (".jsonl", ".parquet")
"""What an experience store that explorers write (`storage_type: file`, `buffer/file_storage.py`)
may be named: a JSONL file or a folder of Parquet parts (`buffer/record_format.py`)."""


MULTIMODAL_NOT_BUILT = (
    "the rollout engine, the Experience and its storages, and the trainer's logprob passes "
    "carry token ids only: a vision-language model's pixel values and M-RoPE positions would "
    "have to pass through all of them (docs/data.md, 'Multi-modal data')"
)
"""Why images and videos (`image_key`, `video_key`, Trinity-RFT's `simple_mm_workflow`) are
refused here."""


class FormatConfig(ConfigSection):
    """Which columns of a dataset row hold the prompt, the answer and the preference pair."""

    prompt_type: Literal["messages", "plaintext"] = "plaintext"
    """How the prompt is stored: 'plaintext' (one string in `prompt_key`) or 'messages' (a chat list
    of {role, content} in `messages_key`)."""
    prompt_key: str = "prompt"
    """Column holding the prompt text."""
    response_key: str = "response"
    """Column holding the reference answer or SFT response."""
    messages_key: str = "messages"
    """Column holding a chat message list (prompt_type 'messages')."""
    tools_key: str = "tools"
    """Column holding the OpenAI tool (function) definitions offered with the prompt: rendered by
    the chat template in SFT rows and sent with the task's chat calls; a row without it has none."""
    chosen_key: str = "chosen"
    """Column holding the preferred response (DPO)."""
    rejected_key: str = "rejected"
    """Column holding the dispreferred response (DPO)."""
    system_prompt: str | None = None
    """System message prepended to every prompt; None = no system message."""
    reply_prefix: str | None = None
    """Text the assistant reply is forced to start with (e.g. `<think>`), right after the chat
    template's generation prompt: its tokens are prompt tokens (not trained) and the reward fn
    scores what is sampled after it, as in Trinity-RFT; the single-turn workflows apply it
    (`takes_reply_prefix`). None = nothing."""
    image_key: Annotated[
        str | None, NotBuilt(f"multi-modal data (images): {MULTIMODAL_NOT_BUILT}")
    ] = None
    """Column holding images (multi-modal models); None = no images."""
    video_key: Annotated[
        str | None, NotBuilt(f"multi-modal data (videos): {MULTIMODAL_NOT_BUILT}")
    ] = None
    """Column holding videos (multi-modal models); None = no videos."""


class RolloutArgs(ConfigSection):
    """Per-taskset sampling settings; None inherits from `model` / `algorithm`."""

    temperature: float | None = Field(None, ge=0)
    """Sampling temperature; None = model.temperature."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus-sampling mass in (0, 1]; None = model.top_p."""
    top_k: TopK | None = None
    """Top-k cutoff (-1 = off); None = model.top_k."""
    max_tokens: int | None = Field(None, ge=1)
    """Response length limit in tokens; None = model.max_response_tokens."""
    n: int | None = Field(None, ge=1)
    """Samples per task; None = the set's repeat_times, else algorithm.repeat_times (an eval
    set: else 1)."""
    logprobs: int | None = Field(None, ge=0)
    """Top alternatives per response token: the engine returns the k most likely tokens of the
    raw policy and their logprobs, kept on single-turn experiences (`topk_ids`,
    `topk_logprobs`); None = model.logprobs."""


class TaskSelectorConfig(ConfigSection):
    """Order in which tasks are drawn from a taskset."""

    selector_type: Literal[
        "sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based"
    ] = "sequential"
    """'sequential' = file order; 'shuffle' = a new permutation each epoch; 'random' = sample with
    replacement; 'offline_easy2hard' = sorted by `feature_keys`, highest (easiest) first;
    'difficulty_based' = BOTS, tasks near a target pass rate under a posterior learned online
    (docs/data.md)."""
    seed: int | None = None
    """Seed for 'shuffle', 'random' and 'difficulty_based'; None = the global seed."""
    feature_keys: list[str] = Field(default_factory=list)
    """Columns of the task rows: 'offline_easy2hard' sorts by them; 'difficulty_based' reads 0,
    1 or 2 of them as offline reference pass rates (a dotted key reads nested fields)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """'difficulty_based': m (samples per task, 16), lamb (history discount, 0.2), rho
    (pseudo-count weight, 0.2), target_reward (1.0), tau (temperature; 0 = top-k, 1.0),
    do_sample (draw pass rates from the posteriors, false), adaptive_rho (false); ours:
    staleness_coef (the share of each batch drawn by how long each task went unseen, 0)."""


class ReplayBufferConfig(ConfigSection):
    """Experience replay: the trainer's reads take experiences by priority and reuse them
    (trinity/buffer/replay.py); the priorities, use counts and cooldowns are kept in the
    storage, so they survive a restart."""

    enable: bool = False
    """Reuse experiences by priority (storage_type queue or sql)."""
    priority_fn: str = "linear_decay"
    """Priority of a group of experiences from its model_version and use count:
    'linear_decay' (version - decay * uses, reused without limit) or
    'decay_limit_randomization' (the same + sigma * noise, reused while uses < use_count_limit)."""
    reuse_cooldown_time: float | None = Field(None, ge=0)
    """Seconds after a read before its experiences may be read again (0 = at once); None = never
    reused, as in Trinity-RFT: reads only go by priority (a note says so)."""
    priority_fn_args: dict[str, Any] = Field(default_factory=lambda: {"decay": 2.0})
    """Arguments of the priority function: decay (2.0); decay_limit_randomization also
    use_count_limit (3; <= 0 = no limit) and sigma (0.0)."""
    max_staleness: int | None = Field(None, ge=0)
    """Ours: a reused experience more than this many weight versions behind the newest one
    written is dropped instead (counted replay_stale); None = no bound."""


class StorageConfig(ConfigSection):
    """One dataset, queue or table: a taskset, an eval set or an experience buffer."""

    renamed_keys: ClassVar[dict[str, str]] = {"task_selector": "data_selector"}

    name: str = ""
    """Display name; used in metric keys of eval sets and of mixed tasksets; for 'sql' the table's
    name (a taskset's table; an experience buffer's rows in the storage's own tables)."""
    storage_type: Literal["file", "queue", "sql", "synthetic"] = "file"
    """'file' = a local dataset (jsonl/parquet/HF folder) or hub id in `path`; as the experience
    buffer of an algorithm that trains on rollouts, a JSONL file (or a `.parquet` folder of
    parts, one per write) of experiences that explorers append to and a trainer reads, resuming
    exactly, or a `datasets` save folder of experiences a trainer reads (docs/data.md, "File
    storage"); 'queue' =
    experience queue in memory with a SQLite log in the run folder; 'sql' = a SQL database at
    `path` (SQLite or PostgreSQL): experiences, or for a taskset its rows from the table `name`
    (Trinity-RFT's task table or plain columns); 'synthetic' = a generated taskset whose
    generator name is `path` (e.g. 'arithmetic')."""
    path: str | None = None
    """Dataset path or hub id (file), generator name (synthetic), or for 'sql' the database: a
    SQLite file, `sqlite:///file`, or `postgresql://user@host/db` (a Unix socket:
    `postgresql://user@/db?host=/socket/dir&port=5432`); None = `<run folder>/buffer/<name>.sqlite`
    (an experience buffer; a taskset from SQL names its database). An experience file (file
    storage): a `.jsonl` file, a `.parquet` folder of parts, or (mode train only) a `datasets`
    save folder; None = `<run folder>/buffer/<name>.jsonl`.
    A dataset path is checked to exist by the pre-flight pass (`validate` and `run`), a database
    URL's form by the config check (no connection is made)."""
    subset_name: str | None = None
    """Dataset subset (HF config name)."""
    split: str = "train"
    """Dataset split to read."""
    format: FormatConfig = Field(default_factory=FormatConfig)
    """Which columns hold prompt and answer."""
    rollout_args: RolloutArgs = Field(default_factory=RolloutArgs)
    """Sampling overrides for tasks of this set."""
    workflow_args: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to the workflow."""
    reward_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to the reward function, except `timeout` (seconds per
    call), `sandbox` ('none' | 'subprocess'), `cpu_seconds`, `memory_mb` and `sandbox_workers`,
    which bound each call instead (docs/configuration.md, "Reward functions that cannot freeze
    training")."""
    default_workflow_type: str | None = None
    """Workflow for tasks of this set; None = explorer_input.default_workflow_type."""
    default_reward_fn_type: str | None = None
    """Reward function for this set; None = explorer_input.default_reward_fn_type."""
    repeat_times: int | None = Field(None, ge=1)
    """Samples per task for this set; None = algorithm.repeat_times (an eval set: 1; several
    give avg@n, pass@k and maj@k, docs/evaluation.md)."""
    capacity: int = Field(10000, ge=1)
    """Maximum number of experiences held (queue / sql storage)."""
    max_read_timeout: float = Field(1800.0, gt=0)
    """Seconds a reader waits for enough experiences before failing."""
    generator_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the generator (storage_type 'synthetic'), e.g. {num_tasks: 1000,
    max_operand: 99}."""
    data_selector: TaskSelectorConfig = Field(default_factory=TaskSelectorConfig)
    """Order in which tasks are drawn (was task_selector)."""
    replay_buffer: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    """Experience replay (experience buffer, queue or sql storage)."""
    schema_type: str | None = None
    """Row schema of this storage (e.g. 'sft', 'dpo'); None = the algorithm's."""
    total_epochs: int | None = Field(None, ge=1)
    """Passes over this set; None = buffer.total_epochs."""
    enable_progress_bar: Annotated[bool, NotApplicable("no progress bar while loading here")] = (
        False
    )
    """Show a progress bar while loading."""
    skip_bad_rows: bool = False
    """Count and skip malformed rows (invalid JSON, missing or mistyped prompt or answer) instead of
    refusing the dataset; validate and run report how many."""


_PAIR_ONLY = "DPO preference column, read from buffer.trainer_input.experience_buffer only"
_NO_ROLLOUT = "a rollout setting; the trainer's experience buffer is not rolled out"
_TASKSET: dict[str, Any] = {  # a taskset is read from its source, whole, as tasks
    "storage_type": Refused(
        ("queue",),
        "tasksets from a queue (a queue carries experiences; tasks come from a file, a SQL "
        "table or a generator)",
    ),
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
_TASKSETS = _TASKSET
_EVAL_TASKSETS = _TASKSET | {
    "data_selector": NotApplicable("eval sets are run whole, in file order"),
}
_EXPERIENCE_BUFFER: dict[str, Any] = {
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
            "format.reply_prefix",
        )
    },
}


_AUXILIARY_BUFFER: dict[str, Any] = {
    "replay_buffer": NotApplicable(
        "an auxiliary buffer is a dataset read in order; replay reuses the rollouts of the "
        "experience buffer"
    ),
    **{k: v for k, v in _EXPERIENCE_BUFFER.items() if k not in ("replay_buffer", "schema_type")},
}


class ExplorerInput(ConfigSection):
    """Task sources of the explorer: training tasksets and evaluation sets."""

    taskset: Annotated[StorageConfig | None, Inside(_TASKSET)] = None
    """The training taskset (or use `tasksets` for several)."""
    tasksets: Annotated[list[StorageConfig], Inside(_TASKSETS)] = Field(default_factory=list)
    """Several training tasksets, mixed into each explore step by `taskset_ratios` (unset: in
    proportion to their sizes, as Trinity-RFT), each in its own `data_selector`'s order."""
    taskset_ratios: list[Annotated[float, Field(gt=0)]] = Field(default_factory=list)
    """Ours (not a Trinity-RFT key): the share of each of `tasksets` in every explore step, one
    number per set, e.g. [3, 1] = three tasks of the first per task of the second; the sets are
    interleaved evenly and the mix ends when the first set has run out of its total_epochs
    passes (docs/data.md); empty = in proportion to the sets' sizes (Trinity-RFT's mix)."""
    eval_tasksets: Annotated[list[StorageConfig], Inside(_EVAL_TASKSETS)] = Field(
        default_factory=list
    )
    """Evaluation sets, run every explorer.eval_interval explore steps."""
    default_workflow_type: str = "math_workflow"
    """Workflow (registry name) for tasks that name none."""
    default_eval_workflow_type: str | None = None
    """Workflow for eval tasks; None = default_workflow_type."""
    default_reward_fn_type: str | None = None
    """Reward function (registry name) for tasks that name none."""

    def storages(self, training: bool = True) -> list[tuple[str, StorageConfig, bool]]:
        """(key path, storage, is_eval) of every training taskset (unless `training` is False),
        then of every eval taskset."""
        train = [("taskset", self.taskset)] if self.taskset is not None and training else []
        train += [(f"tasksets[{i}]", s) for i, s in enumerate(self.tasksets) if training]
        evals = [(f"eval_tasksets[{i}]", s) for i, s in enumerate(self.eval_tasksets)]
        at = "buffer.explorer_input."
        return [(at + p, s, False) for p, s in train] + [(at + p, s, True) for p, s in evals]


class TrainerInput(ConfigSection):
    """Experience sources of the trainer."""

    experience_buffer: Annotated[StorageConfig | None, Inside(_EXPERIENCE_BUFFER)] = None
    """Where the trainer reads experiences; required for mode 'train'. In mode 'both' an in-memory
    queue is used when unset."""
    auxiliary_buffers: Annotated[dict[str, StorageConfig], Inside(_AUXILIARY_BUFFER)] = Field(
        default_factory=dict
    )
    """Extra named datasets for the trainer, e.g. an SFT set for mixed training."""


class BufferConfig(ConfigSection):
    """Batch sizes, run length and the data sources of explorer and trainer."""

    batch_size: int = Field(1, ge=1)
    """Tasks per explore step (unit: tasks)."""
    train_batch_size: int = Field(0, ge=0)
    """Experiences per train step (unit: experiences); 0 = batch_size × algorithm.repeat_times."""
    total_epochs: int = Field(1, ge=1)
    """Passes over the training taskset."""
    total_steps: int | None = Field(None, ge=1)
    """Explore/train steps to run; None = derived from the taskset size and total_epochs at run
    time."""
    explorer_input: ExplorerInput = Field(default_factory=ExplorerInput)
    """Tasksets read by the explorer."""
    trainer_input: TrainerInput = Field(default_factory=TrainerInput)
    """Experience buffers read by the trainer."""
