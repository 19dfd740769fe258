"""The KL reward penalty's coefficient over training: fixed, or adapted toward a target KL.

algorithm:
  kl_penalty_fn: k1
  kl_penalty_fn_args: {kl_coef: 0.01}           # the starting β
  kl_ctrl: {type: adaptive, target_kl: 0.1, horizon: 10000}
"""

from __future__ import annotations


class AdaptiveKLController:
    """Ziegler et al.'s proportional controller of β.

        e    = clip(KL / KL_target - 1, -0.2, 0.2)
        β   ← β · (1 + e · n / horizon)          n: samples in the step

    β grows while the measured KL exceeds the target and shrinks below it, by at most 20% per
    `horizon` samples. Paper: "Fine-Tuning Language Models from Human Preferences"
    (arXiv:1909.08593), §2.2; verl's `AdaptiveKLController`.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(
                "adaptive KL needs kl_coef >= 0, target_kl > 0 and horizon > 0, got "
                f"{init_kl_coef}, {target_kl}, {horizon}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
