"""How an experience file holds its records: the small layer under the `file` storage's log.

    fmt = format_for(Path("/data/exp.parquet"))(Path("/data/exp.parquet"), say=print)

`file_log.FileLog` is the whole contract (row states, leases, cursors, the three-step write, the
lock, the sidecar); a `RecordFormat` only says where records are and how they are appended,
read and recovered. Which format a path is, by its name (`FORMATS`, keyed by suffix):

- `.jsonl`: one file, one `Experience.to_dict` JSON line per experience (`jsonl_format.py`);
- `.parquet`: a *folder* of Parquet parts, one part per write (`parquet_format.py`);
- any other name: a Hugging Face `datasets` save folder, read only (`datasets_format.py`).

A record is found again by its `Locator` (part, offset, length), kept per row in the sidecar's
`file_line` table: JSONL: part '' (the one file), the line's byte offset and length; Parquet: the
part's file name, the row's index in it, length 1; `datasets`: part '', the row's index, 1.

A write is three steps, the log's (`FileLog.append`): 1. the sidecar records `begin`'s marker
(what a write killed midway left: JSONL's end of file, Parquet's next part name); 2. the format
writes the records durably (`write`); 3. one sidecar transaction adds their rows and the
format's keys and clears the marker. On open, `recover(marker)` undoes a write killed between
1 and 3 (its explorer writes that step again: its cursor did not move), then `scan` returns the
records the sidecar does not know (written by another tool, or a store with no sidecar yet).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trinity.common.experience import Experience
from trinity.common.registry import Registry

Locator = tuple[str, int, int]  # (part, offset, length): module docstring
SIDECAR = ".state.db"

REQUIRED = ("tokens", "prompt_length")
"""The fields an experience cannot be read without (`Experience.from_dict`); the others default."""


@dataclass
class Found:
    """Records past what the sidecar knew, in write order, and the format's sidecar keys after
    them (only those that changed)."""

    records: list[tuple[Locator, Experience]] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)


class RecordFormat(Protocol):
    writable: ClassVar[bool]  # False: read only (a `datasets` folder)

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        """`say`: reports what opening found and did (the log's notices)."""
        ...

    def open(self) -> int:
        """Create the store when missing (a writable one); returns the descriptor the log
        locks, held until `close`."""
        ...

    def recover(self, marker: str | None, known: set[str]) -> None:
        """Undo what a write killed midway left (`marker`: its step 1, None when no write was
        in flight) and any debris of one; `known`: the parts the sidecar has rows of."""
        ...

    def scan(self, keys: Mapping[str, str], known: set[str]) -> Found:
        """The records the sidecar does not know yet (`keys`: its `buffer_state`); ValueError
        naming the place for one that is not an experience, or for a store the sidecar
        describes differently (replaced or cut by hand)."""
        ...

    def begin(self, keys: Mapping[str, str]) -> str:
        """Before a write: the marker step 1 records (and any clean-up first)."""
        ...

    def write(self, experiences: list[Experience], keys: Mapping[str, str], marker: str) -> Found:
        """Step 2: the records, durable before this returns."""
        ...

    def read(self, locators: list[Locator]) -> list[Experience]:
        """The experiences at these places, in their order."""
        ...

    def close(self) -> None: ...

    @staticmethod
    def problem(path: Path) -> str | None:
        """What `validate` says of the existing store at `path` (None: its records read as
        experiences, the first one checked as the storage reads it)."""
        ...


FORMATS: Registry[type[RecordFormat]] = Registry(
    "experience file format",
    modules={
        ".jsonl": "trinity.buffer.jsonl_format",
        ".parquet": "trinity.buffer.parquet_format",
        "datasets": "trinity.buffer.datasets_format",
    },
)


def sidecar(store: str | Path) -> Path:
    """The state database beside an experience store (file or folder): `<store>.state.db`."""
    return Path(f"{store}{SIDECAR}")


def format_for(path: Path) -> type[RecordFormat]:
    """The format of the experience store at `path`, by its suffix; any other name is a
    `datasets` save folder (read only; its own checks say when it is not one)."""
    suffix = path.suffix.lower()
    return FORMATS.get(suffix if suffix in (".jsonl", ".parquet") else "datasets")


def as_row(e: Experience) -> dict[str, Any]:
    """A columnar row (Parquet, `datasets`): `to_dict` with `info` and `metrics` as JSON text
    (free dicts: as Arrow structs, rows with different keys would come back with every key)."""
    row = e.to_dict()
    if row["action_mask"] is not None:  # a mask held as 0/1 ints reads back as bools anyway
        row["action_mask"] = [bool(x) for x in row["action_mask"]]
    row["info"] = json.dumps(row["info"])
    row["metrics"] = json.dumps(row["metrics"])
    return row


def from_row(row: dict[str, Any]) -> Experience:
    """A columnar row back: a null is an absent field (its default); `info` and `metrics` as
    JSON text or as a struct. ValueError saying why it is not an experience."""
    row = {k: v for k, v in row.items() if v is not None}
    try:
        for key in ("info", "metrics"):
            if isinstance(row.get(key), str):
                row[key] = json.loads(row[key])
        return Experience.from_dict(row)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not an experience (the columns of Experience.to_dict): {e!r}") from None


def from_rows(rows: list[dict[str, Any]], indices: list[int], where: str) -> list[Experience]:
    """Columnar rows back (`from_row`), `indices` their row numbers in `where`, which a row
    that is not an experience is named by."""
    out = []
    for i, row in zip(indices, rows, strict=True):
        try:
            out.append(from_row(row))
        except ValueError as e:
            raise ValueError(f"{where}: row {i}: {e}") from None
    return out


class FolderFormat:
    """What the folder formats share: the store is a folder, locked (and fsynced) through a
    descriptor of its own."""

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        self.folder, self.say = path, say

    def open(self) -> int:
        self._fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        return self._fd

    def close(self) -> None:
        if hasattr(self, "_fd"):
            os.close(self._fd)
            del self._fd


def missing_columns(names: list[str]) -> str | None:
    """A column set without what every experience needs, in words; None when complete."""
    missing = [c for c in REQUIRED if c not in names]
    if not missing:
        return None
    return (
        f"no column {', '.join(map(repr, missing))} (an experience has the columns of "
        f"Experience.to_dict: at least {', '.join(REQUIRED)}; has {', '.join(names) or 'none'})"
    )
