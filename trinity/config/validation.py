"""Validating a raw config dict, including its stages, into problems with key paths.

Validation is two passes over the same dict, both pure: pydantic checks every field (types,
allowed values, bounds, unknown keys), then `checks.py` checks the rules spanning fields on the
fields that passed. Stages are validated as the base config deep-merged with each stage's
overrides; their problems carry a `stages[i].` prefix.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from trinity.config.aliases import apply_renames
from trinity.config.checks import Loc, check_config
from trinity.config.problems import Problem, problems_from_validation_error
from trinity.config.schema import StageConfig, TrinityConfig
from trinity.config.trainer_config import lift_verl_keys
from trinity.config.yaml_io import deep_merge

_NOT_MERGED = ("stages", "stage_name")


def _prune(data: Mapping[str, Any], locs: Sequence[Loc]) -> tuple[dict[str, Any], list[Loc]]:
    """A copy of `data` without the keys holding errors, so that defaults stand in for them.

    A bad list item removes its whole list; a missing required key removes its parent.
    Returns the copy and the key paths removed.
    """
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


def _unread_args(cfg: TrinityConfig) -> TrinityConfig:
    """`cfg` without the Trinity-RFT piece arguments nothing here reads, each with a note:

    - the `<piece>_args` of a piece set to 'none' (Trinity-RFT ignores them too, e.g.
      `kl_loss_fn_args.kl_coef` under `kl_loss_fn: none`);
    - a policy loss's derived arguments (its `derived_args`, e.g. mix_chord's
      `train_batch_size_usual`), which Trinity-RFT fills itself and the trainer derives here.
    """
    from trinity.algorithm.algorithms import PIECES, known_algorithm

    algo = cfg.algorithm
    spec = known_algorithm(algo.algorithm_type)
    if spec is None:
        return cfg  # reported by the pre-flight pass
    updates: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for piece, (registry, _) in PIECES.items():
        args, chosen = getattr(algo, f"{piece}_args"), getattr(algo, piece) or getattr(spec, piece)
        at = f"algorithm.{piece}_args"
        if args and chosen == "none":
            updates[f"{piece}_args"] = {}
            notes += [f"{at}.{k}: not applicable here ({piece} is 'none': unread)" for k in args]
        elif args and chosen is not None and chosen in registry:
            derived = getattr(registry.get(chosen), "derived_args", ())
            if any(k in derived for k in args):
                updates[f"{piece}_args"] = {k: v for k, v in args.items() if k not in derived}
                notes += [
                    f"{at}.{k}: derived here from the batch settings (Trinity-RFT fills it "
                    "too); the value written is not read"
                    for k in args
                    if k in derived
                ]
    if not updates:
        return cfg
    out = cfg.model_copy(update={"algorithm": algo.model_copy(update=updates)})
    out.add_compat_notes(notes)
    return out


def _effective(cfg: TrinityConfig, skip: Sequence[Loc] = ()) -> tuple[TrinityConfig, list[Problem]]:
    """The effective config: the verl `trainer_config` values lifted into our keys (checked
    against what the user wrote first) and unread Trinity-RFT arguments taken out (with notes);
    then the cross-field checks on it."""
    cfg, problems = lift_verl_keys(cfg)
    cfg = _unread_args(cfg)
    return cfg, problems + check_config(cfg, skip=skip)


def validate_raw(
    data: Mapping[str, Any],
) -> tuple[TrinityConfig | None, list[Problem], TrinityConfig | None, list[Loc]]:
    """Validate one config dict (stages only checked for shape) into its effective config.

    Returns:
        The effective config (None if pydantic rejected it), every problem found, the partial
        config (the effective config of `data` without the values pydantic rejected, defaults in
        their place; None if even that fails) and the key paths taken out for it. A config is
        returned with problems when only the cross-field checks failed.
    """
    try:
        cfg = TrinityConfig.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation_error(exc, TrinityConfig)
        # re-validate with the bad values removed, to run the checks that do not read them
        bad = [(tuple(err["loc"]), err["type"] == "missing") for err in exc.errors()]
        pruned, removed = _prune(data, bad)
        try:
            partial = TrinityConfig.model_validate(pruned)
        except ValidationError:
            return None, problems, None, removed
        partial, found = _effective(partial, skip=removed)
        return None, problems + found, partial, removed
    cfg, found = _effective(cfg)
    return cfg, found, cfg, []


def validate_stages(
    base: Mapping[str, Any], stages: Sequence[Any], known: Sequence[Problem] = ()
) -> tuple[list[TrinityConfig | None], list[Problem]]:
    """Validate each stage as `base` deep-merged with the stage's overrides.

    Args:
        base: the raw base config (its own `stages` key is ignored).
        stages: the raw stage dicts (`stage_name` plus overrides of top-level keys).
        known: problems already reported for the base; not repeated for every stage.

    Returns:
        One config per stage (None where its schema failed) and the stages' problems.
    """
    base_only = {k: v for k, v in base.items() if k not in _NOT_MERGED}
    seen = {(p.path, p.message) for p in known}
    configs: list[TrinityConfig | None] = []
    problems: list[Problem] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, Mapping):  # its shape is reported by the base validation
            configs.append(None)
            continue
        overrides = {
            k: v for k, v in stage.items() if k in StageConfig.model_fields and k not in _NOT_MERGED
        }
        merged = deep_merge(base_only, overrides)
        name = stage.get("stage_name")
        merged["stage_name"] = name if isinstance(name, str) else ""
        cfg, found, _, _ = validate_raw(merged)
        found = [p.with_prefix(f"stages[{i}]") for p in found if (p.path, p.message) not in seen]
        configs.append(cfg)  # None only where the schema failed
        problems += found
    return configs, problems


def validate_all(
    data: Mapping[str, Any],
) -> tuple[TrinityConfig | None, list[Problem], TrinityConfig | None, list[Loc]]:
    """Validate a config dict and all its stages (see `validate_raw` for what is returned).

    Deprecated spellings are read as their current names first (`aliases.py`); the notes saying
    so, and the data as written (for `stage_configs`), are kept on the returned config.
    """
    data, problems, notes = apply_renames(dict(data), TrinityConfig)
    cfg, found, partial, removed = validate_raw(data)
    problems += found
    for c in {id(x): x for x in (cfg, partial) if x is not None}.values():
        c.set_source(notes, data)
    stages = data.get("stages")
    if isinstance(stages, list) and stages:
        _, stage_problems = validate_stages(data, stages, known=problems)
        problems += stage_problems
    return cfg, problems, partial, removed
