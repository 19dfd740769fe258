"""Sections Trinity-RFT configs carry for features outside the explore/train loop: the
`data_processor` pipelines, outside `service`s, `log` settings and the `model.tinker` backend.

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

    enable: bool = Field(False, description="Train through the Tinker service.")
    base_model: str | None = Field(None, description="Tinker base model; None = model_path.")
    rank: int = Field(32, ge=1, description="LoRA rank of the Tinker adapter.")
    seed: int | None = Field(None, description="Seed of Tinker operations; None = unset.")
    train_mlp: bool = Field(True, description="Train the MLP (feed-forward) layers.")
    train_attn: bool = Field(True, description="Train the attention layers.")
    train_unembed: bool = Field(True, description="Train the output (unembedding) layer.")


class OperatorConfig(ConfigSection):
    """One pipeline operator: a registry name and its keyword arguments."""

    name: str = Field("", description="Operator name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Operator keyword arguments.")


class ExperiencePipelineConfig(ConfigSection):
    """Operators applied to rollout experiences before the trainer sees them."""

    operators: Annotated[list[OperatorConfig], NotBuilt("experience pipeline operators")] = Field(
        default_factory=list, description="Operators, applied in order."
    )
    save_input: bool = Field(True, description="Also save the experiences before the operators.")
    input_save_path: str | None = Field(
        None, description="Where the input experiences are saved; None = in the run folder."
    )
    inputs: dict[str, StorageConfig] = Field(
        default_factory=dict, description="Extra named input buffers."
    )
    output: StorageConfig | None = Field(
        None, description="Output buffer; None = the trainer's experience buffer."
    )


class TaskPipelineConfig(ConfigSection):
    """Operators (Data-Juicer) turning raw datasets into a taskset before exploring."""

    operators: list[OperatorConfig] = Field(
        default_factory=list, description="Operators, applied in order."
    )
    num_process: int = Field(4, ge=1, description="Worker processes.")
    config_path: str | None = Field(
        None, description="A Data-Juicer config file; when set, operators are ignored."
    )
    inputs: list[str] = Field(default_factory=list, description="Raw input files.")
    output: StorageConfig | None = Field(
        None, description="Output taskset; None = buffer.explorer_input.taskset."
    )
    target_fields: list[str] = Field(
        default_factory=list, description="Fields carried from the inputs into the taskset."
    )
    priority_weights: dict[str, float] = Field(
        default_factory=dict,
        description="Weights of difficulty, diversity, usage_frequency, quality for ranking.",
    )
    top_k: int = Field(-1, ge=-1, description="Tasks kept after ranking; -1 = all.")


class DataProcessorConfig(ConfigSection):
    """Data pipelines: one for tasks (before exploring), one for experiences (before training)."""

    task_pipeline: Annotated[
        TaskPipelineConfig | None, NotBuilt("task pipelines (Data-Juicer)")
    ] = Field(None, description="Pipeline over raw tasks; None = none.")
    experience_pipeline: Annotated[
        ExperiencePipelineConfig | None,
        NotApplicable(
            "the experience pipeline is a pass-through here (no operators): nothing is saved or read"
        ),
    ] = Field(
        default_factory=ExperiencePipelineConfig,
        description="Pipeline over rollout experiences (no operators = pass-through).",
    )


class DataJuicerServiceConfig(ConfigSection):
    """Where the Data-Juicer server runs."""

    server_url: str | None = Field(None, description="URL of a running Data-Juicer server.")
    auto_start: bool = Field(False, description="Start a Data-Juicer server automatically.")
    port: int | None = Field(None, ge=1, description="Port of an auto-started server.")


class ServiceConfig(ConfigSection):
    """Outside services the run talks to."""

    data_juicer: Annotated[DataJuicerServiceConfig | None, NotBuilt("the Data-Juicer service")] = (
        Field(None, description="The Data-Juicer service; None = not used.")
    )


class LogConfig(ConfigSection):
    """Log settings."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Default log level."
    )
    group_by_node: bool = Field(False, description="Group log files by node IP in a cluster.")
