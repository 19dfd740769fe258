"""Experiences in Parquet: a folder of parts, one part per write (an explorer step).

    buffer.trainer_input.experience_buffer: {name: exp, storage_type: file, path: /data/exp.parquet}

`/data/exp.parquet` is a *folder* (a Parquet file cannot be appended to): `part-000001.parquet`,
`part-000002.parquet`, ... in write order, each the rows of one write, its sidecar beside it
(`/data/exp.parquet.state.db`). Any Parquet reader takes the folder as one table
(`pyarrow.dataset.dataset(path)`, `pandas.read_parquet(path)`, `datasets`'s `parquet` builder).

Columns: the fields of `Experience.to_dict`, typed as the experience holds them so a row reads
back exactly: `tokens` list<int64> (the experience's dtype: int32 would refuse no real vocabulary
but is not what the experience holds), `prompt_length` int64, `logprobs`, `advantages`, `returns`,
`token_level_reward` list<float32> (null when unset), `action_mask` list<bool>, `reward` float64,
`eid` struct<batch, task, run, step: int64, suffix: string>, `model_version` int64, `truncated`
bool, `kind`, `prompt_text`, `response_text` string, `info` and `metrics` JSON text (free dicts:
as structs, rows with other keys would come back with them all), `topk_ids` list<list<int64>> and
`topk_logprobs` list<list<float32>> (null when not sampled). A part written by another tool needs
`tokens` and `prompt_length`; any other column it lacks, or holds null, takes its default.

A write is atomic: the part is written as `.part-NNNNNN.parquet.tmp`, fsynced, renamed to its
name and the folder fsynced, so no torn part is ever visible; its marker (`record_format.py`) is
the part's name. On open:
- a temporary part (a writer killed before the rename) is removed, and said;
- the marked part, when it exists and the sidecar has no rows of it (a writer killed after the
  rename, before its rows were committed), is removed, and said: its explorer writes that step
  again;
- a part the sidecar does not know (another tool's, with the experience's columns) is read as
  pending rows, parts in name order;
- a part the sidecar knows and the folder lost is refused (move the sidecar away to read the
  folder afresh).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trinity.buffer.record_format import (
    FORMATS,
    FolderFormat,
    Found,
    Locator,
    as_row,
    from_rows,
    missing_columns,
    sidecar,
)
from trinity.common.experience import Experience

_PART = re.compile(r"part-(\d+)\.parquet")


def schema() -> Any:
    """The Arrow schema of a part this storage writes (module docstring)."""
    import pyarrow as pa

    floats, ints = pa.list_(pa.float32()), pa.list_(pa.int64())
    eid = pa.struct([(k, pa.int64()) for k in ("batch", "task", "run", "step")])
    return pa.schema(
        [
            ("tokens", ints),
            ("prompt_length", pa.int64()),
            ("logprobs", floats),
            ("action_mask", pa.list_(pa.bool_())),
            ("reward", pa.float64()),
            ("token_level_reward", floats),
            ("advantages", floats),
            ("returns", floats),
            ("eid", pa.struct([*eid, ("suffix", pa.string())])),
            ("model_version", pa.int64()),
            ("truncated", pa.bool_()),
            ("kind", pa.string()),
            ("prompt_text", pa.string()),
            ("response_text", pa.string()),
            ("info", pa.string()),
            ("metrics", pa.string()),
            ("topk_ids", pa.list_(ints)),
            ("topk_logprobs", pa.list_(floats)),
        ]
    )


def parts(folder: Path) -> list[Path]:
    """The folder's parts in name order (hidden and `_`-prefixed files are not parts, as for
    every Parquet dataset reader)."""
    return sorted(
        p for p in folder.glob("*.parquet") if p.is_file() and not p.name.startswith((".", "_"))
    )


def experiences(part: Path, rows: list[int] | None = None) -> list[Experience]:
    """The part's experiences (`rows`: only these, in this order); ValueError naming the part
    and the row for one that is not an experience."""
    table = read_part(part)
    if rows is None:
        return from_rows(table.to_pylist(), list(range(table.num_rows)), str(part))
    return from_rows(table.take(rows).to_pylist(), rows, str(part))


def read_part(part: Path) -> Any:
    """The part's table, its columns checked; ValueError naming the part otherwise."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(part)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError & co.
        raise ValueError(f"{part}: cannot read as Parquet: {e}") from e
    if (why := missing_columns(table.column_names)) is not None:
        raise ValueError(f"{part}: {why}")
    return table


@FORMATS.register(".parquet")
class ParquetFormat(FolderFormat):
    writable = True

    def open(self) -> int:
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(
                f"{self.folder} is a file: experiences in Parquet are a folder of parts "
                f"({self.folder}/part-000001.parquet, ...); move the file into such a folder"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        return super().open()

    def recover(self, marker: str | None, known: set[str]) -> None:
        for tmp in sorted(self.folder.glob(".part-*.parquet.tmp")):
            tmp.unlink()
            self.say(
                f"{tmp}: a part a writer killed before it was complete left behind: removed "
                "(its explorer writes that step again)"
            )
        if marker is not None and marker not in known and (self.folder / marker).exists():
            (self.folder / marker).unlink()
            self.say(
                f"{self.folder / marker}: written by a write killed before it returned: "
                "removed (its explorer writes that step again)"
            )
        os.fsync(self._fd)

    def scan(self, keys: Mapping[str, str], known: set[str]) -> Found:
        names = [p.name for p in parts(self.folder)]
        if lost := sorted(known - set(names)):
            raise ValueError(
                f"experience folder {self.folder} lacks {', '.join(lost)}, which its state "
                f"{sidecar(self.folder)} has rows of: parts were removed or replaced by hand; "
                "move the state file away to read the folder afresh (as new, pending experiences)"
            )
        found = Found()
        for name in names:
            if name not in known:
                found.records += [
                    ((name, i, 1), e) for i, e in enumerate(experiences(self.folder / name))
                ]
        return found

    def begin(self, keys: Mapping[str, str]) -> str:
        """The next part's name: after the last this storage wrote and any part there."""
        taken = [int(m.group(1)) for p in parts(self.folder) if (m := _PART.fullmatch(p.name))]
        n = max([int(keys.get("next_part", 1)), *(t + 1 for t in taken)])
        return f"part-{n:06d}.parquet"

    def write(self, experiences: list[Experience], keys: Mapping[str, str], marker: str) -> Found:
        if not experiences:  # a step without experiences: no part, only its cursor
            return Found()
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([as_row(e) for e in experiences], schema=schema())
        tmp, part = self.folder / f".{marker}.tmp", self.folder / marker
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, part)
        os.fsync(self._fd)  # the rename is durable before the rows are committed
        n = int(_PART.fullmatch(marker).group(1))  # type: ignore[union-attr]
        records = [((marker, i, 1), e) for i, e in enumerate(experiences)]
        return Found(records, {"next_part": str(n + 1)})

    def read(self, locators: list[Locator]) -> list[Experience]:
        by_part: dict[str, list[int]] = {}
        for part, row, _ in locators:
            by_part.setdefault(part, []).append(row)
        got = {
            (part, row): e
            for part, rows in by_part.items()
            for row, e in zip(rows, experiences(self.folder / part, rows), strict=True)
        }
        return [got[(part, row)] for part, row, _ in locators]

    @staticmethod
    def problem(path: Path) -> str | None:
        if not path.is_dir():
            return (
                f"{path} is a file: experiences in Parquet are a folder of parts "
                f"({path}/part-000001.parquet, ...)"
            )
        found = parts(path)
        try:
            for part in found:
                _check_schema(part)
            first = next((p for p in found if read_part(p).num_rows), None)
            if first is not None:
                experiences(first, [0])
        except ValueError as e:
            return str(e)
        return None


def _check_schema(part: Path) -> None:
    """The part's columns, from its footer only (ValueError naming the part)."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(part).names
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError & co.
        raise ValueError(f"{part}: cannot read as Parquet: {e}") from e
    if (why := missing_columns(names)) is not None:
        raise ValueError(f"{part}: {why}")
