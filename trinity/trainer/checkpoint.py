"""Checkpoints as plain Hugging Face directories: `<run_dir>/global_step_N/`.

Beside the weights, `trainer_state.pt` holds what resuming needs and `transformers` ignores:
optimizer and lr-scheduler state, RNG states, the step.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^global_step_(\d+)$")


TRAINER_STATE = "trainer_state.pt"
LEASES = "buffer_leases.json"


def trained_leases(checkpoint: Path | None) -> list[int]:
    """The buffer leases a checkpoint's train steps used (none recorded: [])."""
    if checkpoint is None or not (Path(checkpoint) / LEASES).is_file():
        return []
    return [int(i) for i in json.loads((Path(checkpoint) / LEASES).read_text())]


def save_hf_checkpoint(
    model: Any,
    tokenizer: Any,
    root: Path,
    step: int,
    keep: int | None,
    trainer_state: dict[str, Any] | None = None,
    leases: list[int] | None = None,
    extra_files: Callable[[Path], dict[str, Any]] | None = None,
) -> Path:
    """Write `root/global_step_<step>` atomically (with `trainer_state.pt` and the buffer
    `leases` its steps trained, `buffer_leases.json`, when given) and prune to the newest `keep`
    checkpoints. `extra_files(folder)` writes more files (the critic's weights) into the folder
    before it is renamed into place and returns state to add to `trainer_state`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    tmp = root / f".global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if extra_files is not None:
        trainer_state = {**(trainer_state or {}), **extra_files(tmp)}
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_STATE)
    if leases is not None:
        (tmp / LEASES).write_text(json.dumps(leases))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep is not None and keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    return final


def checkpoint_step(checkpoint: Path) -> int:
    """N of a `global_step_N` folder."""
    m = _STEP_DIR.match(checkpoint.name)
    if m is None:
        raise ValueError(f"{checkpoint} is not a global_step_N checkpoint folder")
    return int(m.group(1))


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under `root`, oldest first."""
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name)]
    return sorted(found, key=checkpoint_step)


def latest_resumable(root: Path) -> Path | None:
    """The newest checkpoint under `root` that holds a trainer state, if any."""
    found = [c for c in list_checkpoints(root) if (c / TRAINER_STATE).is_file()]
    return found[-1] if found else None
