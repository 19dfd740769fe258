"""Experiences as JSONL: one `Experience.to_dict` JSON line per experience, in write order.

    buffer.trainer_input.experience_buffer: {name: exp, storage_type: file, path: exp.jsonl}

The file is only ever appended to, so any tool reads it. Its sidecar keys (`record_format.py`):
`indexed`, the byte offset up to which the file's lines are rows (`lines`: how many lines that
is); a write's marker is that offset, so a write killed midway is truncated back to it on open
(said). Lines past `indexed` with no write in flight were appended by someone else (a file made
by hand or another tool, or one with no sidecar yet): indexed as pending rows. A last line with
no newline that does not parse as a JSON object is torn (a writer of another tool killed
mid-line): never read as data, reported on open, and truncated by the next write here, which
says so. (A JSON object cut short never parses, so a last line that does parse is whole, only
missing its newline.) A complete line that does not parse is an error naming its line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from trinity.buffer.record_format import FORMATS, Found, Locator, sidecar
from trinity.common.experience import Experience


def parse_line(raw: bytes) -> Experience:
    """One line of an experience file. ValueError saying why it is not one; Trinity-RFT's
    experience JSONL (its `Experience.to_dict`: text, lengths and reward, no token ids or
    logprobs) is named as such: nothing in it can be trained on."""
    try:
        row = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a JSON {type(row).__name__}, not an object")
    if "tokens" not in row and "response_length" in row:
        raise ValueError(
            "a line of Trinity-RFT's experience JSONL (text and lengths, no token ids or "
            "logprobs): it cannot be trained on; write rollouts with this trinity"
        )
    try:
        return Experience.from_dict(row)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not an experience (Experience.to_dict as JSON): {e!r}") from None


@FORMATS.register(".jsonl")
class JsonlFormat:
    writable = True

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        self.file, self.say = path, say
        self.torn = 0  # bytes of a torn last line (module docstring)

    def open(self) -> int:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.file, "ab")  # noqa: SIM115 - held open: the lock is on it
        return self._fh.fileno()

    def recover(self, marker: str | None, known: set[str]) -> None:
        if marker is None:
            return
        start, size = int(marker), self.file.stat().st_size
        if size > start:
            os.truncate(self.file, start)
            os.fsync(self._fh.fileno())
            self.say(
                f"{self.file}: a write killed before it returned left {size - start} bytes "
                f"after byte {start}: truncated (its explorer writes that step again)"
            )

    def scan(self, keys: Mapping[str, str], known: set[str]) -> Found:
        start = int(keys.get("indexed", 0))
        if (size := self.file.stat().st_size) < start:
            raise ValueError(
                f"experience file {self.file} has {size} bytes, its state {sidecar(self.file)} "
                f"records {start}: the file was replaced or cut by hand; move the state file "
                "away to read the file afresh (as new, pending experiences)"
            )
        with open(self.file, "rb") as f:
            f.seek(start)
            data = f.read()
        line_no = int(keys.get("lines", 0))
        offset, found = start, Found()
        for raw in data.split(b"\n")[:-1]:
            line_no += 1
            if raw.strip():
                found.records.append((("", offset, len(raw)), self._parse(raw, line_no)))
            offset += len(raw) + 1
        tail = data[offset - start :]
        if tail.strip():
            try:
                found.records.append((("", offset, len(tail)), parse_line(tail)))
                line_no += 1
                offset += len(tail)  # whole, only missing its newline (module docstring)
            except ValueError:
                self.torn = len(tail)
                self.say(
                    f"{self.file}: torn last line ({self.torn} bytes at byte {offset}, line "
                    f"{line_no + 1}: a writer killed mid-line) is not read; the next write "
                    "truncates it"
                )
        if found.records or offset != start:
            found.keys = {"indexed": str(offset), "lines": str(line_no)}
        return found

    def _parse(self, raw: bytes, line_no: int) -> Experience:
        try:
            return parse_line(raw)
        except ValueError as e:
            raise ValueError(f"{self.file}:{line_no}: {e}") from None

    def begin(self, keys: Mapping[str, str]) -> str:
        """Truncate a torn last line; the marker is the indexed end."""
        end = int(keys.get("indexed", 0))
        if (size := self.file.stat().st_size) > end:
            os.truncate(self.file, end)
            self.say(f"{self.file}: truncated a torn last line ({size - end} bytes at byte {end})")
            self.torn = 0
        return str(end)

    def write(self, experiences: list[Experience], keys: Mapping[str, str], marker: str) -> Found:
        end, prefix = int(marker), b""
        if end > 0:
            with open(self.file, "rb") as f:
                f.seek(end - 1)
                prefix = b"" if f.read(1) == b"\n" else b"\n"  # a last line without newline
        lines = [json.dumps(e.to_dict()).encode() for e in experiences]
        self._fh.write(prefix + b"".join(line + b"\n" for line in lines))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        offset, found = end + len(prefix), Found()
        for line, e in zip(lines, experiences, strict=True):
            found.records.append((("", offset, len(line)), e))
            offset += len(line) + 1
        found.keys = {"indexed": str(offset), "lines": str(int(keys.get("lines", 0)) + len(lines))}
        return found

    def read(self, locators: list[Locator]) -> list[Experience]:
        with open(self.file, "rb") as f:
            out = []
            for _, offset, length in locators:
                f.seek(offset)
                out.append(Experience.from_dict(json.loads(f.read(length))))
            return out

    def close(self) -> None:
        if hasattr(self, "_fh"):
            self._fh.close()

    @staticmethod
    def problem(path: Path) -> str | None:
        if path.is_dir():
            return f"{path} is a folder; an experience file is one .jsonl file"
        with open(path, "rb") as f:
            for no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                if not raw.endswith(b"\n"):
                    return None  # a last line: perhaps torn, which the storage reports, skips
                try:
                    parse_line(raw)
                except ValueError as e:
                    return f"{path}:{no}: {e}"
                return None
        return None
