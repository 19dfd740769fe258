"""The `file` storage: experiences in a file (or folder) that an explore-only run writes and a
later train-only run reads, resuming exactly.

    buffer.trainer_input.experience_buffer: {name: exp_buffer, storage_type: file, path: exp.jsonl}

Implements `trinity.buffer.storage.ExperienceStorage` as the `queue` storage does (leases acked
after a checkpoint, cursors durable with their write, writer tokens, finish, close and linger:
the same class), over a different log: `file_log.FileLog`, the experiences in a store of one of
the formats of `record_format.py`, chosen by the path's name: `exp.jsonl`, one
`Experience.to_dict` JSON line per experience (`jsonl_format.py`); `exp.parquet`, a folder of
Parquet parts, one per write (`parquet_format.py`); any other name, a `datasets` save folder,
read only (`datasets_format.py`). A write is durable before it returns; the records' states,
the leases and the cursors are in a SQLite sidecar beside the store (`<path>.state.db`). How a
write killed midway and records added by others are handled, and why the store keeps trained
records, is in `file_log.py` and each format's module.

Departs from `queue` in one more way: the writers and their releases are in the sidecar too, so
a train-only run started after the explore-only run that wrote the file ended finds every
writer released (the buffer closed): it trains on what the file holds and ends, without a step
budget; an explorer run again reopens it, as in a live run. A read-only store (a `datasets`
folder) is closed from the start: nobody writes it, and a writer registering is refused.

Which experience buffer with `storage_type: file` is this storage: one that explorers write
(modes both and explore) or, in mode train, one read by an algorithm that trains on rollouts
(`AlgorithmSpec.use_rollout`: GRPO, PPO, ...). Mode train with an offline algorithm (SFT, DPO)
reads the same key as a dataset of rows (`trainer/sft_data.py`), as before.
"""

from __future__ import annotations

import time
from pathlib import Path

from trinity.buffer.datasets_format import READ_ONLY
from trinity.buffer.file_log import FileLog
from trinity.buffer.queue import QueueStorage
from trinity.buffer.storage import STORAGE, Cursor
from trinity.common.experience import Experience

__all__ = ["FileStorage"]


@STORAGE.register("file")
class FileStorage(QueueStorage):
    log_type = FileLog

    def __init__(
        self,
        path: str | Path | None,
        capacity: int = 10000,
        settled: list[int] = (),
        reopen: bool = False,
        name: str = "experience_buffer",
    ) -> None:
        if path is None:
            raise ValueError("storage_type file needs a file: its `path`")
        super().__init__(path, capacity, settled, reopen, name)
        assert isinstance(self.log, FileLog)
        for writer, released in self.log.writers().items():
            self._writers.add(writer)
            if released:
                self._released.add(writer)
        done = bool(self._writers) and self._released == self._writers
        if (done or not self.log.format.writable) and not self._closed:
            self._closed = True  # as `release_writer` leaves it
            self._released_at = time.monotonic()

    def _refuse_writers(self) -> None:
        """A read-only store (a `datasets` folder) refuses writers and writes, saying why."""
        assert isinstance(self.log, FileLog)
        if not self.log.format.writable:
            raise PermissionError(f"{self.log.file}: {READ_ONLY}")

    async def write(
        self, experiences: list[Experience], cursor: Cursor | None = None, token: int | None = None
    ) -> int:
        self._refuse_writers()
        return await super().write(experiences, cursor, token)

    async def register_writer(self, writer: str) -> int:
        self._refuse_writers()
        token = await super().register_writer(writer)
        self._save_writers()
        return token

    async def release_writer(self, writer: str) -> None:
        await super().release_writer(writer)
        self._save_writers()

    def _save_writers(self) -> None:
        assert isinstance(self.log, FileLog)
        self.log.set_writers({w: w in self._released for w in self._writers})

    @classmethod
    def location(cls, configured: str | None, stage_dir: Path, name: str) -> str:
        """The run's experience file: `configured` (made absolute here, in the driver: the
        storage's actor runs in another working folder), or `<stage folder>/buffer/<name>.jsonl`."""
        if configured:
            return str(Path(configured).expanduser().resolve())
        return str(stage_dir / "buffer" / f"{name}.jsonl")

    def describe(self) -> str:
        assert isinstance(self.log, FileLog)
        return f"{super().describe()}; file {self.log.file}"
