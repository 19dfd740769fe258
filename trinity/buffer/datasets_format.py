"""Experiences in a Hugging Face `datasets` save folder (`Dataset.save_to_disk`), read only.

    buffer.trainer_input.experience_buffer: {name: exp, storage_type: file, path: /data/exp_ds}

For a train-only run on experiences kept as a `datasets` folder: each row is one experience, with
the columns of a Parquet part (`parquet_format.py`; at least `tokens` and `prompt_length`), e.g.
made from an explore run's Parquet folder:

    Dataset.from_parquet("/data/exp.parquet/*.parquet").save_to_disk("/data/exp_ds")

Every row is a pending experience when the folder is first opened; their states, leases and the
trainer's progress live in the sidecar beside it (`/data/exp_ds.state.db`), as for the other
formats, so a killed train run resumes exactly. The folder itself is never written: an explorer
writing to it is refused (`validate` says so for modes both and explore). A folder of several
splits (`DatasetDict`) is refused naming them: point `path` at one split's folder. Rows past
those indexed (the folder saved again, larger) are indexed as pending; a folder with fewer rows
than indexed is refused (replaced).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trinity.buffer.record_format import (
    FORMATS,
    FolderFormat,
    Found,
    Locator,
    from_rows,
    missing_columns,
    sidecar,
)
from trinity.common.experience import Experience

READ_ONLY = (
    "a `datasets` save folder is read only as an experience buffer: explorers write a .jsonl "
    "file or a .parquet folder"
)


def load(folder: Path) -> Any:
    """The folder's `Dataset`; ValueError saying why it is not one experience dataset."""
    import datasets

    if not folder.is_dir():
        raise ValueError(
            f"{folder}: an experience store is a .jsonl file, a .parquet folder of parts, or a "
            "`datasets` save folder (Dataset.save_to_disk)"
        )
    try:
        ds = datasets.load_from_disk(str(folder))
    except Exception as e:  # datasets raises several types; keep the path in the message
        raise ValueError(f"{folder}: not a `datasets` save folder ({e})") from e
    if isinstance(ds, datasets.DatasetDict):
        raise ValueError(
            f"{folder} holds the splits {', '.join(sorted(ds))}: point path at one split's "
            f"folder (e.g. {folder / sorted(ds)[0]})"
        )
    if (why := missing_columns(ds.column_names)) is not None:
        raise ValueError(f"{folder}: {why}")
    return ds


def rows(ds: Any, indices: list[int], where: str) -> list[Experience]:
    """The experiences at these row indices; ValueError naming the row for one that is not."""
    return from_rows(ds.select(indices).to_list(), indices, where)


@FORMATS.register("datasets")
class DatasetsFormat(FolderFormat):
    writable = False

    def open(self) -> int:
        self.ds = load(self.folder)
        return super().open()

    def recover(self, marker: str | None, known: set[str]) -> None:
        """Nothing to undo: nothing is ever written here."""

    def scan(self, keys: Mapping[str, str], known: set[str]) -> Found:
        start, n = int(keys.get("indexed", 0)), len(self.ds)
        if n < start:
            raise ValueError(
                f"experience folder {self.folder} has {n} rows, its state {sidecar(self.folder)} "
                f"records {start}: the folder was replaced; move the state file away to read it "
                "afresh (as new, pending experiences)"
            )
        if n == start:
            return Found()
        new = list(range(start, n))
        found = rows(self.ds, new, str(self.folder))
        return Found(
            [(("", i, 1), e) for i, e in zip(new, found, strict=True)], {"indexed": str(n)}
        )

    def begin(self, keys: Mapping[str, str]) -> str:
        raise PermissionError(f"{self.folder}: {READ_ONLY}")

    def write(self, experiences: list[Experience], keys: Mapping[str, str], marker: str) -> Found:
        raise PermissionError(f"{self.folder}: {READ_ONLY}")

    def read(self, locators: list[Locator]) -> list[Experience]:
        return rows(self.ds, [i for _, i, _ in locators], str(self.folder))

    @staticmethod
    def problem(path: Path) -> str | None:
        try:
            ds = load(path)
            if len(ds):
                rows(ds, [0], str(path))
        except ValueError as e:
            return str(e)
        return None
