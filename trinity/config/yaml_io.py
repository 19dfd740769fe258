"""Reading config YAML, and `${oc.env:VAR,default}` interpolation.

The YAML dialect departs from PyYAML's YAML 1.1 defaults towards YAML 1.2, which is what people
expect when writing configs: `1e-6` is a float (not a string), only `true`/`false` are booleans
(`on`, `no`, `y` stay strings), `010` is not octal. Duplicate keys are errors, not "last one wins".

Interpolation follows OmegaConf's `oc.env` resolver: `${oc.env:VAR}` and `${oc.env:VAR,default}`
anywhere inside a string value. When the whole value is one interpolation, the result is typed
like a YAML scalar (`${oc.env:N,4}` gives the integer 4); inside longer text it is substituted as
text. Other interpolations (`${a.b}`) are rejected rather than silently left in place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode

from trinity.config.problems import ConfigError, Problem, format_path

_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"
_INT = "tag:yaml.org,2002:int"
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 style scalars and duplicate-key detection."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, int]] = []  # (key, 1-based line)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Record keys written twice in one mapping, then build it as usual."""
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != _MERGE:
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark.line + 1))
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT, _INT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _load(text: str) -> tuple[Any, list[tuple[str, int]]]:
    """Parse YAML text; returns the data and the duplicated keys found."""
    loader = _Loader(text)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


def parse_scalar(text: str) -> Any:
    """Type a command-line or default value like YAML would: '4' -> 4, 'null' -> None.

    Empty text stays the empty string; text that is not valid YAML stays as it is.
    """
    if text.strip() == "":
        return text
    try:
        value, _ = _load(text)
    except yaml.YAMLError:
        return text
    return value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file into a plain dict.

    Raises:
        ConfigError: missing file, invalid YAML (with line and column), duplicate keys, or a top
            level that is not a mapping.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {source}", source) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {source}: {exc}", source) from None
    try:
        data, duplicates = _load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"invalid YAML in {source}{where}: {what}", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML in {source}: {exc}", source) from None
    if duplicates:
        problems = [
            Problem("", f"line {line}: key '{key}' is written twice (remove one)")
            for key, line in duplicates
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


# --- ${oc.env:...} interpolation ----------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class _Unresolved(Exception):
    """An interpolation that cannot be resolved; the message says why."""


def _resolve_one(expr: str, env: Mapping[str, str]) -> tuple[Any, str]:
    """Resolve the inside of `${...}`; returns (typed value, text value)."""
    if not expr.startswith("oc.env:"):
        raise _Unresolved(
            f"unsupported interpolation '${{{expr}}}': only ${{oc.env:VAR}} and "
            "${oc.env:VAR,default} are supported"
        )
    var, sep, default = expr.removeprefix("oc.env:").partition(",")
    var = var.strip()
    if not var:
        raise _Unresolved(f"interpolation '${{{expr}}}' names no environment variable")
    if var in env:
        raw = env[var]
    elif sep:
        raw = default.strip()
    else:
        raise _Unresolved(f"environment variable {var} is not set and '${{{expr}}}' has no default")
    typed = parse_scalar(raw)
    text = typed if isinstance(typed, str) else raw
    return typed, text


def interpolate(
    data: Any, env: Mapping[str, str] | None = None, _loc: tuple[str | int, ...] = ()
) -> tuple[Any, list[Problem]]:
    """A copy of `data` with every `${oc.env:...}` in its strings resolved.

    Args:
        data: plain YAML data (dicts, lists, scalars); not modified.
        env: the environment to read; defaults to `os.environ`.

    Returns:
        The resolved copy, and one problem (with its key path) per unresolvable interpolation.
    """
    env = os.environ if env is None else env
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        problems: list[Problem] = []
        for key, value in data.items():
            out[key], found = interpolate(value, env, (*_loc, key))
            problems += found
        return out, problems
    if isinstance(data, list):
        items, problems = [], []
        for i, value in enumerate(data):
            item, found = interpolate(value, env, (*_loc, i))
            items.append(item)
            problems += found
        return items, problems
    if not isinstance(data, str) or "${" not in data:
        return data, []
    try:
        whole = _INTERPOLATION.fullmatch(data)
        if whole:
            return _resolve_one(whole.group(1), env)[0], []
        return _INTERPOLATION.sub(lambda m: _resolve_one(m.group(1), env)[1], data), []
    except _Unresolved as exc:
        return data, [Problem(format_path(_loc), str(exc))]
