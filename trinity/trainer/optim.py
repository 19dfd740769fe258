"""AdamW with warm-up and a constant, linear or cosine schedule (`algorithm.optimizer`).

Unit: the schedule counts TRAIN STEPS, not optimizer updates. The trainer calls
`scheduler.step()` once at the end of each train step, so every optimizer update inside train step
s (`trainer.ppo_epochs` x mini-batches of `trainer.ppo_mini_batch_size`) uses lr x
`lr_factor(s, ...)`, and `lr_warmup_steps` / `total_steps` mean train steps whatever the number
of updates per step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trinity.common.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:  # the schedule checks serve `validate`, which imports no torch (`common.lazy`)
    torch = lazy_module("torch")


def warmup_steps(opt_cfg: Any, total_steps: int | None) -> int:
    if opt_cfg.lr_warmup_steps >= 0:
        return int(opt_cfg.lr_warmup_steps)
    if total_steps is None and opt_cfg.lr_warmup_steps_ratio > 0:
        raise ValueError(no_budget_problem(opt_cfg))
    return int(opt_cfg.lr_warmup_steps_ratio * (total_steps or 0))


def no_budget_problem(opt_cfg: Any) -> str | None:
    """Why this schedule needs a step budget (a trainer reading a queue until its explorers
    finish has none), or None when it does not."""
    if opt_cfg.lr_scheduler_type != "constant":
        return (
            f"lr_scheduler_type {opt_cfg.lr_scheduler_type!r} decays over the run's train steps; "
            "without buffer.total_steps there are none to decay over (set it, or use constant)"
        )
    if opt_cfg.lr_warmup_steps < 0 and opt_cfg.lr_warmup_steps_ratio > 0:
        return (
            "lr_warmup_steps_ratio is a fraction of the run's train steps; without "
            "buffer.total_steps there are none (set it, or lr_warmup_steps)"
        )
    return None


def lr_factor(step: int, warmup: int, total: int, style: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr for train step `step` (0-indexed; every update of that step).

    Warm-up rises linearly from 1/warmup to 1 over train steps 0..warmup-1; then `constant` stays
    at 1, `linear` and `cosine` decay to `min_lr_ratio` at `total` (the convention of verl and
    transformers: the last train step, `total - 1`, is one decay step short of the floor).
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if style == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if style == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    if style == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler_type {style!r}; valid: constant, linear, cosine")


def _implementation(params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """AdamW's fused kernel where torch has one for these parameters (floating point, all on
    CPU or all on one accelerator type): one pass per parameter, in place. The multi-tensor
    (`foreach`) form it replaces builds temporaries the size of every parameter together, so
    its update peaks higher and runs slower (measured on SmolLM2: docs/benchmarks.md, trainer
    memory). Both compute the same update; they differ in rounding only (about 1e-7 after 50
    updates)."""
    devices = {p.device.type for p in params}
    fusable = len(devices) == 1 and devices <= {"cpu", "cuda", "xpu", "mps"}
    if fusable and all(p.is_floating_point() for p in params):
        return {"fused": True}
    return {"foreach": True}


def build_optimizer(
    model: torch.nn.Module, opt_cfg: Any, total_steps: int | None, seed: int = 0
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its lr schedule over `total_steps` TRAIN steps: step the scheduler once per train
    step, after all of that step's optimizer updates. `total_steps` None (no budget): only a
    schedule that needs none (`no_budget_problem`). `opt_cfg.state_dtype` bfloat16 stores the
    moments in bf16 (`trinity.trainer.bf16_adamw`, its rounding noise seeded by `seed`)."""
    if total_steps is None and (problem := no_budget_problem(opt_cfg)):
        raise ValueError(problem)
    params = [p for p in model.parameters() if p.requires_grad]
    hyper = {"lr": opt_cfg.lr, "betas": tuple(opt_cfg.betas), "weight_decay": opt_cfg.weight_decay}
    optimizer: torch.optim.Optimizer
    if opt_cfg.state_dtype == "bfloat16":
        from trinity.trainer.bf16_adamw import BF16StateAdamW

        optimizer = BF16StateAdamW(params, **hyper, seed=seed)
    else:
        optimizer = torch.optim.AdamW(params, **hyper, **_implementation(params))
    warmup = warmup_steps(opt_cfg, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s, warmup, total_steps or 1, opt_cfg.lr_scheduler_type, opt_cfg.min_lr_ratio
        ),
    )
    return optimizer, scheduler
