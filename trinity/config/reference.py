"""The configuration reference of `docs/configuration.md`, generated from the schema.

    text = reference_markdown()     # one Markdown table per config section
    python scripts/config_reference.py                # rewrites the docs' generated part

One table per section (the top level first, then each nested section in schema order, items of
lists and mappings written `[*]`), one row per key that holds a value: its path, type (with its
bounds), default, state and description. The state is the field's marker, else the nearest
section's above it (`base.NotBuilt`, `NotApplicable`, `Refused`; none: acted upon), read by the
schema's one walker (`base.walk`), so the page cannot disagree with what `validate` does.
`tests/test_config_reference.py` fails when the page is stale.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trinity.config.base import (
    Marker,
    NotApplicable,
    NotBuilt,
    Refused,
    field_description,
    strip,
    walk,
)
from trinity.config.schema import TrinityConfig

_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
_HEAD = "| key | type | default | state | description |\n|---|---|---|---|---|"


def _type(ann: Any) -> str:
    """A readable type: `int`, `'fixed' | 'adaptive'`, `list[str] | None`."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return _type(args[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if ann is type(None) or ann is Ellipsis:
        return "None" if ann is type(None) else "..."
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type(a) for a in args)}]"
    return getattr(ann, "__name__", str(ann).replace("typing.", ""))


def _section(info: FieldInfo) -> type[BaseModel] | None:
    """The config section a field holds, through `None`, lists and mappings (as `walk` goes)."""
    ann = strip(info.annotation)
    while get_origin(ann) in (list, dict) and get_args(ann):
        ann = strip(get_args(ann)[-1])
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _state(marks: tuple[Marker, ...]) -> str:
    """acted upon / not built: feature / not applicable: reason / refused values."""
    said = []
    for m in marks:
        if isinstance(m, NotBuilt):
            said.append(f"not built: {m.feature}")
        elif isinstance(m, NotApplicable) and m.after_first:
            said.append(f"acted upon for the first item; not applicable after it: {m.reason}")
        elif isinstance(m, NotApplicable):
            said.append(f"not applicable: {m.reason}")
        elif isinstance(m, Refused):
            values = ", ".join(f"`{v}`" for v in m.values)
            said.append(f"acted upon; refused: {values} (not built: {m.feature})")
    return "; ".join(said) or "acted upon"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(path: str, info: FieldInfo, cls: type[BaseModel], marks: tuple[Marker, ...]) -> str:
    bounds = [
        f"{s} {v}"
        for m in info.metadata
        for a, s in _BOUNDS
        if (v := getattr(m, a, None)) is not None
    ]
    kind = _type(info.annotation) + (f" ({', '.join(bounds)})" if bounds else "")
    default = info.get_default(call_default_factory=True)
    shown = "required" if default is PydanticUndefined else f"`{default!r}`"
    about = field_description(cls, path.rsplit(".", 1)[-1]) or ""
    return (
        f"| `{path}` | {_cell(kind)} | {_cell(shown)} | {_cell(_state(marks))} | {_cell(about)} |"
    )


def _above(path: str) -> list[str]:
    """The sections above a key, outermost first, as `walk` names them (`a.b[*].c`)."""
    parts = path.replace("[*]", ".[*]").split(".")
    heads = (".".join(parts[:i]) for i in range(1, len(parts)))
    return [re.sub(r"(\.\[\*\])+$", "", h).replace(".[*]", "[*]") for h in heads]


def reference_markdown() -> str:
    """Every key of the schema as Markdown: a `###` heading and a table per section."""
    classes: dict[str, type[BaseModel]] = {"": TrinityConfig}
    marked: dict[str, tuple[Marker, ...]] = {"": ()}
    rows: dict[str, list[str]] = {"": []}
    titles: dict[str, str] = {"": "Top level"}
    for path, info, marks in walk(TrinityConfig):
        above = _above(path)
        parent = above[-1] if above else ""
        marks = marks or next((marked[p] for p in reversed(above) if marked.get(p)), ())
        if (section := _section(info)) is not None:
            classes[path], marked[path], rows[path] = section, marks, []
        else:
            titles.setdefault(parent, f"`{path.rsplit('.', 1)[0]}`")
            rows[parent].append(_row(path, info, classes[parent], marks))
    tables = [f"### {titles[p]}\n\n{_HEAD}\n" + "\n".join(r) for p, r in rows.items() if r]
    return "\n\n".join(tables) + "\n"
