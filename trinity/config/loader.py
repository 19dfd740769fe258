"""Loading a config file, expanding stages, and printing a config back as YAML.

    cfg = load_config("examples/quickstart/gsm8k.yaml", ["algorithm.optimizer.lr=2e-6"])
    for stage_cfg in stage_configs(cfg): ...

Steps of `load_config`: 1. read YAML (OmegaConf's loader), 2. merge the dotlist overrides,
3. resolve `${...}` interpolations with OmegaConf, 4. validate everything including stages and
lift `trainer.trainer_config` (verl) values into our keys, 5. raise one `ConfigError` listing
every problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from trinity.config.overrides import apply_overrides
from trinity.config.problems import ConfigError, Problem
from trinity.config.schema import TrinityConfig
from trinity.config.validation import validate_all, validate_stages
from trinity.config.yaml_io import interpolate, read_yaml


def validate_config(data: Mapping[str, Any], source: str | None = None) -> TrinityConfig:
    """Validate a raw config dict (as read from YAML, already interpolated), stages included.

    Args:
        data: the config as plain data; not modified.
        source: the file it came from, named in the error report.

    Raises:
        ConfigError: listing every problem found.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the top level must be a mapping of sections, got {type(data).__name__}", source
        )
    cfg, problems, partial, removed = validate_all(data)
    if problems or cfg is None:
        raise ConfigError(problems, source, partial, removed)
    return cfg


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrinityConfig:
    """Read, override, interpolate and validate a config file.

    Steps:
        1. read the YAML file (missing file, bad YAML, duplicate keys are errors);
        2. merge `overrides` (`a.b.c=value`, list items by index), checked against the schema;
        3. resolve `${oc.env:VAR,default}`, `${other.key}` and other OmegaConf interpolations;
        4. read deprecated spellings as current names (notes kept on the config), then
           validate all fields, cross-field rules and every stage;
        5. raise one `ConfigError` with every problem, or return the config.

    The returned config is the effective one: the user's values plus defaults, with the verl
    keys of `trainer.trainer_config` lifted into our unset keys (once, here: every consumer reads
    the same values); see `resolve()` for the derived numbers.

    Raises:
        ConfigError: listing every problem found, with key paths.
    """
    source = str(path)
    # 1. read
    raw = read_yaml(path)
    # 2. overrides
    raw, problems = apply_overrides(raw, overrides, TrinityConfig)
    # 3. interpolation
    raw, interp_problems = interpolate(raw)
    problems += interp_problems
    unresolved = {p.path for p in interp_problems}
    # 4. validation; a value whose interpolation failed is not also reported as the wrong type
    cfg, found, partial, removed = validate_all(raw)
    problems += [p for p in found if p.path not in unresolved]
    # 5. report
    if problems or cfg is None:
        raise ConfigError(problems, source, partial, removed)
    return cfg


def stage_configs(cfg: TrinityConfig) -> list[TrinityConfig]:
    """One full config per stage, in order; `[cfg]` for a config without stages.

    Each stage config is the base config (as the user wrote it) deep-merged with the stage's
    overrides, validated, with `stages` empty and `stage_name` set. `name` is unchanged unless
    the stage overrides it.

    Raises:
        ConfigError: a merged stage is invalid (never for a config from `load_config`).
    """
    if not cfg.stages:
        return [cfg]
    configs, problems = _merged_stages(cfg)
    if problems:
        raise ConfigError(problems)
    return [c for c in configs if c is not None]


def valid_stages(cfg: TrinityConfig) -> list[tuple[int, TrinityConfig]]:
    """(index, config) of each stage whose merged config is valid: what pre-flight checks of a
    config that failed `load_config` (the invalid stages' problems are reported there)."""
    return [(i, c) for i, c in enumerate(_merged_stages(cfg)[0]) if c is not None]


def _merged_stages(cfg: TrinityConfig) -> tuple[list[TrinityConfig | None], list[Problem]]:
    base = {k: v for k, v in cfg.written.items() if k not in ("stages", "stage_name")}
    return validate_stages(base, [stage.model_dump(exclude_unset=True) for stage in cfg.stages])


def dump_config(cfg: TrinityConfig) -> str:
    """The config with every default filled in, as YAML (loadable again by `load_config`).

    The config is the effective one (`trainer.trainer_config` values already at our keys), so
    the dump loads again without the two disagreeing. Stages are printed as written (only
    their overrides); `stage_name` only when set.
    """
    data: dict[str, Any] = {}
    for name in TrinityConfig.model_fields:
        if name == "stage_name" and not cfg.stage_name:
            continue
        if name == "stages":
            data[name] = [s.model_dump(mode="json", exclude_unset=True) for s in cfg.stages]
        else:
            value = getattr(cfg, name)
            data[name] = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
