"""Checkpoints as plain Hugging Face directories: `<run_dir>/global_step_N/`.

Beside the weights, `trainer_state.pt` holds what resuming needs and `transformers` ignores:
optimizer and lr-scheduler state, RNG states, the step; `buffer_leases.json` the buffer leases
its steps trained. A LoRA policy's checkpoint holds the merged model as its weights and the
adapter in peft's format in `adapter/` (`trainer/lora.py`).

Durable before acked. The trainer acks a checkpoint's leases as soon as `save_hf_checkpoint`
returns, so by then the checkpoint must survive a crash or a power loss:

1. every file is written into `.global_step_N.tmp/` and fsynced, then every folder in it;
2. `checkpoint_manifest.json` (each file's relative path and size) is written last, fsynced,
   and the folder fsynced again;
3. the folder is renamed to `global_step_N` and the parent fsynced. A folder of that name
   already there (a resumed run saving its step again) is first renamed
   `.global_step_N.old`, and deleted only once the new one is in place; a crash between the two
   renames leaves it to be renamed back (`finish_interrupted`);
4. older checkpoints beyond `keep` are renamed `.global_step_M.deleting`, then deleted, so a
   crash mid-delete never leaves a half folder under a checkpoint's name.

`latest_resumable` takes the newest checkpoint whose manifest names `trainer_state.pt` and whose
every listed file is present with its listed size; a torn one (no manifest, a file missing or
short) is passed over for the one before it. Sizes, not checksums: the files are fsynced before
the manifest exists, so what a crash can leave is a missing or short file, never a full-length
one with other bytes; reading every byte of a multi-gigabyte optimizer state again to prove it
would double the cost of a save and of a resume.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity.common.seals import sealing
from trinity.models.loading import for_safetensors

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_REPLACED = re.compile(r"^\.global_step_(\d+)\.old$")

TRAINER_STATE = "trainer_state.pt"
OPTIMIZER = "optimizer"  # a sharded trainer's optimizer state (DCP), any world size loads it
LEASES = "buffer_leases.json"
MANIFEST = "checkpoint_manifest.json"


def trained_leases(checkpoint: Path | None) -> list[int]:
    """The buffer leases a checkpoint's train steps used (none recorded: [])."""
    if checkpoint is None or not (Path(checkpoint) / LEASES).is_file():
        return []
    return [int(i) for i in json.loads((Path(checkpoint) / LEASES).read_text())]


def save_weights(model: Any, folder: Path, weights: dict[str, Any] | None = None) -> None:
    """`model`'s weights as `model.safetensors` with its `config.json` (and
    `generation_config.json`), what `save_pretrained` writes for a model in one file, read by
    `from_pretrained` unchanged: a tensor tied to an earlier one (the output embedding) is
    written once, under its first name. Tensors are written from where they are, without
    `save_pretrained`'s copy of the whole model (a second copy of the weights at the save's
    peak; docs/real_model.md); only a tensor that is not contiguous, or that shares its
    storage with another one without being it, is copied. `weights`: the tensors to write
    instead of `model.state_dict()` (a LoRA policy's merged weights, `trainer.lora.export`; a
    sharded model's, gathered: `sharding.full_state`)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(folder)
    tensors = for_safetensors(model.state_dict() if weights is None else weights)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def save_hf_checkpoint(
    model: Any,
    tokenizer: Any,
    root: Path,
    step: int,
    keep: int | None,
    trainer_state: dict[str, Any] | None = None,
    leases: list[int] | None = None,
    extra_files: Callable[[Path], dict[str, Any]] | None = None,
    weights: dict[str, Any] | None = None,
) -> Path:
    """Write `root/global_step_<step>` durably (module docstring: when this returns, it survives
    a crash and a power loss), with `trainer_state.pt` and the buffer `leases` its steps trained
    (`buffer_leases.json`) when given, and prune to the newest `keep` checkpoints.
    `extra_files(folder)` writes more files (the critic's weights) into the folder before it is
    sealed and returns state to add to `trainer_state`."""
    tmp = begin_checkpoint(root, step)
    # 1.
    save_weights(model, tmp, weights)
    tokenizer.save_pretrained(tmp)
    if extra_files is not None:
        trainer_state = {**(trainer_state or {}), **extra_files(tmp)}
    if trainer_state is not None:
        import torch  # here only: the driver lists and picks checkpoints without it

        torch.save(trainer_state, tmp / TRAINER_STATE)
    return seal_checkpoint(root, step, tmp, keep, leases)


def temp_folder(root: Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is sealed under its name."""
    return root / f".global_step_{step}.tmp"


def begin_checkpoint(root: Path, step: int) -> Path:
    """The empty folder to write checkpoint `step` into (`temp_folder`), after finishing what
    an interrupted save left under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    finish_interrupted(root)
    tmp = temp_folder(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def seal_checkpoint(
    root: Path, step: int, tmp: Path, keep: int | None, leases: list[int] | None = None
) -> Path:
    """Seal the written folder `tmp` as `root/global_step_<step>` (module docstring, steps 1 to
    4), with the buffer `leases` its steps trained, and prune to the newest `keep`."""
    final = root / f"global_step_{step}"
    if leases is not None:
        (tmp / LEASES).write_text(json.dumps(leases))
    files = _files(tmp)
    for f in files:
        _fsync_file(tmp / f)
    for d in _folders(tmp):
        _fsync_dir(d)
    # 2.
    sizes = {f: (tmp / f).stat().st_size for f in files}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": sizes}, indent=1))
    _fsync_file(tmp / MANIFEST)
    _fsync_dir(tmp)
    # 3.
    with sealing(root):
        replaced = None
        if final.exists():
            replaced = root / f".global_step_{step}.old"
            shutil.rmtree(replaced, ignore_errors=True)
            final.rename(replaced)
            _fsync_dir(root)
        tmp.rename(final)
        _fsync_dir(root)
    # 4.
    if replaced is not None:
        shutil.rmtree(replaced)
    if keep is not None and keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            _delete(old)
    return final


def is_complete(checkpoint: Path, required: tuple[str, ...] = (TRAINER_STATE,)) -> bool:
    """Whether `checkpoint` was sealed (its manifest exists and parses), its manifest names every
    file of `required`, and every file it names is there with the size it names."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        sizes = manifest["files"]
        if not isinstance(sizes, dict) or any(r not in sizes for r in required):
            return False
        for name, size in sizes.items():
            if (checkpoint / name).stat().st_size != int(size):
                return False
    except (OSError, ValueError, KeyError, TypeError):  # a file missing, a torn manifest
        return False
    return True


def checkpoint_step(checkpoint: Path) -> int:
    """N of a `global_step_N` folder (or of `.global_step_N.old`, one being replaced)."""
    m = _STEP_DIR.match(checkpoint.name) or _REPLACED.match(checkpoint.name)
    if m is None:
        raise ValueError(f"{checkpoint} is not a global_step_N checkpoint folder")
    return int(m.group(1))


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under `root`, oldest first (complete or not: `is_complete`)."""
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name)]
    return sorted(found, key=checkpoint_step)


def latest_resumable(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` holding a trainer state (`is_complete`), if
    any. Reads only (another process of the run may be saving): a `.global_step_N.old` whose
    `global_step_N` is missing (a crash between the two renames of a replacement) counts as
    step N; the trainer's next save renames it back (`finish_interrupted`)."""
    if not root.exists():
        return None
    found = list_checkpoints(root)
    steps = {checkpoint_step(c) for c in found}
    for p in root.iterdir():
        m = _REPLACED.match(p.name)
        if m is not None and checkpoint_step(p) not in steps:
            found.append(p)
    complete = sorted((c for c in found if is_complete(c)), key=checkpoint_step)
    return complete[-1] if complete else None


def finish_interrupted(root: Path) -> None:
    """Finish what a crash inside `save_hf_checkpoint` left under `root`.

    A `.global_step_N.old` folder is a checkpoint being replaced: renamed back when no
    `global_step_N` took its place, deleted when one did. Unsealed `.tmp` folders and
    half-deleted `.deleting` folders are removed.
    """
    for p in list(root.iterdir()):
        m = _REPLACED.match(p.name)
        if m is not None:
            final = root / f"global_step_{m.group(1)}"
            if final.exists():
                shutil.rmtree(p)
            else:
                p.rename(final)
                _fsync_dir(root)
        elif p.name.startswith(".global_step_") and p.name.endswith((".tmp", ".deleting")):
            shutil.rmtree(p, ignore_errors=True)


def _delete(checkpoint: Path) -> None:
    """Remove a checkpoint so that no crash leaves a part of it under its name."""
    doomed = checkpoint.with_name(f".{checkpoint.name}.deleting")
    checkpoint.rename(doomed)
    _fsync_dir(checkpoint.parent)
    shutil.rmtree(doomed)


def _files(folder: Path) -> list[str]:
    """Every file under `folder`, as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _folders(folder: Path) -> list[Path]:
    """`folder` and every folder under it, deepest first (a child's entry before its parent's)."""
    subs = [p for p in folder.rglob("*") if p.is_dir()]
    return [*sorted(subs, key=lambda p: len(p.parts), reverse=True), folder]


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make the folder's entries (names created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
