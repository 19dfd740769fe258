"""`model.lora_configs`: train a LoRA adapter on the frozen policy instead of every weight.

    model:
      lora_configs: [{lora_rank: 8, lora_alpha: 16, target_modules: all-linear}]

Trinity-RFT's keys. One adapter is trained (as upstream, which refuses more than one); the
trainer wraps the policy with `peft` (trinity/trainer/lora.py), syncs only the adapter, and the
engines merge it into their frozen base (trinity/models/lora_merge.py). docs/lora.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trinity.config.base import ConfigSection, Dtype, NotApplicable, NotBuilt


class LoRAConfig(ConfigSection):
    """One LoRA adapter of the policy (Trinity-RFT's `LoRAConfig` keys)."""

    name: Annotated[
        str | None,
        NotApplicable(
            "the adapter's name in vLLM's LoRA requests; the transformers engine serves the "
            "adapter merged into the rollout model"
        ),
    ] = None
    """Name of the adapter (vLLM's LoRA request name)."""
    path: Annotated[
        str | None, NotBuilt("starting from a saved LoRA adapter (a fresh adapter is trained)")
    ] = None
    """A saved peft adapter folder to start training from; None = a fresh adapter (B = 0, so the
    first rollouts are the base model's)."""
    base_model_name: Annotated[
        str | None,
        NotApplicable("vLLM's name of the base model an adapter is served beside"),
    ] = None
    """Name of the base model the adapter is served beside (vLLM)."""
    lora_rank: int = Field(32, ge=1)
    """Rank r of the adapter: each adapted weight W [out, in] gets B [out, r] and A [r, in]."""
    lora_alpha: int = Field(32, gt=0)
    """Scaling numerator: the adapter adds (lora_alpha / lora_rank) · B·A to W."""
    lora_dtype: Dtype = "auto"
    """Dtype of the adapter's weights (and of its optimizer state); "auto" = peft's choice:
    float32 under a bfloat16/float16 model, else the model's dtype."""
    target_modules: str | list[str] = "all-linear"
    """Linear layers that get an adapter, as peft matches them: module names (suffixes such as
    q_proj) or "all-linear" (every linear layer but the output head). Embeddings and the output
    head are not adapted here."""
    exclude_modules: str | list[str] | None = None
    """Module names (or a regex) left without an adapter among the targets; None = none."""
