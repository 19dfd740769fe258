"""Dotted command-line overrides: `algorithm.optimizer.lr=2e-6`, `buffer.explorer_input.
eval_tasksets.0.path=data/test`. List items may also be written as error reports print them:
`stages[1].buffer.total_steps=40`.

The value is typed and merged as OmegaConf's dotlist does (`4` -> int, `on` -> True, `null` ->
None, `[a, b]` -> list; a mapping merges into a mapping, `OmegaConf.update(merge=True)`), before
interpolation, so `${...}` references see the overridden value. Each key is first checked
against the schema, so an override with a typo is reported with a suggestion instead of being
silently added; list items must already exist.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from trinity.config.base import NotAContainer, UnknownKey, child_annotation, locate_field
from trinity.config.problems import Problem, format_path, suggest
from trinity.config.yaml_io import deep_merge, parse_scalar


def _check_keys(parts: list[str], text: str, root: type[BaseModel]) -> Problem | None:
    """Check every key of an override against the schema, before anything is set."""
    ann: Any = root
    done: list[str | int] = []
    for part in parts:
        try:
            ann = child_annotation(ann, part)
        except UnknownKey as exc:
            allowed = [a for a in exc.allowed if a != "stage_name" or done]
            return Problem(
                format_path([*done, part]),
                f"unknown key in override {text!r}",
                locate_field(root, part) or suggest(part, allowed),
            )
        except NotAContainer as exc:
            return Problem(format_path(done), f"cannot apply override {text!r}: {exc}")
        done.append(int(part) if part.isdigit() else part)
    return None


def _set(node: Any, parts: list[str], value: Any, text: str) -> Problem | None:
    """Merge `value` at `parts` into `node` (in place), creating missing mappings on the way."""
    done: list[str | int] = []
    for i, part in enumerate(parts):
        if isinstance(node, dict):
            key: str | int = part
        elif isinstance(node, list):  # the schema check made sure `part` is an index
            key = int(part)
            if key >= len(node):
                return Problem(
                    format_path([*done, key]),
                    f"override {text!r}: index out of range (the list has {len(node)} items)",
                )
        else:
            where = format_path(done) or "<top level>"
            return Problem(where, f"cannot apply override {text!r}: {where} holds a single value")
        done.append(key)
        old = node[key] if isinstance(node, list) else node.get(key)
        if i == len(parts) - 1:  # as OmegaConf.update(merge=True): a mapping merges
            merge = isinstance(value, dict) and isinstance(old, dict)
            node[key] = deep_merge(old, value) if merge else value
        elif old is None:
            node[key] = old = [] if parts[i + 1].isdigit() else {}
        node = old
    return None


def _apply_one(data: dict[str, Any], text: str, root: type[BaseModel]) -> Problem | None:
    """Set one `key.path=value` in `data` (in place, all or nothing); or return a problem."""
    key_text, sep, value_text = text.partition("=")
    key_text = re.sub(r"\[(\d+)\]", r".\1", key_text.strip())  # a[1].b -> a.1.b
    parts = key_text.split(".")
    if not sep or not all(parts):
        return Problem("", f"override {text!r} must look like key.path=value")
    problem = _check_keys(parts, text, root)
    if problem is not None:
        return problem
    trial = copy.deepcopy(data)
    problem = _set(trial, parts, parse_scalar(value_text), text)
    if problem is None:
        data.clear()
        data.update(trial)
    return problem


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], root: type[BaseModel]
) -> tuple[dict[str, Any], list[Problem]]:
    """A copy of `data` with every override applied, and a problem per override that failed.

    Args:
        data: the raw config dict as read from YAML; not modified.
        overrides: strings `dotted.key.path=value`; list items are addressed by index.
        root: the schema the keys are checked against (TrinityConfig).
    """
    out = copy.deepcopy(data)
    problems = [p for text in overrides if (p := _apply_one(out, text, root)) is not None]
    return out, problems
