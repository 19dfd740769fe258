"""LoRA on the trainer's policy through `peft` (`model.lora_configs`, one adapter).

    model: {lora_configs: [{lora_rank: 8, lora_alpha: 16}]}   # target_modules: all-linear

`wrap` turns the loaded policy into a `peft` model: the base weights are frozen, so the
optimizer (`trainer.optim.build_optimizer` takes the parameters that need a gradient) holds
only A and B of each adapted layer, and `lora_dtype` sets their dtype. What departs from a full
fine-tune, each in one function here:

* reference model (KL, DPO): the base model is the peft model with its adapter switched off
  (`reference_weights`), as verl and Trinity-RFT do; no second copy of the weights;
* sync: `adapter_state` publishes only the adapter, in the format of `models/lora_merge.py`
  (`lora.<module>.lora_A|B` and `lora.scaling`), which the engines merge into their base;
* checkpoints (`export`): the merged model as the Hugging Face export (`model.safetensors`,
  what evaluation, `mode: bench` and the next stage load) and the adapter in peft's own format
  in `adapter/` (`adapter_model.safetensors`, `adapter_config.json`:
  `PeftModel.from_pretrained(base, "<checkpoint>/adapter")` loads it); `trainer_state.pt` holds
  the adapter's optimizer state only. Resuming loads the adapter (`load_adapter`) into a policy
  built from the stage's start model, which is its base.

Departure from peft's usual use: `lora_dropout` is 0 (Trinity-RFT has no key for it), so the
train step's logprobs of a micro-batch are those of the weights the engines serve.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from trinity.config.lora_schema import LoRAConfig
from trinity.models.basics import resolve_dtype
from trinity.models.lora_merge import ADAPTER_DIR, SCALING, adapter_key, merged_weight
from trinity.trainer.sharding import tied_names

ADAPTER_NAME = "default"  # peft's adapter name (the one `PeftModel.from_pretrained` gives)


def lora_settings(config: Any) -> LoRAConfig | None:
    """The run's one `LoRAConfig` (config checks refuse more), or None: full fine-tuning."""
    adapters = config.model.lora_configs
    return adapters[0] if adapters else None


def wrap(model: Any, settings: LoRAConfig) -> Any:
    """The policy as a peft model with a fresh adapter (B = 0: it starts as the base model).

    Raises ValueError when the targets name no layer, or a layer that is not a linear layer of
    the decoder (the engines merge adapters into linear weights only)."""
    from peft import LoraConfig, get_peft_model

    peft_config = LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        target_modules=settings.target_modules,
        exclude_modules=settings.exclude_modules,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    head = model.get_output_embeddings()
    auto = settings.lora_dtype == "auto"
    with warnings.catch_warnings():  # peft asks transformers 5 by a deprecated name
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        peft_model = get_peft_model(model, peft_config, autocast_adapter_dtype=auto)
    layers = dict(adapted_layers(peft_model))
    if not layers:
        raise ValueError(
            f"model.lora_configs: target_modules {settings.target_modules!r} match no layer"
        )
    for name, layer in layers.items():
        if not isinstance(layer.base_layer, torch.nn.Linear) or layer.base_layer is head:
            raise ValueError(
                f"model.lora_configs: {name!r} ({type(layer.base_layer).__name__}) is not a "
                "linear layer of the decoder; only those get an adapter here"
            )
    if not auto:
        dtype = resolve_dtype(settings.lora_dtype, str(next(model.parameters()).device.type))
        for layer in layers.values():
            layer.lora_A[ADAPTER_NAME].to(dtype)
            layer.lora_B[ADAPTER_NAME].to(dtype)
    return peft_model


def adapted_layers(peft_model: Any) -> Iterator[tuple[str, Any]]:
    """(path in the base model, peft LoRA layer) of every adapted layer, in module order."""
    from peft.tuners.lora import LoraLayer

    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter as a sync publishes it (`models/lora_merge.py`'s format): the live A and B
    (the sync method snapshots them) and `lora.scaling`."""
    out: dict[str, torch.Tensor] = {}
    scalings = set()
    for name, layer in adapted_layers(peft_model):
        out[adapter_key(name, "A")] = whole(layer.lora_A[ADAPTER_NAME].weight.detach())
        out[adapter_key(name, "B")] = whole(layer.lora_B[ADAPTER_NAME].weight.detach())
        scalings.add(float(layer.scaling[ADAPTER_NAME]))
    if len(scalings) != 1:
        raise RuntimeError(f"LoRA layers with different scalings {sorted(scalings)}")
    out[SCALING] = torch.tensor(scalings.pop(), dtype=torch.float32)
    return out


def merged_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict under its own names, each adapted weight merged
    (W0 + scaling · B·A): what the policy computes, as a plain transformers model."""
    layers = dict(adapted_layers(peft_model))
    tied = tied_names(peft_model.get_base_model())  # gathered, a tied tensor is a copy
    out = {}
    for name, t in peft_model.get_base_model().state_dict().items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        t = whole(t)
        if name in tied and is_sharded(peft_model):
            continue
        name = name.replace(".base_layer.", ".")
        module = name.rsplit(".", 1)[0]
        if module in layers and name.endswith(".weight"):
            layer = layers[module]
            a = whole(layer.lora_A[ADAPTER_NAME].weight)
            b = whole(layer.lora_B[ADAPTER_NAME].weight)
            t = merged_weight(t, a, b, float(layer.scaling[ADAPTER_NAME]))
        out[name] = t
    return out


def full_nbytes(peft_model: Any) -> int:
    """Bytes a sync of the full weights would move (a tied tensor once): `sync/full_bytes`."""
    base = peft_model.get_base_model()
    tied = tied_names(base)
    return sum(
        t.numel() * t.element_size()
        for k, t in base.state_dict().items()
        if ".lora_A." not in k and ".lora_B." not in k and k not in tied
    )


@contextmanager
def reference_weights(peft_model: Any) -> Iterator[None]:
    """The base model's weights for the duration: the adapter switched off (the reference)."""
    with peft_model.disable_adapter():
        yield


def save_adapter(peft_model: Any, folder: Path, write: bool = True) -> None:
    """The adapter in peft's format: `adapter_model.safetensors` + `adapter_config.json`.
    Sharded, every rank calls it (each tensor is gathered) and one writes (`write`)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(peft_model, adapter_name=ADAPTER_NAME)
    state = {k: whole(t.detach()).contiguous() for k, t in state.items()}
    if not write:
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_model.peft_config[ADAPTER_NAME].save_pretrained(str(folder))


def load_adapter(peft_model: Any, folder: Path) -> None:
    """Load an adapter `save_adapter` wrote into the policy (bit-exact). Raises RuntimeError
    when its tensors do not match the policy's adapter."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not (folder / "adapter_model.safetensors").is_file():
        raise RuntimeError(
            f"{folder.parent} holds no LoRA adapter: it was saved without model.lora_configs, "
            "so a run with them cannot continue from it"
        )
    state = load_file(str(folder / "adapter_model.safetensors"))
    if is_sharded(peft_model):  # every rank read the whole adapter: each keeps its shards
        _load_sharded_adapter(peft_model, state, folder)
        return
    want = {k for k, _ in peft_model.named_parameters() if ".lora_" in k}
    result = set_peft_model_state_dict(peft_model, state, adapter_name=ADAPTER_NAME)
    missing = sorted(k for k in result.missing_keys if k in want)
    if result.unexpected_keys or missing:
        raise RuntimeError(
            f"{folder}: adapter does not match the policy's: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )


def export(
    peft_model: Any, extra_files: Callable[[Path], dict[str, Any]] | None, write: bool = True
) -> tuple[Any, dict[str, torch.Tensor], Callable[[Path], dict[str, Any]]]:
    """What a checkpoint of a LoRA policy writes (`checkpoint.save_hf_checkpoint`'s model,
    weights and extra files): the base model's config with the merged weights, and the adapter
    in `adapter/` beside `extra_files`' own (the critic's). Sharded, every rank calls it and
    the files (gathers), and only the rank that `write`s writes them."""

    def files(folder: Path) -> dict[str, Any]:
        save_adapter(peft_model, folder / ADAPTER_DIR, write)
        return extra_files(folder) if extra_files is not None else {}

    return peft_model.get_base_model(), merged_state(peft_model), files


def whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole: a sharded one (FSDP2's DTensor) gathered from every rank (a collective
    every rank calls in the same order), any other as it is."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def is_sharded(peft_model: Any) -> bool:
    """Whether the policy's parameters are FSDP2 shards (`trainer_strategy: fsdp2`)."""
    return any(hasattr(p, "full_tensor") for p in peft_model.parameters())


def _load_sharded_adapter(peft_model: Any, state: dict[str, torch.Tensor], folder: Path) -> None:
    """`load_adapter` into shards: peft's saved names (`...lora_A.weight`) are the model's with
    the adapter's name (`...lora_A.default.weight`); each rank keeps its part of each tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    want = {k for k, _ in peft_model.named_parameters() if ".lora_" in k}
    named = {
        k.replace(".lora_A.weight", f".lora_A.{ADAPTER_NAME}.weight").replace(
            ".lora_B.weight", f".lora_B.{ADAPTER_NAME}.weight"
        ): t
        for k, t in state.items()
    }
    if set(named) != want:
        missing, unexpected = sorted(want - set(named)), sorted(set(named) - want)
        raise RuntimeError(
            f"{folder}: adapter does not match the policy's: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(peft_model, named, options=options)
