"""Reading config YAML, and `${oc.env:VAR,default}` interpolation.

The YAML dialect departs from PyYAML's YAML 1.1 defaults towards YAML 1.2, which is what people
expect when writing configs: `1e-6` is a float (not a string), only `true`/`false` are booleans
(`on`, `no`, `y` stay strings), `010` is not octal. Duplicate keys are errors, not "last one wins".

Interpolation follows OmegaConf's `oc.env` resolver: `${oc.env:VAR}` and `${oc.env:VAR,default}`
anywhere inside a string value. When the whole value is one interpolation, the result is typed
like a YAML scalar (`${oc.env:N,4}` gives the integer 4); inside longer text it is substituted as
text. References to other keys (`${model.model_path}`, `${trainer.trainer_config.x.y}`) are
resolved too; other resolvers are rejected rather than silently left in place.
"""

from __future__ import annotations

import copy
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


# --- interpolation: ${oc.env:...} and ${other.key} ----------------------------------------
#
# Why not OmegaConf itself: it stops at the first bad interpolation (we report every one, each with
# its key path), it would parse the YAML again with its own rules (we read YAML 1.2 scalars and
# reject duplicate keys) and it would add a dependency for two small features. The subset Trinity
# configs use is implemented here with OmegaConf's meaning: `${oc.env:VAR}`, `${oc.env:VAR,default}`
# and absolute references `${a.b.c}` / `${a.list[0].b}` to other keys of the same file.

_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")
_KEY_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*|\[\d+\]|\.\d+)*")
_PART = re.compile(r"[^.\[\]]+|\[\d+\]")

Loc = tuple[str | int, ...]


class _Unresolved(Exception):
    """An interpolation that cannot be resolved; the message says why."""


def _env_value(expr: str, env: Mapping[str, str]) -> Any:
    """The typed value of `oc.env:VAR[,default]`."""
    var, sep, default = expr.removeprefix("oc.env:").partition(",")
    var = var.strip()
    if not var:
        raise _Unresolved(f"interpolation '${{{expr}}}' names no environment variable")
    if var in env:
        return parse_scalar(env[var])
    if sep:
        return parse_scalar(default.strip())
    raise _Unresolved(f"environment variable {var} is not set and '${{{expr}}}' has no default")


def _key_loc(expr: str) -> Loc:
    """`a.b[0].c` -> ('a', 'b', 0, 'c'); an unsupported form raises _Unresolved."""
    if expr.startswith("."):
        raise _Unresolved(
            f"relative interpolation '${{{expr}}}' is not supported; write the full key"
        )
    if ":" in expr:
        raise _Unresolved(
            f"unsupported interpolation '${{{expr}}}': only ${{oc.env:VAR}}, "
            "${oc.env:VAR,default} and references to other keys (${a.b.c}) are supported"
        )
    if not _KEY_PATH.fullmatch(expr.strip()):
        raise _Unresolved(f"interpolation '${{{expr}}}' is not a key path like a.b.c")
    return tuple(
        int(p.strip("[]")) if p.startswith("[") or p.isdigit() else p
        for p in _PART.findall(expr.strip())
    )


class _Resolver:
    """Resolves every interpolation of one config, following references to other keys."""

    def __init__(self, root: Any, env: Mapping[str, str]) -> None:
        self.root = root
        self.env = env
        self.done: dict[Loc, Any] = {}
        self.failed: dict[Loc, str] = {}
        self.stack: list[Loc] = []

    def value(self, node: Any, loc: Loc) -> Any:
        """The resolved copy of `node` (found at `loc`)."""
        if isinstance(node, dict):
            return {k: self.value(v, (*loc, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [self.value(v, (*loc, i)) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        if loc in self.done:
            return self.done[loc]
        if loc in self.failed:
            return node
        if loc in self.stack:
            chain = [*self.stack[self.stack.index(loc) :], loc]
            raise _Unresolved("interpolation cycle: " + " -> ".join(map(format_path, chain)))
        self.stack.append(loc)
        try:
            whole = _INTERPOLATION.fullmatch(node)
            if whole:
                result = self._one(whole.group(1))
            else:
                result = _INTERPOLATION.sub(lambda m: self._text(m.group(1)), node)
        except _Unresolved as exc:
            self.failed[loc] = str(exc)
            return node
        finally:
            self.stack.pop()
        self.done[loc] = result
        return result

    def _text(self, expr: str) -> str:
        value = self._one(expr)
        if isinstance(value, (dict, list)):
            raise _Unresolved(f"'${{{expr}}}' is a section or list and cannot be part of a text")
        return (
            value
            if isinstance(value, str)
            else yaml.safe_dump(value).strip().removesuffix("...").strip()
        )

    def _one(self, expr: str) -> Any:
        if expr.startswith("oc.env:"):
            return _env_value(expr, self.env)
        loc = _key_loc(expr)
        node = self.root
        for i, part in enumerate(loc):
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                raise _Unresolved(
                    f"'${{{expr}}}' refers to {format_path(loc)}, but "
                    f"{format_path(loc[: i + 1])} is not set in this config"
                ) from None
        if not isinstance(node, str):  # a section or list that holds this very reference
            inside = next((s for s in self.stack if s[: len(loc)] == loc), None)
            if inside is not None:
                raise _Unresolved(
                    f"interpolation cycle: {format_path(inside)} refers to {format_path(loc)}, "
                    "which contains it"
                )
        resolved = self.value(node, loc)
        if isinstance(node, str) and loc in self.failed:
            if self.failed[loc].startswith("interpolation cycle"):
                raise _Unresolved(self.failed[loc])
            raise _Unresolved(
                f"'${{{expr}}}' refers to {format_path(loc)}, which cannot be resolved"
            )
        return copy.deepcopy(resolved)


def interpolate(data: Any, env: Mapping[str, str] | None = None) -> tuple[Any, list[Problem]]:
    """A copy of `data` with every `${oc.env:...}` and `${other.key}` in its strings resolved.

    A whole-value interpolation keeps the type of what it refers to (`${oc.env:N,4}` gives the
    integer 4, `${model.max_model_len}` the number there); inside longer text it is substituted
    as text. References are absolute key paths and may chain; a cycle or a missing target is a
    problem at the key holding the interpolation.

    Args:
        data: plain YAML data (dicts, lists, scalars); not modified.
        env: the environment to read; defaults to `os.environ`.

    Returns:
        The resolved copy, and one problem (with its key path) per unresolvable interpolation.
    """
    resolver = _Resolver(data, os.environ if env is None else env)
    out = resolver.value(data, ())
    problems = [Problem(format_path(loc), msg) for loc, msg in resolver.failed.items()]
    return out, problems
