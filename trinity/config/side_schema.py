"""Sections Trinity-RFT configs carry for features outside the explore/train loop: the
`data_processor` pipelines, outside `service`s, `log` settings, the `model.tinker` backend and
the `model.external_model` endpoint.

They are accepted with Trinity-RFT's key layout and defaults so that its users' configs load
unchanged; what this build does with each key is declared in `support.py` (most are refused as
not built yet when set to anything but their defaults).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from trinity.config.base import ConfigSection, NotApplicable, NotBuilt
from trinity.config.buffer_schema import StorageConfig


class TinkerConfig(ConfigSection):
    """Training through the Tinker service (LoRA on a remote base model) instead of locally."""

    enable: bool = False
    """Train through the Tinker service."""
    base_model: str | None = None
    """Tinker base model; None = model_path."""
    rank: int = Field(32, ge=1)
    """LoRA rank of the Tinker adapter."""
    seed: int | None = None
    """Seed of Tinker operations; None = unset."""
    train_mlp: bool = True
    """Train the MLP (feed-forward) layers."""
    train_attn: bool = True
    """Train the attention layers."""
    train_unembed: bool = True
    """Train the output (unembedding) layer."""


class ExternalModelConfig(ConfigSection):
    """An OpenAI-compatible endpoint evaluated instead of local engines (mode bench): its chat
    API samples each chat call's messages, or its `/v1/completions` the prompts as token ids of
    `model.model_path`'s tokenizer (docs/evaluation.md, "Benchmarking an external model")."""

    enable: bool = False
    """Evaluate the endpoint instead of model.model_path's weights (mode bench only: it has no
    weights to train or sync)."""
    model_name: str | None = None
    """The model name the endpoint serves (its `/v1/models` lists it; required when enabled)."""
    api: Literal["chat", "completions"] = "chat"
    """Ours. 'chat': /v1/chat/completions with each chat call's messages (any OpenAI-compatible
    server, hosted APIs included; as Trinity-RFT sends); 'completions': /v1/completions with the
    prompt as our tokenizer's token ids (servers that take token-id prompts: trinity serve,
    vLLM, SGLang; exactly the prompt a local engine samples from, and `model.generate` calls)."""
    base_url_env: str = "OPENAI_BASE_URL"
    """Environment variable holding the endpoint's base URL, e.g. http://127.0.0.1:8010/v1."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; unset there = the key 'EMPTY' (a server
    without keys)."""
    base_url: str | None = None
    """The base URL itself (ours; overrides base_url_env)."""
    api_key: str | None = None
    """The API key itself (ours; overrides api_key_env): write it as ${oc.env:MY_KEY}; it is
    redacted wherever the config is shown."""
    request_timeout: float = Field(600.0, gt=0)
    """Seconds one request may take before it fails (its task counts as failed)."""


class OperatorConfig(ConfigSection):
    """One pipeline operator: a registry name and its keyword arguments."""

    name: str = ""
    """Operator name."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Operator keyword arguments."""


class ExperiencePipelineConfig(ConfigSection):
    """Operators applied to each explore step's experiences before the trainer sees them
    (trinity/data/pipeline.py, docs/data.md)."""

    operators: list[OperatorConfig] = Field(default_factory=list)
    """Operators, applied in order: reward_filter, reward_std_filter, invalid_reward_filter,
    reward_shaping_mapper, pass_rate_calculator, data_juicer (a Data-Juicer recipe:
    config_path) (Trinity-RFT's names and args), or a dotted
    path to a class of your own. A filter never shortens a step: tasks it drops are replaced by
    the next tasks (`max_num_gen_batches`), samples it drops stay untrained."""
    max_num_gen_batches: int = Field(4, ge=1)
    """Tasks tried per step at most this many times batch_size while filters drop tasks; then
    the step is completed with dropped tasks, untrained (`experience_pipeline/unfilled_tasks`)."""
    save_input: Annotated[
        bool,
        NotApplicable(
            "the experiences are not saved apart before the operators (their rollout metrics "
            "are reported, and the buffer keeps what the trainer reads)"
        ),
    ] = True
    """Also save the experiences before the operators."""
    input_save_path: Annotated[
        str | None, NotBuilt("saving the experience pipeline's input to a file or table")
    ] = None
    """Where the input experiences are saved; None = in the run folder."""
    inputs: Annotated[
        dict[str, StorageConfig], NotBuilt("extra input buffers of the experience pipeline")
    ] = Field(default_factory=dict)
    """Extra named input buffers."""
    output: Annotated[
        StorageConfig | None,
        NotBuilt("an experience pipeline output other than the trainer's experience buffer"),
    ] = None
    """Output buffer; None = the trainer's experience buffer."""


class TaskPipelineConfig(ConfigSection):
    """Operators (Data-Juicer's names and args) turning raw datasets into a taskset before
    exploring."""

    operators: list[OperatorConfig] = Field(default_factory=list)
    """Operators, applied in order: text_length_filter, words_num_filter,
    document_deduplicator, llm_difficulty_score_filter, llm_quality_score_filter (Data-Juicer's
    names and args), pass_rate_filter (the rollout model's pass rate)."""
    num_process: Annotated[
        int,
        NotApplicable(
            "the native operators run in the explorer's process; LLM scoring calls go to the "
            "auxiliary model's engines together"
        ),
    ] = Field(4, ge=1)
    """Worker processes."""
    config_path: str | None = None
    """A Data-Juicer recipe (its `process` list); when set, operators are ignored. Ops not
    built here run through Data-Juicer: its server (service.data_juicer) or its dj-process
    named by TRINITY_DJ_PROCESS."""
    inputs: list[str] = Field(default_factory=list)
    """Raw input files."""
    output: StorageConfig | None = None
    """Where the output taskset is written (its `path`, jsonl); None = the run folder's
    task_pipeline/tasks.jsonl."""
    target_fields: list[str] = Field(default_factory=list)
    """Fields carried from the inputs into the taskset."""
    priority_weights: dict[str, float] = Field(default_factory=dict)
    """Weights of difficulty, diversity, usage_frequency, quality for ranking."""
    top_k: int = Field(-1, ge=-1)
    """Tasks kept after ranking; -1 = all."""


class DataProcessorConfig(ConfigSection):
    """Data pipelines: one for tasks (before exploring), one for experiences (before training)."""

    task_pipeline: TaskPipelineConfig | None = None
    """Pipeline over raw tasks, run when a stage starts; its output is the explored taskset
    (trinity/data/task_pipeline.py, docs/data.md); None = none."""
    experience_pipeline: ExperiencePipelineConfig | None = Field(
        default_factory=ExperiencePipelineConfig
    )
    """Pipeline over rollout experiences (no operators = pass-through)."""


class DataJuicerServiceConfig(ConfigSection):
    """Where the Data-Juicer server runs: a worker of ours (trinity/data/dj_worker.py, in
    Data-Juicer's own environment) that imports Data-Juicer once and runs every recipe with an
    op not built here (docs/data.md); neither auto_start nor server_url: each such recipe runs
    dj-process (TRINITY_DJ_PROCESS) once."""

    server_url: str | None = None
    """URL of a running Data-Juicer server: a worker of ours (Trinity-RFT's own server speaks
    another protocol); validate checks it answers."""
    auto_start: bool = False
    """Start a Data-Juicer server automatically: the explorer starts it (before its first
    recipe), restarts it once if it dies, and stops it at its end. Needs Data-Juicer's
    environment: TRINITY_DJ_PROCESS (make setup-data-juicer) or python."""
    port: int | None = Field(None, ge=0)
    """Port of an auto-started server on 127.0.0.1; None or 0 = a free one."""
    python: str | None = None
    """The python of Data-Juicer's environment that runs an auto-started server (ours); None =
    the python beside TRINITY_DJ_PROCESS's dj-process."""


class ServiceConfig(ConfigSection):
    """Outside services the run talks to."""

    data_juicer: DataJuicerServiceConfig | None = None
    """The Data-Juicer service; None = not used (recipes run dj-process each)."""


class LogConfig(ConfigSection):
    """Log settings."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Default log level."""
    group_by_node: bool = False
    """Group log files by node IP in a cluster."""
