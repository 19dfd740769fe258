"""The base of every config section, the key states declared on its fields, and the one walker
over the schema.

Every section rejects unknown keys (`extra="forbid"`): a typo is an error with a suggestion, not a
silently ignored setting. A number where a string is expected (`name: 2024`) is taken as a string,
because YAML and `${oc.env:...}` type them eagerly.

Key states are field metadata: a field with no marker is acted upon; otherwise

    logprobs: Annotated[int, NotBuilt("top-k logprobs", inert=(0,))]  # refused unless inert
    use_v1: Annotated[bool, NotApplicable("vLLM engine knob")]    # noted when set
    mode: Annotated[Mode, Refused(("serve",), "mode serve")]      # these values are refused
    taskset: Annotated[StorageConfig | None, Inside({"capacity": NotApplicable(...)})]

A section's marker covers the fields under it; `Inside` gives the fields of a section reused in
several places (a taskset vs. the experience buffer) their states at this place. What is done
with the states is in `support.py`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.fields import FieldInfo

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""Floating-point type of weights and activations; "auto" keeps the checkpoint's own dtype."""

DEFAULT: Any = object()  # inert value of a not-built key: the schema default


class ConfigSection(BaseModel):
    """A strict config section: unknown keys are errors; each field's docstring is its
    description (`field_description`)."""

    # no `use_attribute_docstrings`: pydantic would read every section's source as the class
    # is made, in every process that imports `trinity.config`, and finding a class's source is
    # slow once torch's many modules are loaded; descriptions are read when asked instead
    model_config = ConfigDict(
        extra="forbid",
        coerce_numbers_to_str=True,
        protected_namespaces=(),
        validate_default=False,
    )

    renamed_keys: ClassVar[dict[str, str]] = {}
    """Deprecated key -> current key of this section (see `compat.py`)."""
    renamed_values: ClassVar[dict[str, dict[str, str]]] = {}
    """Field -> {deprecated value -> current value} (see `compat.py`)."""


def field_description(cls: type[BaseModel], name: str) -> str | None:
    """A field's description: `Field(description=...)`, else the docstring under the field in
    the class that declares it (read from the source when asked, `_attribute_docstrings`)."""
    explicit = cls.model_fields[name].description
    if explicit:
        return explicit
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}):
            return _attribute_docstrings(klass).get(name)
    return None


@functools.cache
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """name -> the string literal that follows `name: T [= v]` in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a class made at run time (`create_model`) has no source
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _check_top_k(value: int) -> int:
    if value != -1 and value < 1:
        raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {value}")
    return value


TopK = Annotated[int, AfterValidator(_check_top_k)]
"""A top-k sampling cutoff: -1 (disabled) or a positive number of tokens."""


# --- key states -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NotBuilt:
    """Accepted because Trinity-RFT configs use it, but `feature` is missing here: a value other
    than `inert` (a tuple of values; default: the schema default) is refused, unless
    `unless(config)` says the config uses the part that is built."""

    feature: str
    inert: Any = DEFAULT
    unless: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class NotApplicable:
    """No effect in this build, for `reason`; noted when set. `after_first`: acted upon for the
    first item of its list, not applicable for the later ones. `unless(section)`: acted upon
    where it says so of the section that holds the key (a vLLM knob where that engine pool's
    `engine_type` is vllm)."""

    reason: str
    after_first: bool = False
    unless: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class Refused:
    """Values of the key that name a feature not built here (`feature`): refused."""

    values: tuple[Any, ...]
    feature: str


@dataclass(frozen=True)
class Inside:
    """States of fields below this one (dotted paths relative to it), at this place only."""

    states: dict[str, Any] = field(default_factory=dict)


Marker = NotBuilt | NotApplicable | Refused


# --- the schema walker ----------------------------------------------------------------------


class UnknownKey(LookupError):
    """A key that the schema does not allow at this place; `.allowed` lists what would be."""

    def __init__(self, key: str | int, allowed: Sequence[str]) -> None:
        super().__init__(key)
        self.key = key
        self.allowed = list(allowed)


class NotAContainer(LookupError):
    """A key was asked for inside a scalar, or a list was indexed with a non-number."""


def strip(annotation: Any) -> Any:
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
    ann = strip(annotation)
    if ann is Any:
        return Any
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        renamed = getattr(ann, "renamed_keys", {}).get(key)  # a deprecated spelling
        name = renamed if renamed is not None else key
        if isinstance(name, str) and name in ann.model_fields:  # with its constraints
            info = ann.model_fields[name]
            return Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
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


def walk(
    root: type[BaseModel], prefix: str = "", inside: dict[str, Any] | None = None
) -> Iterator[tuple[str, FieldInfo, tuple[Marker, ...]]]:
    """(path, field, state markers) of every field under `root`, depth first; items of lists and
    mappings are written `[*]`. The markers are those `Inside` gives the path here, else the
    field's own."""
    inside = inside or {}
    for name, info in root.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        own = tuple(m for m in info.metadata if isinstance(m, Marker))
        marks = inside.get(name, own)
        yield path, info, marks if isinstance(marks, tuple) else (marks,)
        section, suffix = strip(info.annotation), ""  # through Optional, list and dict items
        while get_origin(section) in (list, dict) and get_args(section):
            section, suffix = strip(get_args(section)[-1]), suffix + "[*]"
        if isinstance(section, type) and issubclass(section, BaseModel):
            below = {k.split(".", 1)[1]: v for k, v in inside.items() if k.startswith(name + ".")}
            for m in info.metadata:
                below |= m.states if isinstance(m, Inside) else {}
            yield from walk(section, path + suffix, below)


def locate_field(root: type[BaseModel], name: str) -> str | None:
    """The shortest dotted path under `root` to a field called `name` (None if none or tied).

    Used to suggest `algorithm.optimizer` for an `optimizer:` written at the top level.
    """
    paths = [p.replace("[*]", "") for p, _, _ in walk(root) if p.rsplit(".", 1)[-1] == name]
    depth = min((p.count(".") for p in paths), default=None)
    shortest = [p for p in paths if p.count(".") == depth]
    return shortest[0] if len(shortest) == 1 else None


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` (optionally wrapped), else None."""
    ann = strip(annotation)
    return get_args(ann) if get_origin(ann) is Literal else None
