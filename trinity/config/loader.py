"""Loading a config: a file (or raw data) into the effective `TrinityConfig`, stages included.

    cfg = load_config("examples/quickstart/quickstart.yaml", ["algorithm.optimizer.lr=2e-6"])
    for stage_cfg in stage_configs(cfg): ...

Steps, every one pure but the first, every problem of every step gathered in one `ConfigError`:
1. read the YAML with OmegaConf's loader (a key written twice is an error with its line);
2. merge the dotted overrides (`--set`), each key checked against the schema first;
3. resolve `${...}` interpolations with OmegaConf;
4. read Trinity-RFT's deprecated spellings as current names (`compat.apply_renames`), and its
   `mode: colocate` as mode both with `cluster.colocate` (`compat.read_colocate_mode`);
5. validate every field with pydantic; where that fails, the config without the failing values
   (defaults in their place) goes on as `ConfigError.partial`, so the later steps and the
   pre-flight pass still check everything else;
6. lift the verl `trainer_config` keys into ours and leave out arguments nothing reads
   (`compat.py`): the effective config, which every consumer reads;
7. the cross-field checks (`checks.py`) on the keys that passed 5;
8. each stage: the base as written deep-merged with the stage's overrides, through 5-7; its
   problems are located under `stages[i].`, except those the base has already.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from trinity.config.checks import Loc, check_config
from trinity.config.compat import (
    apply_renames,
    drop_unread_args,
    lift_verl_keys,
    read_colocate_mode,
)
from trinity.config.problems import ConfigError, Problem, problems_from_validation_error
from trinity.config.schema import StageConfig, TrinityConfig
from trinity.config.secrets import redacted
from trinity.config.yaml_io import apply_overrides, deep_merge, interpolate, read_yaml

T = TypeVar("T")
_NOT_MERGED = ("stages", "stage_name")


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrinityConfig:
    """Read, override, interpolate and validate a config file (steps 1-8 of the module docstring).

    Raises:
        ConfigError: listing every problem found, with key paths.
    """
    raw = read_yaml(path)
    raw, problems = apply_overrides(raw, overrides, TrinityConfig)
    raw, unresolved = interpolate(raw)
    # a value whose interpolation failed is not also reported as the wrong type
    return _validate(raw, str(path), problems + unresolved, {p.path for p in unresolved})


def validate_config(data: Mapping[str, Any], source: str | None = None) -> TrinityConfig:
    """Validate raw config data (as read from YAML, already interpolated; not modified), stages
    included: steps 4-8 of the module docstring. `source` names the file in the report.

    Raises:
        ConfigError: listing every problem found.
    """
    if not isinstance(data, Mapping):
        what = type(data).__name__
        raise ConfigError(f"the top level must be a mapping of sections, got {what}", source)
    return _validate(data, source)


def _validate(
    data: Mapping[str, Any],
    source: str | None,
    problems: Sequence[Problem] = (),
    unreported: Collection[str] = (),
) -> TrinityConfig:
    data, found, notes = apply_renames(dict(data), TrinityConfig)
    data, lifted, said = read_colocate_mode(data)
    found, notes = found + lifted, notes + said
    cfg, more, partial, removed = _effective(data)
    found += more
    if partial is not None:  # `cfg` is it, or None
        partial._rename_notes, partial._written = tuple(notes), data
    if isinstance(data.get("stages"), list):
        found += _stages(data, data["stages"], known=found)[1]
    problems = [*problems, *(p for p in found if p.path not in unreported)]
    if problems or cfg is None:
        raise ConfigError(problems, source, partial, removed)
    return cfg


def _effective(
    data: Mapping[str, Any],
) -> tuple[TrinityConfig | None, list[Problem], TrinityConfig | None, list[Loc]]:
    """Steps 5-7 on one config's data: (the effective config, None if pydantic rejected it; its
    problems; the partial config, None if even that fails; the key paths taken out for it)."""
    removed: list[Loc] = []
    try:
        cfg = partial = TrinityConfig.model_validate(data)
        problems = []
    except ValidationError as exc:
        cfg, problems = None, problems_from_validation_error(exc, TrinityConfig)
        bad = [(tuple(err["loc"]), err["type"] == "missing") for err in exc.errors()]
        pruned, removed = _prune(data, bad)
        try:
            partial = TrinityConfig.model_validate(pruned)
        except ValidationError:
            return None, problems, None, removed
    partial, lift_problems = lift_verl_keys(partial)
    partial = drop_unread_args(partial)
    problems += lift_problems + check_config(partial, skip=removed)
    return (partial if cfg is not None else None), problems, partial, removed


def _prune(data: Mapping[str, Any], locs: Sequence[tuple[Loc, bool]]) -> tuple[dict, list[Loc]]:
    """A copy of `data` without the keys holding errors, so that defaults stand in for them
    (a bad list item removes its whole list; a missing required key, its parent), and the key
    paths removed."""
    out = copy.deepcopy(dict(data))
    removed: list[Loc] = []
    for loc, missing in locs:
        target = loc[:-1] if missing else loc
        while target and isinstance(target[-1], int):
            target = target[:-1]
        if not target:
            continue
        node: Any = out
        for part in target[:-1]:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if isinstance(node, dict):
            node.pop(target[-1], None)
        removed.append(target)
    return out, removed


def _stages(
    base: Mapping[str, Any], stages: Sequence[Any], known: Sequence[Problem] = ()
) -> tuple[list[TrinityConfig | None], list[Problem]]:
    """Step 8: one effective config per stage (None where its schema failed) and the stages'
    problems, but those in `known` (the base's). `base` is the raw base config."""
    base_only = {k: v for k, v in base.items() if k not in _NOT_MERGED}
    seen = {str(p) for p in known}
    configs: list[TrinityConfig | None] = []
    problems: list[Problem] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Mapping):  # its shape is reported by the base validation
            configs.append(None)
            continue
        overrides = {k: v for k, v in stage.items() if k in StageConfig.model_fields}
        merged = deep_merge(base_only, {k: v for k, v in overrides.items() if k not in _NOT_MERGED})
        name = stage.get("stage_name")
        merged["stage_name"] = name if isinstance(name, str) else ""
        cfg, found, _, _ = _effective(merged)
        problems += [p.with_prefix(f"stages[{i}]") for p in found if str(p) not in seen]
        configs.append(cfg)
    return configs, problems


def _merged_stages(cfg: TrinityConfig) -> tuple[list[TrinityConfig | None], list[Problem]]:
    stages = [stage.model_dump(exclude_unset=True) for stage in cfg.stages]
    return _stages(cfg.written, stages)


def stage_configs(cfg: TrinityConfig) -> list[TrinityConfig]:
    """One full config per stage, in order; `[cfg]` for a config without stages.

    Each is the base config as the user wrote it deep-merged with the stage's overrides,
    validated, with `stages` empty and `stage_name` set (`name` unchanged unless overridden).

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
    """(index, config) of each stage whose merged config is valid (the invalid stages' problems
    are reported by `load_config`)."""
    return [(i, c) for i, c in enumerate(_merged_stages(cfg)[0]) if c is not None]


def per_stage(cfg: TrinityConfig, check: Callable[[TrinityConfig], T]) -> list[tuple[str, T]]:
    """(prefix, `check(config)`) of `cfg` ('') and of each valid stage ('stages[i]')."""
    return [("", check(cfg))] + [(f"stages[{i}]", check(c)) for i, c in valid_stages(cfg)]


def merge_stages(found: Sequence[tuple[str, list[Any]]]) -> list[Any]:
    """The base's items (the first of `per_stage`), then each stage's items that the base does
    not have too, located under the stage (a `Problem` by its path, a line by a prefix)."""
    base = list(found[0][1])
    said = {str(x) for x in base}
    return base + [_under(at, x) for at, items in found[1:] for x in items if str(x) not in said]


def _under(prefix: str, item: Any) -> Any:
    return item.with_prefix(prefix) if isinstance(item, Problem) else f"{prefix}.{item}"


def dump_config(cfg: TrinityConfig) -> str:
    """The effective config with every default filled in, as YAML that `load_config` reads back
    to the same config but for its secrets, shown as `<redacted>` (`config.secrets`). Stages are
    printed as written (only their overrides); `stage_name` only when set."""
    exclude = {"stages"} if cfg.stage_name else {"stages", "stage_name"}
    data = cfg.model_dump(mode="json", exclude=exclude)
    data["stages"] = [s.model_dump(mode="json", exclude_unset=True) for s in cfg.stages]
    data = redacted(data)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
