"""What this build does with each config key: acted upon, not built yet, or not applicable here.

Every field of the schema (all sections, list and mapping items included) is in exactly one state,
declared in `KEY_STATES` (`key_states.py`); a section's entry covers the fields under it that
have none.

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
from typing import Any

from pydantic import BaseModel

from trinity.config.key_states import _DEFAULT, KEY_STATES, KeyState
from trinity.config.problems import Problem, _strip
from trinity.config.schema import TrinityConfig
from trinity.config.trainer_config import unmapped_keys

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
            elif (
                entry.state == "not_built"
                and not _is_inert(entry, value)
                and not (entry.unless is not None and entry.unless(cfg))
            ):
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
    return notes + list(cfg.compat_notes)


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
