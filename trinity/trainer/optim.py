"""AdamW with warm-up and a constant, linear or cosine schedule (`algorithm.optimizer`)."""

from __future__ import annotations

import math
from typing import Any

import torch


def warmup_steps(opt_cfg: Any, total_steps: int) -> int:
    if opt_cfg.lr_warmup_steps >= 0:
        return int(opt_cfg.lr_warmup_steps)
    return int(opt_cfg.lr_warmup_steps_ratio * total_steps)


def lr_factor(step: int, warmup: int, total: int, style: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-indexed).

    Warm-up rises linearly from 1/warmup to 1; then `constant` stays at 1, `linear` and `cosine`
    decay to `min_lr_ratio` at `total`.
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


def build_optimizer(
    model: torch.nn.Module, opt_cfg: Any, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=opt_cfg.lr,
        betas=tuple(opt_cfg.betas),
        weight_decay=opt_cfg.weight_decay,
        foreach=True,
    )
    warmup = warmup_steps(opt_cfg, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s, warmup, total_steps, opt_cfg.lr_scheduler_type, opt_cfg.min_lr_ratio
        ),
    )
    return optimizer, scheduler
