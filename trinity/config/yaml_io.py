"""Reading config YAML, merging dotted overrides and resolving `${...}` interpolations, as
Trinity-RFT does with OmegaConf: its YAML loader (YAML 1.1 booleans such as `yes`/`on`, `1e-6` a
float, no timestamps), `${a.b}` / `${.sibling}` references, `${oc.env:VAR,default}` (a string)
and the other `oc.*` resolvers. Added on top: every key written twice in a mapping is an error
with its line (OmegaConf stops at the first), and every interpolation that cannot be resolved is
reported with its key path, all at once.

Overrides (`algorithm.optimizer.lr=2e-6`, list items by index: `stages.1.buffer.total_steps=40`
or, as reports print them, `stages[1].buffer.total_steps=40`) are typed and merged as OmegaConf's
dotlist does (`4` -> int, `on` -> True, `null` -> None, `[a, b]` -> list; a mapping merges into a
mapping), before interpolation, so `${...}` sees the overridden value. Each key is checked against
the schema first, so a typo is reported with a suggestion instead of silently added; list items
must exist.

    data = read_yaml("run.yaml")              # plain dicts and lists; raises ConfigError
    data, problems = apply_overrides(data, ["seed=3"], TrinityConfig)
    data, problems = interpolate(data)        # resolved copy + one Problem per bad `${...}`
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._yaml import get_yaml_loader
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel

from trinity.config.base import NotAContainer, UnknownKey, child_annotation, locate_field
from trinity.config.problems import ConfigError, Problem, format_path, suggest

Loc = tuple[str | int, ...]
_BASE_LOADER = get_yaml_loader()


class _Loader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """OmegaConf's YAML loader, collecting every duplicated key (with its line) instead of
    raising at the first."""

    duplicates: list[tuple[str, int]]

    def flatten_mapping(self, node: yaml.MappingNode) -> Any:
        seen: set[str] = set()
        kept = []
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag.endswith(":str"):
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark.line + 1))
                    continue
                seen.add(key_node.value)
            kept.append((key_node, value_node))
        node.value = kept
        return super().flatten_mapping(node)


def parse_scalar(text: str) -> Any:
    """Type a command-line value as OmegaConf's dotlist does ('4' -> 4, 'null' -> None,
    'on' -> True, '[a, b]' -> a list); empty text stays the empty string."""
    if text.strip() == "":
        return text
    try:
        return yaml.load(text, Loader=_BASE_LOADER)
    except yaml.YAMLError:
        return text


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file into a plain dict with OmegaConf's YAML loader.

    Raises:
        ConfigError: missing file, invalid YAML (with line and column), duplicate keys (every
            one, with its line), or a top level that is not a mapping.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {source}", source) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {source}: {exc}", source) from None
    loader = _Loader(text)
    loader.duplicates = []
    try:
        data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"invalid YAML in {source}{where}: {what}", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML in {source}: {exc}", source) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        problems = [
            Problem("", f"line {line}: key '{key}' is written twice (remove one)")
            for key, line in loader.duplicates
        ]
        raise ConfigError(problems, source)
    if data is None:
        raise ConfigError(f"{source}: the file is empty; expected a mapping of sections", source)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections (mode, model, buffer, ...), "
            f"got {type(data).__name__}",
            source,
        )
    return data


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: `override` merged into `base` as OmegaConf merges: mappings merge key by key,
    anything else (lists included) replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _why(exc: Exception) -> str:
    """OmegaConf's message without its `full_key:` / `object_type=` trailer."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = re.sub(r"^\w+ raised while resolving interpolation: ", "", text)
    return text[1:-1] if text[:1] == text[-1:] == '"' else text


def _interpolated(node: Any, loc: Loc = ()) -> list[tuple[Loc, str]]:
    """(key path, text) of every string holding `${` in plain data."""
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _interpolated(v, (*loc, k))]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _interpolated(v, (*loc, i))]
    return [(loc, node)] if isinstance(node, str) and "${" in node else []


def _set(data: Any, loc: Loc, value: Any) -> None:
    for part in loc[:-1]:
        data = data[part]
    data[loc[-1]] = value


def interpolate(data: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """A copy of `data` with every `${...}` resolved by OmegaConf, and a problem per
    interpolation that cannot be (bad syntax, a missing key or variable, a cycle), at its key path.

    A whole-value reference keeps the type of what it refers to (`${model.max_model_len}` is the
    number there, `${a}` the whole section); `${oc.env:VAR,default}` is a string, as in OmegaConf
    (typed fields convert it). A value that failed is left as written.
    """
    out = copy.deepcopy(data)
    found, failed = _interpolated(out), {}
    for loc, text in found:  # bad syntax fails OmegaConf.create: take those out first
        try:
            OmegaConf.create({"value": text})
        except OmegaConfBaseException as exc:
            failed[loc] = exc
            _set(out, loc, None)
    tree = OmegaConf.create(out)
    values = {}
    for loc, _ in found:
        try:
            if loc not in failed:
                value = OmegaConf.select(tree, ".".join(map(str, loc)), throw_on_missing=True)
                plain = isinstance(value, DictConfig | ListConfig)
                values[loc] = OmegaConf.to_container(value, resolve=True) if plain else value
        except OmegaConfBaseException as exc:
            failed[loc] = exc
    for loc, text in found:  # a failed value stays as written
        _set(out, loc, text if loc in failed else values[loc])
    problems = [
        Problem(format_path(loc), f"cannot resolve {text!r}: {_why(failed[loc])}")
        for loc, text in found
        if loc in failed
    ]
    return out, problems


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


def _merge_at(node: Any, parts: list[str], value: Any, text: str) -> Problem | None:
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
    problem = _merge_at(trial, parts, parse_scalar(value_text), text)
    if problem is None:
        data.clear()
        data.update(trial)
    return problem


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], root: type[BaseModel]
) -> tuple[dict[str, Any], list[Problem]]:
    """A copy of `data` (raw, as read; not modified) with every `dotted.key.path=value` of
    `overrides` applied, its keys checked against the schema `root`, and a problem per override
    that failed (each is applied whole or not at all)."""
    out = copy.deepcopy(data)
    problems = [p for text in overrides if (p := _apply_one(out, text, root)) is not None]
    return out, problems
