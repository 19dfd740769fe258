"""What a run does when its folder (`<checkpoint_root_dir>/<project>/<name>`) already holds a run.

- `continue_from_checkpoint: false` (our default): the run gets a fresh folder and name,
  `<name>_<YYYYmmddHHMMSS>`, as Trinity-RFT does, so it never trains on a previous run's buffer
  or mixes its checkpoints and metrics with them.
- `continue_from_checkpoint: true` (Trinity-RFT's default): the run continues in its folder.
  Each stage's trainer from its newest checkpoint (weights, optimizer, scheduler, RNG, step,
  dataset position); each explorer after its cursor in the buffer (last step written, tasks
  handed out), starting from the trainer's resumed weights; the buffer hands out again what was
  read but not checkpointed. A finished stage only evaluates again. An empty folder just starts.
- `mode: bench` reads the folder it names, and the processes of a split run (`mode: explore`,
  `mode: train` from a queue) join it: neither is renamed nor refused.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from trinity.config.buffer_schema import EXPERIENCE_STORAGES


def trains_from_queue(cfg: Any) -> bool:
    """Mode train reading an experience storage (queue, sql, or a file of experiences) that
    `mode: explore` processes of the same run fill (or filled)."""
    return cfg.mode == "train" and reads_experiences(cfg)


def reads_experiences(cfg: Any) -> bool:
    """The trainer's `experience_buffer` is an experience storage, not a dataset of rows: queue
    and sql always; `file` when the algorithm trains on rollouts (`AlgorithmSpec.use_rollout`),
    while an offline algorithm (SFT, DPO) reads a file as a dataset (`trainer/sft_data.py`). An
    unknown algorithm name counts as rollouts (the pre-flight pass reports the name)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is None or eb.storage_type not in EXPERIENCE_STORAGES:
        return False
    if eb.storage_type != "file":
        return True
    from trinity.algorithm.algorithms import known_algorithm  # only here: it imports torch

    return getattr(known_algorithm(cfg.algorithm.algorithm_type), "use_rollout", True)


def writes_experience_file(cfg: Any) -> bool:
    """The experience buffer is the `file` storage (`buffer/file_storage.py`): explorers of this
    run write it, or this train process reads it."""
    eb = cfg.buffer.trainer_input.experience_buffer
    explores = cfg.mode in ("both", "explore")
    return eb is not None and eb.storage_type == "file" and (explores or trains_from_queue(cfg))


def joins_existing_run(cfg: Any) -> bool:
    """Bench and the processes of a split run use the folder as it is."""
    return cfg.mode in ("bench", "explore", "serve") or trains_from_queue(cfg)


def has_content(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


def fresh_name(name: str, now: datetime | None = None) -> str:
    """`<name>_<YYYYmmddHHMMSS>`, Trinity-RFT's name for a rerun that does not continue."""
    return f"{name}_{(now or datetime.now()).strftime('%Y%m%d%H%M%S')}"
