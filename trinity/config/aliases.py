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


def apply_renames(data: Any, root: Any, _loc: Loc = ()) -> tuple[Any, list[Problem], list[str]]:
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
    if not isinstance(data, dict | list):
        return data, problems, notes
    ann = strip(root)
    section = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    renamed: dict[str, str] = getattr(section, "renamed_keys", {})
    values: dict[str, dict[str, str]] = getattr(section, "renamed_values", {})
    out: dict[Any, Any] = {}
    for key, value in data.items() if isinstance(data, dict) else enumerate(data):
        new = renamed.get(key) if isinstance(key, str) else None
        if new is not None:
            where = format_path((*_loc, key))
            if new in data:
                problems.append(
                    Problem(
                        where, f"deprecated name of '{new}', which is also set; keep only '{new}'"
                    )
                )
                continue
            notes.append(f"{where}: deprecated name, read as '{new}'")
            key = new
        if isinstance(value, str) and value in values.get(key, {}):
            new_value = values[key][value]
            notes.append(
                f"{format_path((*_loc, key))}: {value!r} is deprecated, read as {new_value!r}"
            )
            value = new_value
        try:  # stage items hold top-level keys
            child = list[ann] if key == "stages" and not _loc else child_annotation(root, key)
        except LookupError:  # an unknown key: validation reports it
            child = Any
        out[key], found, said = apply_renames(value, child, (*_loc, key))
        problems += found
        notes += said
    return (out if isinstance(data, dict) else list(out.values())), problems, notes
