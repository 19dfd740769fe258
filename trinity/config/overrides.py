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


def _check_path(node: Any, parts: list[str], text: str) -> Problem | None:
    """A problem if `parts` indexes past a list's end or into a single value; the mappings that
    are missing on the way are created by the merge."""
    done: list[str | int] = []
    for part in parts[:-1] if parts else []:
        where = format_path(done) or "<top level>"
        if isinstance(node, list):
            key = int(part)
            if key >= len(node):
                items = f"{len(node)} item" + ("" if len(node) == 1 else "s")
                return Problem(
                    format_path([*done, key]),
                    f"override {text!r}: index out of range (the list has {items})",
                )
            node, done = node[key], [*done, key]
        elif isinstance(node, dict):
            node, done = node.get(part), [*done, part]
        elif node is not None:
            return Problem(where, f"cannot apply override {text!r}: {where} holds a single value")
        if node is None:
            break
    last = parts[-1]
    if isinstance(node, list) and int(last) >= len(node):
        items = f"{len(node)} item" + ("" if len(node) == 1 else "s")
        return Problem(
            format_path([*done, int(last)]),
            f"override {text!r}: index out of range (the list has {items})",
        )
    if node is None and any(p.isdigit() for p in parts[len(done) :]):
        index = next(int(p) for p in parts[len(done) :] if p.isdigit())
        at = parts[: parts.index(str(index), len(done)) + 1]
        loc = [int(p) if p.isdigit() else p for p in at]
        return Problem(
            format_path(loc), f"override {text!r}: index out of range (the list is empty)"
        )
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
    problem = _check_path(data, parts, text)
    if problem is not None:
        return problem
    node: Any = data
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        else:
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
    key: Any = int(parts[-1]) if isinstance(node, list) else parts[-1]
    value = parse_scalar(value_text)
    old = node[key] if isinstance(node, list) else node.get(key)
    if isinstance(value, dict) and isinstance(old, dict):  # OmegaConf.update(merge=True)
        value = deep_merge(old, value)
    node[key] = value
    return None


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
