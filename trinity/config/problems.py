"""Config problems: one record per mistake, all reported together in one `ConfigError`.

Pydantic's errors are translated into key paths users can grep for
(`buffer.explorer_input.eval_tasksets[0].format.prompt_key`) and plain messages: "unknown key
(did you mean 'repeat_times'?)", "'adam' is not allowed; expected one of: 'adamw'".
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    """One mistake in a config: where (`path`), what (`message`) and a likely fix."""

    path: str
    message: str
    did_you_mean: str | None = None

    def __str__(self) -> str:
        hint = f" (did you mean '{self.did_you_mean}'?)" if self.did_you_mean else ""
        return f"{self.path}: {self.message}{hint}" if self.path else f"{self.message}{hint}"

    def with_prefix(self, prefix: str) -> Problem:
        """The same problem located under `prefix` (e.g. 'stages[1]')."""
        if not prefix:
            return self
        path = f"{prefix}.{self.path}" if self.path else prefix
        return replace(self, path=path)


class ConfigError(Exception):
    """Every problem of a config at once; `str()` is a readable multi-line report.

    Args:
        problems: the problems, or one message for a file-level problem (missing file, bad YAML).
        source: the config file the problems are in, if any.
        partial: the config without the values that failed the schema (defaults in their
            place), for the pre-flight pass over the parts that are valid; None if none.
        removed: the key paths taken out of `partial`.
    """

    def __init__(
        self,
        problems: Sequence[Problem] | str,
        source: str | None = None,
        partial: Any = None,
        removed: Sequence[tuple[str | int, ...]] = (),
    ) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems: list[Problem] = list(problems)
        self.source = source
        self.partial = partial
        self.removed = list(removed)
        super().__init__(self.problems, source, partial, self.removed)

    def __str__(self) -> str:
        if len(self.problems) == 1 and not self.problems[0].path:  # a file-level problem
            text = str(self.problems[0])
            return text if not self.source or self.source in text else f"{self.source}: {text}"
        n = len(self.problems)
        header = f"{n} problem" + ("" if n == 1 else "s")
        if self.source:
            header = f"{self.source}: {header}"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])


def format_path(loc: Iterable[str | int]) -> str:
    """Turn `('buffer', 'tasksets', 0, 'path')` into `buffer.tasksets[0].path`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to `word`, or None when nothing is close."""
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


# --- walking the schema by key path --------------------------------------------------------


class UnknownKey(LookupError):
    """A key that the schema does not allow at this place; `.allowed` lists what would be."""

    def __init__(self, key: str | int, allowed: Sequence[str]) -> None:
        super().__init__(key)
        self.key = key
        self.allowed = list(allowed)


class NotAContainer(LookupError):
    """A key was asked for inside a scalar, or a list was indexed with a non-number."""


def _strip(annotation: Any) -> Any:
    """Remove `Annotated[...]` and `X | None` wrappers; a true union of several types -> Any."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return Any
            annotation = args[0]
        else:
            return annotation


def child_annotation(annotation: Any, key: str | int) -> Any:
    """The annotation of `key` inside a value typed `annotation`; `Any` where keys are free.

    Raises:
        UnknownKey: `annotation` is a config section without a field `key`.
        NotAContainer: `annotation` is a scalar, or a list indexed by a non-number.
    """
    ann = _strip(annotation)
    if ann is Any:
        return Any
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        if isinstance(key, str) and key in ann.model_fields:
            return ann.model_fields[key].annotation
        renamed = getattr(ann, "renamed_keys", {}).get(key)
        if renamed is not None:  # a deprecated spelling (see aliases.py)
            return ann.model_fields[renamed].annotation
        raise UnknownKey(key, list(ann.model_fields))
    origin, args = get_origin(ann), get_args(ann)
    if origin in (list, tuple) or ann in (list, tuple):
        if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
            return args[0] if args else Any
        raise NotAContainer(f"expected a list index, got {key!r}")
    if origin is dict or ann is dict:
        return args[1] if len(args) == 2 else Any
    raise NotAContainer("not a section: it holds a single value")


def annotation_at(root: type[BaseModel], loc: Sequence[str | int]) -> Any:
    """The annotation found by walking `loc` down from `root`; None if the path is unknown."""
    ann: Any = root
    try:
        for key in loc:
            ann = child_annotation(ann, key)
    except LookupError:
        return None
    return ann


def _models_below(annotation: Any) -> list[type[BaseModel]]:
    """Config sections reachable from `annotation` through Optional, list and dict."""
    ann = _strip(annotation)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    args = get_args(ann) if get_origin(ann) in (list, dict) else ()
    return [m for a in args[-1:] for m in _models_below(a)]


def locate_field(root: type[BaseModel], name: str) -> str | None:
    """The shortest dotted path under `root` to a field called `name` (None if none or tied).

    Used to suggest `algorithm.optimizer` for an `optimizer:` written at the top level.
    """
    frontier: list[tuple[str, type[BaseModel]]] = [("", root)]
    while frontier:
        found = [f"{p}.{name}".lstrip(".") for p, m in frontier if name in m.model_fields]
        if found:
            return found[0] if len(found) == 1 else None
        frontier = [
            (f"{p}.{field}".lstrip("."), sub)
            for p, m in frontier
            for field, info in m.model_fields.items()
            for sub in _models_below(info.annotation)
        ]
    return None


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` (optionally wrapped), else None."""
    ann = _strip(annotation)
    return get_args(ann) if get_origin(ann) is Literal else None


# --- pydantic errors -> problems ----------------------------------------------------------

_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
    "dict": "a mapping",
    "model": "a mapping (a section of keys)",
    "list": "a list",
    "tuple": "a list",
}

_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _describe(value: Any) -> str:
    """`'abc' (str)` style description of a user value, shortened."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def problems_from_validation_error(error: ValidationError, root: type[BaseModel]) -> list[Problem]:
    """Translate pydantic's errors for a `root` model into `Problem`s with dotted key paths."""
    problems: list[Problem] = []
    for err in error.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        ctx = err.get("ctx") or {}
        path = format_path(loc)
        value = err.get("input")
        if kind == "extra_forbidden":
            parent = annotation_at(root, loc[:-1])
            names: list[str] = []
            ann = _strip(parent)
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                names = [n for n in ann.model_fields if n != "stage_name" or ann is not root]
            key = str(loc[-1])
            hint = locate_field(root, key) or suggest(key, names)
            problems.append(Problem(path, "unknown key", hint))
        elif kind == "missing":
            problems.append(Problem(path, "required key is missing"))
        elif kind == "literal_error":
            allowed = literal_values(annotation_at(root, loc))
            if allowed is None:  # raised by a validator with its own message
                problems.append(Problem(path, err["msg"], ctx.get("did_you_mean")))
                continue
            listed = ", ".join(repr(a) for a in allowed)
            problems.append(
                Problem(
                    path,
                    f"{value!r} is not allowed; expected one of: {listed}",
                    suggest(str(value), [str(a) for a in allowed]),
                )
            )
        elif kind.endswith(("_type", "_parsing")) and kind.split("_")[0] in _TYPE_WORDS:
            want = _TYPE_WORDS[kind.split("_")[0]]
            problems.append(Problem(path, f"expected {want}, got {_describe(value)}"))
        elif kind in _BOUNDS:
            bound = next(iter(ctx.values()), "?")
            problems.append(Problem(path, f"must be {_BOUNDS[kind]} {bound}, got {value!r}"))
        elif kind == "int_from_float":
            problems.append(Problem(path, f"expected an integer, got {value!r}"))
        elif kind == "value_error":
            problems.append(Problem(path, err["msg"].removeprefix("Value error, ")))
        else:  # too_short, string_too_short, ...: pydantic's own wording
            msg = err["msg"]
            problems.append(Problem(path, msg if "got" in msg else f"{msg}, got {value!r}"))
    return problems
