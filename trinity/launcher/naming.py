"""The name (and so the folder and the actors' namespace) a run takes: its own, a fresh
`<name>_<timestamp>` beside an earlier run's folder, or the live run another process started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from trinity.buffer.file_log import sidecar
from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import run_prefix
from trinity.common.shared import RunName
from trinity.config import resolve
from trinity.config.run_folder import fresh_name, has_content, joins_existing_run
from trinity.launcher.plan import process_role


def agree_on_name(config: Any, console: Console) -> tuple[Any, Any]:
    """The run (folder and actors' namespace) a process of a split run belongs to.

    While any process of the run lives, every process joins it, whatever
    `continue_from_checkpoint` says: that is what a second process, or a crashed one started
    again alone, is for. The first process of a run decides: with `continue_from_checkpoint:
    false` on a folder of a run that ended (its trainer finished its buffer), the run is
    `<name>_<timestamp>` (as a single-process run), so it neither trains the earlier run's
    leftover experiences nor mixes groups with them; a folder whose trainer has not finished
    (explorers ran first, the trainer comes now) is this run's. Returns the config under the agreed name and the actor holding it (detach at the end).
    """
    run_dir = Path(resolve(config).run_dir)
    # a folder whose run ended (its trainer finished the buffer) is an earlier run; one whose
    # trainer has not come yet (explorers first, then the trainer) is this run
    finished = buffers_finished(config, run_dir)
    ended = bool(finished) and all(finished)
    fresh = not config.continue_from_checkpoint and has_content(run_dir) and ended
    proposal = fresh_name(config.name) if fresh else config.name
    actor = (
        ray.remote(RunName)
        .options(num_cpus=0, name="run-name", get_if_exists=True, lifetime="detached")
        .remote(proposal)
    )
    ray.get(actor.attach.remote(process_role(config)))
    name = ray.get(actor.get.remote())
    if name != config.name:
        console.print(
            f"[yellow]{run_dir} is in use by an earlier run (continue_from_checkpoint: false): "
            f"this run is named {name!r}[/]",
            soft_wrap=True,
        )
        config = config.model_copy(update={"name": name})
    return config, actor


def buffers_finished(config: Any, run_dir: Path) -> list[bool]:
    """Whether the trainer finished each experience buffer of the run in `run_dir`: the queue's
    logs (and the file storage's sidecars), and the sql storage's databases (the run folder's SQLite files, and the configured
    database's buffers of this run: `storage.run_prefix`)."""
    logs = set(run_dir.glob("**/buffer/*.db"))
    eb = config.buffer.trainer_input.experience_buffer
    if eb is not None and eb.storage_type == "file" and eb.path:  # a configured file's sidecar
        logs |= {p for p in [sidecar(Path(eb.path).expanduser().resolve())] if p.is_file()}
    flags = [SQLiteLog.run_finished(p) for p in sorted(logs)]
    databases = [str(p) for p in run_dir.glob("**/buffer/*.sqlite")]
    if eb is not None and eb.storage_type == "sql" and eb.path:
        databases.append(eb.path)
    if databases:
        from trinity.buffer.sql_inspect import buffers_finished as in_database

        for path in databases:
            flags += in_database(path, run_prefix(run_dir)).values()
    return flags


def fresh_folder_unless_continuing(config: Any, console: Console) -> Any:
    """`continue_from_checkpoint: false` on a folder in use: run as `<name>_<timestamp>`."""
    run_dir = Path(resolve(config).run_dir)
    if config.continue_from_checkpoint or joins_existing_run(config) or not has_content(run_dir):
        return config
    name = fresh_name(config.name)
    console.print(
        f"[yellow]{run_dir} is in use by an earlier run (continue_from_checkpoint: false): "
        f"this run is named {name!r}[/]",
        soft_wrap=True,
    )
    return config.model_copy(update={"name": name})
