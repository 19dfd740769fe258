"""A LoRA adapter as weights travel: the payload format, and its merge into a frozen base.

    state = adapter_state(...)           # trainer side (trinity/trainer/lora.py)
    load_weights(model, state, "v3")     # engine side: W = W0 + scaling · B·A (models/loading.py)

The format (what `Trainer.sync_state` publishes with `model.lora_configs`, through every sync
method: memory, checkpoint, nccl) is a plain name -> tensor dict:

* `lora.<module>.lora_A`: A [r, in] and `lora.<module>.lora_B`: B [out, r] of each adapted linear
  layer, `<module>` its path in the base model (`model.layers.0.self_attn.q_proj`, whose weight
  the engine calls `model.layers.0.self_attn.q_proj.weight`), in the adapter's dtype;
* `lora.scaling`: a float32 scalar, lora_alpha / lora_rank, the same for every layer.

`lora.scaling` marks a payload as an adapter. An engine keeps its base weights W0 (the weights
it held when its first adapter came, or after its last full load) and serves
W = W0 + scaling · B·A computed into weights of its own, so its forward (the lean decoder's
packed weights included) is the plain model's, and each sync rebuilds W from W0, never from the
previous W: no drift over many syncs. Cost: the adapted layers are held twice in the engine (W0
and W), against the bytes of a full sync on the wire and in the synchronizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADAPTER_DIR = "adapter"
"""A LoRA run's checkpoint subfolder holding its adapter in peft's format
(`adapter_model.safetensors` + `adapter_config.json`); the folder itself holds the merged model."""
PEFT_CONFIG = "adapter_config.json"
PREFIX = "lora."
SCALING = "lora.scaling"
_A, _B = ".lora_A", ".lora_B"
BASE_ATTR = "_trinity_lora_base"  # on the engine's model: weight name -> W0


def is_adapter(tensors: dict[str, Any]) -> bool:
    """Whether a weight payload is a LoRA adapter (it carries `lora.scaling`)."""
    return SCALING in tensors


def adapter_key(module: str, which: str) -> str:
    """The payload name of a module's A (`which` = "A") or B."""
    return f"{PREFIX}{module}{_A if which == 'A' else _B}"


def merged_weight(w0: Any, a: Any, b: Any, scaling: float) -> Any:
    """W0 + scaling · B·A, computed in float32 and returned in W0's dtype and device.
    w0: [out, in], a: [r, in], b: [out, r]. A W0 split over tensor-parallel ranks (a DTensor,
    `models.tensor_parallel`) gets this rank's slices of scaling · B·A."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        delta = b.to(w0.device, torch.float32) @ a.to(w0.device, torch.float32)  # [out, in]
        if isinstance(w0, DTensor):
            delta = distribute_tensor(delta, w0.device_mesh, w0.placements, src_data_rank=None)
        return (w0.float() + scaling * delta).to(w0.dtype)


def adapter_pairs(tensors: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """module -> (A, B) of an adapter payload. Raises ValueError on a name outside the format
    or a module with one half only."""
    halves: dict[str, dict[str, Any]] = {}
    for name, t in tensors.items():
        if name == SCALING:
            continue
        for suffix, which in ((_A, "A"), (_B, "B")):
            if name.startswith(PREFIX) and name.endswith(suffix):
                halves.setdefault(name[len(PREFIX) : -len(suffix)], {})[which] = t
                break
        else:
            raise ValueError(f"{name!r} is not a LoRA adapter tensor (lora.<module>.lora_A|B)")
    broken = sorted(m for m, h in halves.items() if len(h) != 2)
    if broken:
        raise ValueError(f"LoRA adapter: modules with only one of A and B: {broken[:5]}")
    return {m: (h["A"], h["B"]) for m, h in halves.items()}


def apply_adapter(model: Any, tensors: dict[str, Any], what: str) -> None:
    """Serve base + adapter: each adapted weight becomes W0 + scaling · B·A (a new tensor,
    assigned; W0 is kept on the model, `BASE_ATTR`). A layer adapted by an earlier payload and
    not by this one gets W0 back. Raises RuntimeError naming `what` when a module or a shape
    does not match the model."""
    scaling = float(tensors[SCALING])
    pairs = adapter_pairs(tensors)
    params = dict(model.named_parameters())
    base: dict[str, Any] = model.__dict__.setdefault(BASE_ATTR, {})
    merged = {}
    for module, (a, b) in pairs.items():
        key = f"{module}.weight"
        if key not in params:
            raise RuntimeError(f"{what}: the model has no weight {key!r} for its LoRA adapter")
        w0 = base.setdefault(key, params[key].detach())  # the first adapter: these are W0
        if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(w0.shape):
            raise RuntimeError(
                f"{what}: LoRA adapter of {module!r} has A {tuple(a.shape)}, B "
                f"{tuple(b.shape)}; its weight is {tuple(w0.shape)}"
            )
        if a.shape[0] != b.shape[1]:
            raise RuntimeError(f"{what}: LoRA adapter of {module!r}: ranks of A and B differ")
        merged[key] = merged_weight(w0, a, b, scaling)
    for key in base.keys() - merged.keys():
        merged[key] = base[key]
    model.load_state_dict(merged, strict=False, assign=True)


class BaseWeights:
    """An engine's base weights W0 by Hugging Face name, for an engine whose model holds its
    weights in a layout of its own and reloads them whole (vLLM: fused q/k/v and gate/up, and
    a reload of some weights leaves the others unusable). `merged(adapter)` is every weight to
    load: the base, with each adapted weight W0 + scaling · B·A. The base is the model folder's,
    read at the first adapter and then kept (one more copy of the weights in the engine's
    memory, the price of an exact merge), or the full weights loaded after it. Full weights
    loaded before any adapter replace the folder's without being kept (an engine not serving
    LoRA holds no second copy): an adapter after them has no base (an error says so)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder: Path | None = Path(folder)  # None: full weights replaced the folder's
        self.base: dict[str, Any] | None = None  # kept once an adapter came

    def loaded(self, tensors: dict[str, Any]) -> None:
        """Full weights were loaded: the next adapter's base (kept only while serving LoRA)."""
        if self.base is not None:
            self.base = dict(tensors)
        else:
            self.folder = None

    def merged(self, tensors: dict[str, Any], what: str) -> dict[str, Any]:
        if self.base is None:
            self.base = self._read(what)
        scaling = float(tensors[SCALING])
        out = dict(self.base)
        for module, (a, b) in adapter_pairs(tensors).items():
            key = f"{module}.weight"
            if key not in out:
                raise RuntimeError(f"{what}: the model has no weight {key!r} for its LoRA adapter")
            w0 = out[key]
            if (b.shape[0], a.shape[1]) != tuple(w0.shape) or a.shape[0] != b.shape[1]:
                raise RuntimeError(
                    f"{what}: LoRA adapter of {module!r} has A {tuple(a.shape)}, B "
                    f"{tuple(b.shape)}; its weight is {tuple(w0.shape)}"
                )
            out[key] = merged_weight(w0, a, b, scaling)
        return out

    def _read(self, what: str) -> dict[str, Any]:
        if self.folder is None:
            raise RuntimeError(
                f"{what}: a LoRA adapter after full weights were loaded: the base it adapts was "
                "not kept (a LoRA run's engines receive adapters only)"
            )
        from safetensors.torch import load_file

        out: dict[str, Any] = {}
        for f in sorted(self.folder.glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out


def forget_base(model: Any) -> None:
    """Full weights were loaded: they are the base of the next adapter."""
    model.__dict__.pop(BASE_ATTR, None)


def weights_of_checkpoint(checkpoint: Path) -> Path:
    """What engines built from a LoRA stage's start model load to continue from a checkpoint of
    it: its adapter folder (merged into their base), not its merged export (which would become
    their base, and every later adapter would be added to it a second time). Other checkpoints:
    the folder itself."""
    adapter = Path(checkpoint) / ADAPTER_DIR
    return adapter if (adapter / PEFT_CONFIG).is_file() else Path(checkpoint)


def is_peft_adapter(folder: Path) -> bool:
    return (Path(folder) / PEFT_CONFIG).is_file()


def read_peft_adapter(folder: Path) -> dict[str, Any]:
    """A peft adapter folder (`adapter_model.safetensors` + `adapter_config.json`, LoRA on
    linear layers) as a payload of this module's format. Raises ValueError for an adapter this
    format cannot carry (per-layer ranks or alphas, DoRA, biases)."""
    import torch
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / PEFT_CONFIG).read_text())
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern") or cfg.get("use_dora"):
        raise ValueError(f"{folder}: per-layer ranks or alphas, or DoRA, are not merged here")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / r**0.5 if cfg.get("use_rslora") else alpha / r
    out: dict[str, Any] = {SCALING: torch.tensor(scaling, dtype=torch.float32)}
    for name, t in load_file(str(folder / "adapter_model.safetensors")).items():
        module, _, which = name.removeprefix("base_model.model.").rpartition(".lora_")
        if which not in ("A.weight", "B.weight"):
            raise ValueError(f"{folder}: {name!r} is not a LoRA A or B weight")
        out[adapter_key(module, which[0])] = t
    return out
