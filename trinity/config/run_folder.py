"""What a run does when its folder (`<checkpoint_root_dir>/<project>/<name>`) already holds a run.

- `continue_from_checkpoint: false` (our default): the run gets a fresh folder and name,
  `<name>_<YYYYmmddHHMMSS>`, as Trinity-RFT does, so it never trains on a previous run's buffer
  or mixes its checkpoints and metrics with them.
- `continue_from_checkpoint: true` (Trinity-RFT's default): each stage continues from its newest
  checkpoint (weights, optimizer, scheduler, RNG, step, dataset position), a finished stage only
  re-evaluates. Built for runs whose every stage is `mode: train` from a dataset; resuming a run
  that explores is not built yet, so pre-flight refuses it on a folder that holds checkpoints or
  experiences, naming both ways out. An empty or missing folder just starts.
- `mode: bench` reads the folder it names, and the processes of a split run (`mode: explore`,
  `mode: train` from a queue) join it: neither is renamed nor refused.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from trinity.config.problems import Problem


def joins_existing_run(cfg: Any) -> bool:
    """Bench and the processes of a split run use the folder as it is."""
    eb = cfg.buffer.trainer_input.experience_buffer
    reads_queue = cfg.mode == "train" and eb is not None and eb.storage_type == "queue"
    return cfg.mode in ("bench", "explore") or reads_queue


def previous_run(run_dir: Path) -> list[str]:
    """What of a previous run the folder holds: checkpoints and experience buffers."""
    if not run_dir.is_dir():
        return []
    folders = [run_dir, *(p for p in run_dir.iterdir() if p.is_dir())]
    checkpoints = [c for d in folders for c in d.glob("global_step_*") if c.is_dir()]
    buffers = [b for d in folders for b in (d / "buffer").glob("*.db")]
    found = []
    if checkpoints:
        found.append(f"{len(checkpoints)} checkpoint(s)")
    if buffers:
        found.append(f"{len(buffers)} experience buffer(s)")
    return found


def has_content(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


def fresh_name(name: str, now: datetime | None = None) -> str:
    """`<name>_<YYYYmmddHHMMSS>`, Trinity-RFT's name for a rerun that does not continue."""
    return f"{name}_{(now or datetime.now()).strftime('%Y%m%d%H%M%S')}"


def run_folder_problems(cfg: Any, stages: list[Any], run_dir: Path) -> list[Problem]:
    """Pre-flight: `continue_from_checkpoint: true` on a folder holding a run it cannot resume.

    `stages`: the run's stage configs (`[cfg]` without stages).
    """
    if joins_existing_run(cfg) or not cfg.continue_from_checkpoint:
        return []
    found = previous_run(run_dir)
    exploring = [s.stage_name or "main" for s in stages if not _resumable(s)]
    if not found or not exploring:
        return []
    return [
        Problem(
            "continue_from_checkpoint",
            f"{run_dir} holds a previous run ({', '.join(found)}), and resuming a run that "
            f"explores (stage {', '.join(exploring)}) is not built yet; set "
            "continue_from_checkpoint: false to start a fresh folder "
            f"{run_dir.name}_<timestamp>, or choose another name",
        )
    ]


def _resumable(stage: Any) -> bool:
    """Mode train from a dataset: the trainer's checkpoint is the whole state."""
    eb = stage.buffer.trainer_input.experience_buffer
    return stage.mode == "train" and eb is not None and eb.storage_type != "queue"
