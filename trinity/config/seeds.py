"""Where the global `seed` goes: one place that derives every random source's seed.

    seed: 3                     # top level: reaches every source below unless a section says
    model: {model_path: tiny://1m}                   # tiny model init: seed 3 (URL ?seed=N wins)
    explorer.rollout_model.seed                      # sampling keys; replica i's generator seed + i
    explorer.auxiliary_models[j].seed                # the same for auxiliary model j's engines
    buffer.explorer_input.taskset.data_selector.seed # shuffle / random task order
    buffer.explorer_input.taskset.generator_args.seed  # which synthetic problems are drawn
    # the trainer seeds torch (dropout, any sampling inside a loss) with the global seed

Selectors and generators take the global seed as their `default_seed` (`make_selector`,
`load_taskset`); engines and `tiny://` model paths get theirs from the functions below.

A section's own seed, when set, overrides the global one for that source only. Held-out splits
of synthetic generators are decided by a hash of the question, never by a seed, so a different
seed never moves a problem between train and test.
"""

from __future__ import annotations

from typing import Any

from trinity.models.loading import TINY_SCHEME, parse_tiny_url


def model_path(cfg: Any, path: str | None = None) -> str:
    """`path` (default `model.model_path`), with the global seed added to a seedless `tiny://`."""
    path = cfg.model.model_path if path is None else path
    if not path.startswith(TINY_SCHEME):
        return path
    preset, seed = parse_tiny_url(path)
    if seed is not None:
        return path
    return f"{TINY_SCHEME}{preset}?seed={cfg.seed}"


def rollout_seed(cfg: Any) -> int:
    """The seed of the explorer's sampling keys (`TaskModelHandle`): what each task samples."""
    own = cfg.explorer.rollout_model.seed
    return cfg.seed if own is None else own


def engine_seed(cfg: Any, replica: int) -> int:
    """Generator seed of rollout engine replica `replica` (0-based), for unkeyed requests."""
    return rollout_seed(cfg) + replica


def auxiliary_seed(cfg: Any, index: int) -> int:
    """The seed of `explorer.auxiliary_models[index]`: its own, else the global seed. Replica i
    of its engines seeds its generator with this + i; the keys of calls to it include it."""
    own = cfg.explorer.auxiliary_models[index].seed
    return cfg.seed if own is None else own
