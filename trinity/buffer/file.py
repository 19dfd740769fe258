"""The `file` storage: an explore-only run writes its experiences to a JSONL file that a later
`mode: train` run reads.

    # run 1                                            # run 2, later, anywhere
    mode: explore                                      mode: train
    buffer.trainer_input.experience_buffer:            buffer.trainer_input.experience_buffer:
      {name: exp, storage_type: file, path: x.jsonl}     {name: exp, storage_type: file, path: x.jsonl}

One line per experience (`Experience.to_dict`, tensors as lists), appended with the step's writer
cursor: a write is durable (flushed and fsynced) before the step counts as explored, and the
sidecar `<file>.state.json` (replaced atomically after each write) records the committed size and
each explorer's cursor (step, tasks handed out, the step's metrics, its selector's state). So an
explore-only run that is restarted continues after exactly the steps in the file, and bytes
past the committed size are a torn last write of a killed process: the writer cuts them off
(saying so), the reader (`read_experiences`) never parses them.

The file is not a queue: nothing reads it while it is written. A run that explores and trains
at once uses `queue` or `sql` (`trinity validate` says so); the train-only run reads the file as
a dataset of experiences, and resumes from its checkpoint at the batch it had reached.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from trinity.buffer.storage import STORAGE, BufferClosed, Cursor, Lease, Superseded
from trinity.common.experience import Experience
from trinity.common.shared import RefCounted

__all__ = ["FileStorage", "TornTail", "read_experiences"]

NOT_A_QUEUE = (
    "storage_type file is written by `mode: explore` and read by a later `mode: train` run; "
    "nothing reads it while it is written (use queue or sql to explore and train at once)"
)


class TornTail(ValueError):
    """The file ends in a line a killed writer did not finish."""


def state_path(path: Path) -> Path:
    return path.with_name(path.name + ".state.json")


def _load_state(path: Path) -> dict[str, Any]:
    side = state_path(path)
    if side.exists():
        return json.loads(side.read_text())
    return {"size": 0, "written": 0, "cursors": {}}


def _save_state(path: Path, state: dict[str, Any]) -> None:
    side = state_path(path)
    tmp = side.with_name(side.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, side)


@STORAGE.register("file")
class FileStorage(RefCounted):
    def __init__(
        self,
        path: str | Path | None,
        capacity: int = 10000,
        settled: list[int] = (),
        reopen: bool = False,
        name: str = "experience_buffer",
    ) -> None:
        """`path`: the JSONL file (created with its folder); `capacity`, `settled` and `reopen`
        are a queue's (nothing is held or leased here)."""
        if path is None:
            raise ValueError("storage_type file needs a path: the JSONL file to write")
        self.path, self.name = Path(path), name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state = _load_state(self.path)
        self.torn = self._cut_torn_tail()
        self._lock = asyncio.Lock()
        self._tokens: dict[str, int] = {}
        self._released: set[str] = set()
        self._closed = False

    @classmethod
    def location(cls, configured: str | None, stage_dir: Path, name: str) -> str:
        """The configured file, or `<run folder>/buffer/<name>.jsonl`."""
        return str(
            Path(configured).absolute() if configured else stage_dir / "buffer" / f"{name}.jsonl"
        )

    def _cut_torn_tail(self) -> int:
        """Bytes past the committed size (a write its process did not finish) cut off; a file
        shorter than the committed size is refused (someone else changed it)."""
        size = self.path.stat().st_size if self.path.exists() else 0
        committed = int(self.state["size"])
        if size < committed:
            raise ValueError(
                f"{self.path} holds {size} bytes, fewer than the {committed} its state file "
                f"({state_path(self.path).name}) recorded: it was changed by something else"
            )
        if size > committed:
            with open(self.path, "r+b") as f:
                f.truncate(committed)
                f.flush()
                os.fsync(f.fileno())
            print(
                f"buffer {self.name}: cut a torn last write of {size - committed} bytes off "
                f"{self.path} (its writer was killed mid-write; its step is explored again)",
                flush=True,
            )
        return size - committed

    # -- writing -----------------------------------------------------------------------------

    async def write(
        self, experiences: list[Experience], cursor: Cursor | None = None, token: int | None = None
    ) -> int:
        """Append durably, then move the writer's cursor (the sidecar, atomically). Returns 0:
        nothing waits to be read here."""
        async with self._lock:
            if (
                token is not None
                and cursor is not None
                and self._tokens.get(cursor.explorer) != token
            ):
                raise Superseded(f"explorer {cursor.explorer!r} was started again")
            if self._closed:
                raise BufferClosed("write to a closed buffer")
            data = "".join(
                json.dumps(e.to_dict(), separators=(",", ":")) + "\n" for e in experiences
            ).encode()
            await asyncio.to_thread(self._append, data, len(experiences), cursor)
            return 0

    def _append(self, data: bytes, n: int, cursor: Cursor | None) -> None:
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        state = dict(self.state, size=self.state["size"] + len(data))
        state["written"] = self.state["written"] + n
        if cursor is not None:
            state["cursors"] = {
                **self.state["cursors"],
                cursor.explorer: {"step": cursor.step, "tasks": cursor.tasks,
                                  "metrics": cursor.metrics, "selector": cursor.selector},
            }  # fmt: skip
        _save_state(self.path, state)
        self.state = state

    async def cursor(self, explorer: str) -> Cursor | None:
        c = self.state["cursors"].get(explorer)
        if c is None:
            return None
        return Cursor(explorer, c["step"], c["tasks"], c["metrics"], c["selector"])

    async def register_writer(self, writer: str) -> int:
        self._tokens[writer] = self._tokens.get(writer, 0) + 1
        self._released.discard(writer)
        self._closed = False
        return self._tokens[writer]

    async def release_writer(self, writer: str) -> None:
        if writer not in self._tokens:
            raise ValueError(f"writer {writer!r} was never registered with this buffer")
        self._released.add(writer)
        self._closed = self._released >= set(self._tokens)

    async def close(self) -> None:
        self._closed = True

    async def finish(self) -> int:
        self._closed = True
        return 0

    def lingering(self) -> bool:
        return False

    # -- not a queue -------------------------------------------------------------------------

    async def read(self, n: int, *args: Any, **kwargs: Any) -> Lease:
        raise TypeError(NOT_A_QUEUE)

    async def ack(self, lease_ids: list[int]) -> None:
        raise TypeError(NOT_A_QUEUE)

    async def reader_started(self, settled: list[int] = ()) -> dict[str, int]:
        raise TypeError(NOT_A_QUEUE)

    # -- state -------------------------------------------------------------------------------

    def describe(self) -> str:
        writing = sorted(set(self._tokens) - self._released)
        return (
            f"{self.state['written']} experiences in {self.path}; explorers writing: "
            f"{', '.join(writing) or 'none'}"
        )

    async def stats(self) -> dict[str, int]:
        """written (the file's experiences); the rest are a later train run's to count."""
        return {"written": int(self.state["written"]), "torn_bytes_cut": self.torn}


def read_experiences(path: str | Path) -> list[Experience]:
    """The experiences of a file the `file` storage wrote, in write order. Only its committed
    bytes are read (the sidecar's size; without a sidecar, every complete line): a torn last
    line is never parsed. TornTail for an unfinished line without a sidecar, ValueError naming
    the line of any other bad one."""
    path = Path(path)
    side = state_path(path)
    data = path.read_bytes()
    if side.exists():
        data = data[: int(json.loads(side.read_text())["size"])]
    elif data and not data.endswith(b"\n"):
        raise TornTail(
            f"{path}: the last line is unfinished (its writer was killed mid-write) and there is "
            f"no {side.name} to say where the complete writes end"
        )
    out = []
    for i, line in enumerate(data.splitlines(), start=1):
        try:
            out.append(Experience.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not an experience line ({e})") from None
    return out


def is_experience_file(path: str | Path) -> bool:
    """Was `path` written by the `file` storage (its sidecar, or a first line of an experience)?"""
    path = Path(path)
    if state_path(path).exists():
        return True
    if not path.is_file() or path.suffix != ".jsonl":
        return False
    with open(path, "rb") as f:
        first = f.readline()
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and "tokens" in row and "prompt_length" in row
