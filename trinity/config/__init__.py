"""Typed, fail-closed configuration in Trinity-RFT's key layout.

    from trinity.config import load_config, resolve, format_batch_table
    cfg = load_config("run.yaml", ["algorithm.repeat_times=8"])   # raises ConfigError
    print(format_batch_table(resolve(cfg)))

`load_config` reads, merges and interpolates as OmegaConf does, rejects unknown keys with a
suggestion and reports every problem at once with its key path (`loader.py`); it does no I/O but
reading the file. Derived numbers (batch sizes in their units, run directory) come from
`resolve()`; multi-stage runs expand with `stage_configs()`.
"""

from trinity.config.buffer_schema import (
    BufferConfig,
    ExplorerInput,
    FormatConfig,
    RolloutArgs,
    StorageConfig,
    TaskSelectorConfig,
    TrainerInput,
)
from trinity.config.checks import check_config
from trinity.config.loader import dump_config, load_config, stage_configs, validate_config
from trinity.config.problems import ConfigError, Problem
from trinity.config.resolved import ResolvedConfig, format_batch_table, resolve
from trinity.config.schema import (
    AlgorithmConfig,
    ClusterConfig,
    ExplorerConfig,
    InferenceModelConfig,
    ModelConfig,
    MonitorConfig,
    OptimizerConfig,
    StageConfig,
    SynchronizerConfig,
    TrainerConfig,
    TrinityConfig,
)

__all__ = [
    "AlgorithmConfig",
    "BufferConfig",
    "ClusterConfig",
    "ConfigError",
    "ExplorerConfig",
    "ExplorerInput",
    "FormatConfig",
    "InferenceModelConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "Problem",
    "ResolvedConfig",
    "RolloutArgs",
    "StageConfig",
    "StorageConfig",
    "SynchronizerConfig",
    "TaskSelectorConfig",
    "TrainerConfig",
    "TrainerInput",
    "TrinityConfig",
    "check_config",
    "dump_config",
    "format_batch_table",
    "load_config",
    "resolve",
    "stage_configs",
    "validate_config",
]
