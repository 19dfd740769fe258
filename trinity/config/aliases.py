"""Deprecated Trinity-RFT spellings, accepted and read as their current names.

Each config section declares its renames (`ConfigSection.renamed_keys`, e.g. `task_selector ->
data_selector`) and renamed values (`renamed_values`, e.g. `sync_style: dynamic_by_explorer ->
explorer_driven`). `apply_renames` maps them before validation and returns one note per rename,
which `trinity validate` prints; a config that sets both the old and the new key is a problem
(which one should win is not ours to guess).

This renames keys and deprecated enum spellings only; no value a user wrote is changed otherwise.

    data, problems, notes = apply_renames(raw, TrinityConfig)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trinity.config.base import child_annotation, strip
from trinity.config.problems import Problem, format_path

Loc = tuple[str | int, ...]


def _section(annotation: Any) -> type[BaseModel] | None:
    ann = strip(annotation)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def apply_renames(
    data: Any, root: type[BaseModel], _loc: Loc = ()
) -> tuple[Any, list[Problem], list[str]]:
    """A copy of `data` with deprecated keys and values renamed.

    Args:
        data: raw config data (as read from YAML); not modified.
        root: the schema `data` follows (TrinityConfig at the top).

    Returns:
        The renamed copy, a problem per key set under both its old and new name, and a note
        per rename ("path: 'old' is deprecated; read as 'new'").
    """
    problems: list[Problem] = []
    notes: list[str] = []
    section = _section(root)
    if isinstance(data, dict) and section is not None:
        out: dict[Any, Any] = {}
        renamed = getattr(section, "renamed_keys", {})
        for key, value in data.items():
            new = renamed.get(key) if isinstance(key, str) else None
            if new is not None:
                if new in data:
                    problems.append(
                        Problem(
                            format_path((*_loc, key)),
                            f"deprecated name of '{new}', which is also set; keep only '{new}'",
                        )
                    )
                    continue
                notes.append(f"{format_path((*_loc, key))}: deprecated name, read as '{new}'")
                key = new
            try:
                child = child_annotation(section, key)
            except LookupError:  # an unknown key: validation reports it
                out[key] = value
                continue
            if key == "stages" and section.__name__ == "TrinityConfig":
                child = list[section]  # type: ignore[valid-type]  # stage items: top-level keys
            value_map = getattr(section, "renamed_values", {}).get(key, {})
            if isinstance(value, str) and value in value_map:
                notes.append(
                    f"{format_path((*_loc, key))}: {value!r} is deprecated, read as "
                    f"{value_map[value]!r}"
                )
                value = value_map[value]
            out[key], found, said = apply_renames(value, child, (*_loc, key))
            problems += found
            notes += said
        return out, problems, notes
    if isinstance(data, list):
        items: list[Any] = []
        for i, item in enumerate(data):
            try:
                child = child_annotation(root, i)
            except LookupError:
                child = Any
            new_item, found, said = apply_renames(item, child, (*_loc, i))
            items.append(new_item)
            problems += found
            notes += said
        return items, problems, notes
    if isinstance(data, dict):  # a free mapping (dict[str, Section] or Any)
        out = {}
        for key, value in data.items():
            try:
                child = child_annotation(root, key)
            except LookupError:
                child = Any
            out[key], found, said = apply_renames(value, child, (*_loc, key))
            problems += found
            notes += said
        return out, problems, notes
    return data, problems, notes
