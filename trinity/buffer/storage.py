"""The experience-storage contract: how explorers hand experiences to a trainer, exactly once.

    buffer.trainer_input.experience_buffer: {name: exp_buffer, storage_type: queue}

`ExperienceStorage` is a Protocol and `STORAGE` its registry keyed by `storage_type` (`queue`:
`queue.py`, `sql`: `sql.py`, `file`: `file_storage.py`); a storage is built as
`cls(path, capacity, settled, reopen, name)` (`path`: where it is durable, `cls.location(config path, stage folder, name)`, or None for memory
only; `settled`: leases a resumed trainer's checkpoint recorded as trained; `name`: the buffer's
name in its store) and runs as a named Ray actor, so explorers and trainers in other processes
meet in it.

Exactly once. `read` hands experiences out under a *lease*; the trainer `ack`s a lease only once
the train step that used it is durably checkpointed. A lease never acked (the trainer crashed
between reading and its next checkpoint) is handed out again after a restart, and a rolled-back
trainer retrains it from that checkpoint: nothing is lost, nothing is trained twice. A checkpoint
records its leases too, so a crash between writing it and the ack loses the ack, not the fact
(`settled`).

Resuming. A write carries the explorer's cursor (`Cursor`) and a durable storage keeps it with
the experiences, so a restarted explorer continues after exactly what the storage holds. The
cursor also carries the step's metrics report: stored in the same transaction, it is the record
of a step whose experiences are in the storage even when the explorer's process died before it
reported the step (the restarted explorer reports it again, `Explorer.run`, and the monitor
writes a report it already holds only once, `Monitor.add(replay=True)`).

Ending: one rule for every topology. The trainer's step budget, when it has one, ends the run:
it calls `finish()`, writing ends for good (a blocked or later write raises `BufferClosed`, so
each explorer stops cleanly) and what is still pending is dropped, counted. Without a budget,
every registered writer having finished ends it: each writer (explorer) `register_writer`s
itself and `release_writer`s when done, the storage closes when every registered writer has
released it, and the reader drains what is left and sees `BufferClosed`. A reader with a budget
in a split run `linger`s when every writer has released, for an explorer started later.
A writer that registers again (a restarted explore process) undoes its release, reopening a
storage its release had closed; `close()` ends writing for good.

Restarts. A role restarted alone rejoins the live storage: `reader_started` (a trainer) hands
every lease its dead predecessor had not acked out again (after acking the ones its checkpoint
settled); `register_writer` (an explorer) supersedes its dead predecessor. Either returns a
token that the new process's calls carry, so a call of the dead process still waiting inside
the actor raises `Superseded` instead of taking or writing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trinity.common.experience import Experience
from trinity.common.registry import Registry


class BufferClosed(Exception):
    """Raised by `read` when every writer is done and nothing is left, and by `write` once the
    trainer has finished (`finish`)."""


class Superseded(Exception):
    """A call of a reader or writer whose process was since started again under its role: the
    dead process's call must not take or write anything."""


@dataclass
class Lease:
    """Experiences handed to one reader; `ack([id])` once their train step is checkpointed."""

    id: int
    experiences: list[Experience]


@dataclass(frozen=True)
class Cursor:
    """Where an explorer stands: its last explore step written, and the tasks its task stream
    had handed out by then (a step's failed tasks are replaced, so not `step * batch_size`);
    `metrics`: that step's metrics report (durable with the step, module docstring);
    `selector`: what an adaptive task selector had learned by then (`TaskStream.state_dict`,
    JSON), so a resumed explorer selects as the uninterrupted one would."""

    explorer: str
    step: int
    tasks: int
    metrics: dict[str, float] | None = None
    selector: dict[str, Any] | None = None


@runtime_checkable
class ExperienceStorage(Protocol):
    async def write(
        self, experiences: list[Experience], cursor: Cursor | None = None, token: int | None = None
    ) -> int:
        """Append (blocking while at capacity), durably together with the writer's `cursor`;
        returns the number waiting to be read. `token`: from `register_writer`."""
        ...

    async def cursor(self, explorer: str) -> Cursor | None:
        """The explorer's cursor as of its last write (None: it never wrote)."""
        ...

    async def read(
        self,
        n: int,
        timeout: float | None = None,
        min_version: int | None = None,
        linger: float = 0.0,
        reader: int | None = None,
    ) -> Lease:
        """The next `n` experiences under a new lease (fewer only once writers are done).
        `reader`: the token from `reader_started`."""
        ...

    async def ack(self, lease_ids: list[int]) -> None:
        """The train steps that used these leases are durably checkpointed: consumed for good."""
        ...

    async def reader_started(self, settled: list[int] = ()) -> dict[str, int]:
        """A trainer (re)starts: settle its checkpoint's leases, hand the others out again;
        returns {"reader": token, "returned": count}."""
        ...

    async def register_writer(self, writer: str) -> int:
        """`writer` writes from now on (again, when it had released: see Ending above);
        returns the token its writes carry."""
        ...

    async def release_writer(self, writer: str) -> None:
        """`writer` is done; when every registered writer is, the storage closes."""
        ...

    async def close(self) -> None:
        """End writing now, whoever is registered."""
        ...

    async def finish(self) -> int:
        """The trainer reached its step budget: end writing for good, drop what is pending."""
        ...

    def lingering(self) -> bool:
        """Every writer has released, the storage is not finished: a `linger` may still end."""
        ...

    def describe(self) -> str:
        """The storage's state in words, for messages of whoever waits on it."""
        ...

    async def stats(self) -> dict[str, int]:
        """Counts: written, trained, pending, leased, dropped, trained_twice."""
        ...


STORAGE: Registry[type] = Registry(
    "storage_type",
    modules={
        "queue": "trinity.buffer.queue",
        "sql": "trinity.buffer.sql",
        "file": "trinity.buffer.file_storage",
    },
)


def store_name(run_dir: str | Path, stage_dir: str | Path, buffer: str) -> str:
    """A run's buffer's name in its store: `<project>/<run>[/<stage>]/<buffer>` (`run_dir` is
    `<checkpoint_root_dir>/<project>/<run>`), so the runs and stages that share a database (sql
    storage on one PostgreSQL server) keep their rows apart, and a rerun under a fresh name starts
    empty. `run_prefix(run_dir)` begins the name of each of the run's buffers."""
    run_dir, stage_dir = Path(run_dir), Path(stage_dir)
    try:
        stage = stage_dir.relative_to(run_dir).parts
    except ValueError:  # a stage folder outside the run folder: named by its own folder
        stage = (stage_dir.name,)
    return run_prefix(run_dir) + "/".join([*stage, buffer])


def run_prefix(run_dir: str | Path) -> str:
    """`<project>/<run>/`: what the store names of a run's buffers begin with."""
    return f"{Path(run_dir).parent.name}/{Path(run_dir).name}/"


def storage_class(storage_type: str, replay: bool = False) -> type:
    """The registered storage class for `storage_type` (importing its module on first use).
    `replay`: the storage must reuse by priority (`replay.py`); a queue then is the sql storage
    on a SQLite file in the run folder, which keeps priorities, use counts and cooldowns
    durable (the queue's in-memory FIFO has none)."""
    if replay and storage_type == "queue":
        storage_type = "sql"
    return STORAGE.get(storage_type)
