"""Read dataset rows from local files: jsonl, json, parquet, csv and `datasets` save folders.

    read_rows("data/gsm8k/train.jsonl")
    read_rows("data/gsm8k", split="test")     # a folder: datasets save dir, or test.* / test-*.*

Every row is a dict. A malformed row raises `TasksetError` naming the file and the line (jsonl,
csv) or row index (json, parquet, datasets), so a bad line in a 100k-row file is found at once.
Pass a list as `bad_rows` to collect every malformed row's message there and skip the row
instead (pre-flight reports them all; `skip_bad_rows: true` counts and drops them).
Nothing here touches the network: a hub id that is not a local path is a "not found" error.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

_JSONL = (".jsonl", ".jsonlines", ".ndjson")
_SUFFIXES = (*_JSONL, ".json", ".parquet", ".csv")
_DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


class TasksetError(ValueError):
    """A taskset that cannot be read: missing file, malformed row, missing key. `key`: the
    storage's config key the problem is reported at (pre-flight)."""

    key = "path"


def read_rows(path: str | Path, split: str = "train", subset_name: str | None = None) -> list[dict]:
    """All rows of a dataset file or folder, as dicts.

    A folder is either a `datasets.save_to_disk` folder (a DatasetDict picks `split`) or holds
    files named after the split (`test.jsonl`, `train-00000-of-00002.parquet`, also under
    `data/`); `subset_name` selects a subfolder when one exists.
    """
    return [row for row, _ in read_located_rows(path, split, subset_name)]


def read_located_rows(
    path: str | Path,
    split: str = "train",
    subset_name: str | None = None,
    bad_rows: list[str] | None = None,
) -> list[tuple[dict, str]]:
    """Like `read_rows`, each row paired with where it is: "file:line" or "file row i".

    Args:
        bad_rows: None = a malformed row raises `TasksetError`; a list = its message
            ("file:line: problem") is appended there and the row is skipped. Problems with the
            file as a whole (missing, unreadable, unsupported type) always raise.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise TasksetError(f"taskset path not found: {str(p)!r}")
    if p.is_dir():
        return _read_dir(p, split, subset_name, bad_rows)
    return _read_file(p, bad_rows)


def _bad(message: str, bad_rows: list[str] | None) -> None:
    """Raise a malformed row's `TasksetError`, or record it when collecting."""
    if bad_rows is None:
        raise TasksetError(message)
    bad_rows.append(message)


def json_object(
    text: str | bytes, loc: str, bad_rows: list[str] | None, what: str = "row"
) -> dict | None:
    """The JSON object `text` holds, or None once `_bad` has said why it is not one (invalid
    JSON, or JSON of another type; `what` names it in the message)."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        invalid = "invalid JSON" if what == "row" else f"{what} is not valid JSON"
        _bad(f"{loc}: {invalid}: {e.msg} (column {e.colno})", bad_rows)
        return None
    if not isinstance(row, dict):
        _bad(f"{loc}: {what} is a {type(row).__name__}, expected a JSON object", bad_rows)
        return None
    return row


def _checked(rows: list[Any], where: str, bad_rows: list[str] | None) -> list[tuple[dict, str]]:
    """(row, "where row i") for every row that is a dict; the others are bad rows."""
    out = []
    for i, row in enumerate(rows):
        loc = f"{where} row {i}"
        if isinstance(row, dict):
            out.append((row, loc))
        else:
            _bad(f"{loc}: row is a {type(row).__name__}, expected a JSON object", bad_rows)
    return out


def _read_dir(
    d: Path, split: str, subset_name: str | None, bad_rows: list[str] | None
) -> list[tuple[dict, str]]:
    if subset_name and (d / subset_name).is_dir():
        d = d / subset_name
    if any((d / m).is_file() for m in _DATASETS_MARKERS):
        return _read_saved_dataset(d, split, bad_rows)
    files = _split_files(d, split)
    if not files:
        found = sorted(x.name for x in d.iterdir())[:20]
        raise TasksetError(
            f"{str(d)!r}: no `datasets` save folder and no file for split {split!r} "
            f"(looked for {split}.<jsonl|json|parquet|csv>, {split}-*.*, data/{split}*); "
            f"folder holds: {found}"
        )
    rows: list[tuple[dict, str]] = []
    for f in files:
        rows.extend(_read_file(f, bad_rows))
    return rows


def _split_files(d: Path, split: str) -> list[Path]:
    found: list[Path] = []
    for base in (d, d / "data"):
        if not base.is_dir():
            continue
        for pattern in (f"{split}.*", f"{split}-*", f"{split}_*"):
            found += [f for f in sorted(base.glob(pattern)) if f.suffix in _SUFFIXES]
        if found:
            return found
    return found


def _read_saved_dataset(d: Path, split: str, bad_rows: list[str] | None) -> list[tuple[dict, str]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(d))
    except Exception as e:  # datasets raises several types; keep the path in the message
        raise TasksetError(f"{str(d)!r}: cannot load `datasets` save folder: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise TasksetError(
                f"{str(d)!r}: split {split!r} not found; available splits: {sorted(ds)}"
            )
        ds = ds[split]
    return _checked(ds.to_list(), str(d), bad_rows)


def _read_file(f: Path, bad_rows: list[str] | None = None) -> list[tuple[dict, str]]:
    suffix = f.suffix.lower()
    if suffix in _JSONL:
        return _read_jsonl(f, bad_rows)
    if suffix == ".json":
        return _read_json(f, bad_rows)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(f).to_pylist()
        except Exception as e:  # pyarrow raises ArrowInvalid & co.
            raise TasksetError(f"{str(f)!r}: cannot read parquet: {e}") from e
        return _checked(rows, str(f), bad_rows)
    if suffix == ".csv":
        with f.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            located = []
            for row in reader:
                if None in row:  # more cells than header columns
                    _bad(
                        f"{f}:{reader.line_num}: row has more cells than the header has columns",
                        bad_rows,
                    )
                    continue
                located.append((dict(row), f"{f}:{reader.line_num}"))
            return located
    raise TasksetError(
        f"{str(f)!r}: unsupported file type {suffix!r}; use one of {', '.join(_SUFFIXES)} "
        "or a `datasets` save folder"
    )


def _read_jsonl(f: Path, bad_rows: list[str] | None) -> list[tuple[dict, str]]:
    rows = []
    with f.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            loc = f"{f}:{lineno}"
            if (row := json_object(line, loc, bad_rows)) is not None:
                rows.append((row, loc))
    return rows


def _read_json(f: Path, bad_rows: list[str] | None) -> list[tuple[dict, str]]:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TasksetError(f"{f}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from e
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise TasksetError(
            f'{str(f)!r}: a .json taskset must be a list of objects or {{"data": [...]}}, '
            f"got {type(data).__name__}"
        )
    return _checked(data, str(f), bad_rows)
