"""Config problems: one record per mistake, all reported together in one `ConfigError`.

Pydantic's errors are translated into key paths users can grep for
(`buffer.explorer_input.eval_tasksets[0].format.prompt_key`) and plain messages: "unknown key
(did you mean 'repeat_times'?)", "'adam' is not allowed; expected one of: 'adamw'".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from trinity.config.base import annotation_at, literal_values, locate_field, strip


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
    return [_problem(err, root) for err in error.errors(include_url=False)]


def _problem(err: ErrorDetails, root: type[BaseModel]) -> Problem:
    loc, kind, value, ctx = tuple(err["loc"]), err["type"], err.get("input"), err.get("ctx") or {}
    path = format_path(loc)
    if kind == "extra_forbidden":
        ann, key = strip(annotation_at(root, loc[:-1])), str(loc[-1])
        names = [
            n for n in getattr(ann, "model_fields", {}) if n != "stage_name" or ann is not root
        ]
        return Problem(path, "unknown key", locate_field(root, key) or suggest(key, names))
    if kind == "missing":
        return Problem(path, "required key is missing")
    if kind == "literal_error" and (allowed := literal_values(annotation_at(root, loc))):
        listed = ", ".join(repr(a) for a in allowed)
        hint = suggest(str(value), [str(a) for a in allowed])
        return Problem(path, f"{value!r} is not allowed; expected one of: {listed}", hint)
    if kind == "literal_error":  # raised by a validator with its own message
        return Problem(path, err["msg"], ctx.get("did_you_mean"))
    if kind.endswith(("_type", "_parsing")) and kind.split("_")[0] in _TYPE_WORDS:
        return Problem(path, f"expected {_TYPE_WORDS[kind.split('_')[0]]}, got {_describe(value)}")
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return Problem(path, f"must be {_BOUNDS[kind]} {bound}, got {value!r}")
    if kind == "int_from_float":
        return Problem(path, f"expected an integer, got {value!r}")
    if kind == "value_error":
        return Problem(path, err["msg"].removeprefix("Value error, "))
    msg = err["msg"]  # too_short, string_too_short, ...: pydantic's own wording
    return Problem(path, msg if "got" in msg else f"{msg}, got {value!r}")
