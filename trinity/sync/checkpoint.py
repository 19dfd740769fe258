"""`sync_method: checkpoint`: weights as a versioned safetensors file under `<run_dir>/sync/`.

Works wherever trainer and engines share a filesystem (several machines on a shared disk). The
file is written under a temporary name and renamed, so an engine never reads half a file; it is
deleted when the synchronizer drops its version. The engine half also reads a Hugging Face
checkpoint directory (every `*.safetensors` shard in it), which is how `mode: bench` loads a
run's saved checkpoints, and a peft adapter folder (a LoRA checkpoint's `adapter/`, as the
adapter payload of `models/lora_merge.py`), which is how a resumed LoRA run's engines continue.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.models import lora_merge
from trinity.sync.method import SYNC_METHOD, Peers

if TYPE_CHECKING:  # imported where tensors are handled: the synchronizer only discards
    import torch


@SYNC_METHOD.register("checkpoint")
class CheckpointSync:
    hands_over = True  # `receive` reads fresh tensors from the file: the engine may keep them
    live = False

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        from safetensors.torch import save_file

        path = Path(sync_dir) / f"weights_v{version}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        from trinity.models.loading import for_safetensors

        save_file(for_safetensors(state, keep_tied=True), str(tmp))  # every name it was given
        tmp.rename(path)
        return [str(path)]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        path = Path(payload[0])
        if not path.is_dir():
            return load_file(str(path))
        if lora_merge.is_peft_adapter(path):  # an adapter folder: merged into the engine's base
            return lora_merge.read_peft_adapter(path)
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise FileNotFoundError(f"{path}: no *.safetensors weights in this checkpoint")
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(shard)))
        return state

    def discard(self, payload: list[Any]) -> None:
        Path(payload[0]).unlink(missing_ok=True)
