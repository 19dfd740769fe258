"""Task selectors: the order in which a taskset is served, batch by batch.

    buffer.explorer_input.taskset.data_selector: {selector_type: shuffle, seed: 0}

Every selector serves `total_epochs` epochs, back to back, in batches of exactly `batch_size`
items: a batch that reaches the end of an epoch is completed from the start of the next one, so
only the very last batch of the run may be partial (`ceil(total_epochs * len(items) / batch_size)`
batches). Every step of a run therefore has the same shape: a trainer that reads
`batch_size * repeat_times` experiences per step never waits for a step that will not come (a
partial batch mid-run would make an on-policy explorer and its trainer wait for each other).
- sequential: file order, every epoch the same.
- shuffle: a new permutation each epoch, drawn from `seed` (epoch e uses the same permutation for
  the same seed, so a rerun serves the same batches).
- random: items drawn with replacement; an epoch has as many draws as there are items.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from trinity.common.registry import Registry

T = TypeVar("T")
SELECTORS: Registry[type[TaskSelector]] = Registry("task selector")


class TaskSelector:
    """Base: subclasses choose the order of one epoch's items (`epoch_order`)."""

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed

    def epoch_order(self, n: int, epoch: int) -> list[int]:
        """Indices of the items served in `epoch` (0-based)."""
        raise NotImplementedError

    def batches(
        self, tasks: Sequence[T], batch_size: int, total_epochs: int = 1
    ) -> Iterator[list[T]]:
        """Batches of `batch_size` items over `total_epochs` epochs (only the run's last is partial)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if total_epochs < 0:
            raise ValueError(f"total_epochs must be >= 0, got {total_epochs}")
        n = len(tasks)
        batch: list[T] = []
        for epoch in range(total_epochs if n else 0):
            for i in self.epoch_order(n, epoch):
                batch.append(tasks[i])
                if len(batch) == batch_size:
                    yield batch
                    batch = []
        if batch:
            yield batch


@SELECTORS.register("sequential")
class SequentialSelector(TaskSelector):
    """Tasks in file order, every epoch."""

    def epoch_order(self, n: int, epoch: int) -> list[int]:
        return list(range(n))


@SELECTORS.register("shuffle")
class ShuffleSelector(TaskSelector):
    """A new permutation of the tasks each epoch, drawn from the seed and the epoch."""

    def epoch_order(self, n: int, epoch: int) -> list[int]:
        order = list(range(n))
        random.Random(f"shuffle:{self.seed}:{epoch}").shuffle(order)
        return order


@SELECTORS.register("random")
class RandomSelector(TaskSelector):
    """Tasks drawn at random with replacement, from the seed and the epoch."""

    def epoch_order(self, n: int, epoch: int) -> list[int]:
        rng = random.Random(f"random:{self.seed}:{epoch}")
        return [rng.randrange(n) for _ in range(n)]


def make_selector(config: Any = None, default_seed: int = 0) -> TaskSelector:
    """A selector from a `data_selector` config (selector_type, seed), a name, or None.

    `default_seed` (the run's global seed) is used when the config sets no seed of its own.
    """
    if config is None:
        return SequentialSelector()
    if isinstance(config, str):
        return SELECTORS.get(config)(seed=default_seed)
    if isinstance(config, dict):
        kind, seed = config.get("selector_type", "sequential"), config.get("seed")
    else:
        kind, seed = config.selector_type, config.seed
    return SELECTORS.get(kind)(seed=default_seed if seed is None else seed)
