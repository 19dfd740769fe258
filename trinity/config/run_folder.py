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
    """Mode train reading an experience storage (queue or sql) that `mode: explore` processes of
    the same run fill."""
    eb = cfg.buffer.trainer_input.experience_buffer
    return cfg.mode == "train" and eb is not None and eb.storage_type in EXPERIENCE_STORAGES


def joins_existing_run(cfg: Any) -> bool:
    """Bench and the processes of a split run use the folder as it is."""
    return cfg.mode in ("bench", "explore", "serve") or trains_from_queue(cfg)


def has_content(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(run_dir.iterdir())


def fresh_name(name: str, now: datetime | None = None) -> str:
    """`<name>_<YYYYmmddHHMMSS>`, Trinity-RFT's name for a rerun that does not continue."""
    return f"{name}_{(now or datetime.now()).strftime('%Y%m%d%H%M%S')}"
