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
- offline_easy2hard, difficulty_based: curricula (`trinity.tasks.curriculum`).

The explorer takes tasks one at a time from a `TaskStream` (a step takes `batch_size`, a refill
takes more) and tells an adaptive selector (`adaptive`: difficulty_based) each step's pass rates
(`feedback`); the stream's state (`state_dict`) travels with the explorer's cursor, so a
resumed explorer continues the same sequence.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from trinity.common.registry import Registry

T = TypeVar("T")
SELECTORS: Registry[type[TaskSelector]] = Registry(
    "task selector",
    modules={
        "offline_easy2hard": "trinity.tasks.curriculum",
        "difficulty_based": "trinity.tasks.curriculum",
    },
)


class TaskSelector:
    """Base: subclasses choose the order of one epoch's items (`epoch_order`), or, when
    `adaptive`, each batch as it is needed (`next_batch`), learning from `feedback`."""

    adaptive = False

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed

    def prepare(self, tasks: Sequence[Any]) -> None:
        """Read what the selector needs of the tasks (their feature columns) before serving."""

    def feedback(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Pass rates observed for the tasks at `indices` (an adaptive selector learns)."""

    def next_batch(self, n: int, batch_size: int, batch_no: int) -> list[int]:
        """An adaptive selector's batch `batch_no` of indices into n tasks."""
        raise NotImplementedError

    def batch_count(self, n: int, batch_size: int, total_epochs: int) -> int:
        """An adaptive selector's batches over the run."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What an adaptive selector has learned (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""

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
        if self.adaptive:
            raise ValueError(
                f"{type(self).__name__} learns from rollouts' pass rates: it orders an explored "
                "taskset, not a dataset the trainer reads"
            )
        self.prepare(tasks)
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
    """A selector from a `data_selector` config (selector_type, seed, feature_keys, kwargs), a
    name, or None.

    `default_seed` (the run's global seed) is used when the config sets no seed of its own.
    """
    if config is None:
        return SequentialSelector()
    if isinstance(config, str):
        return SELECTORS.get(config)(seed=default_seed)
    if not isinstance(config, dict):  # a TaskSelectorConfig, or any object with its fields
        config = {
            k: getattr(config, k, None) for k in ("selector_type", "seed", "feature_keys", "kwargs")
        }
    kind, seed = config.get("selector_type", "sequential"), config.get("seed")
    extra = dict(config.get("kwargs") or {})
    if config.get("feature_keys"):
        extra["feature_keys"] = list(config["feature_keys"])
    cls = SELECTORS.get(kind)
    try:
        return cls(seed=default_seed if seed is None else seed, **extra)
    except TypeError as e:
        raise ValueError(f"data_selector {kind!r}: {e}") from e


class TaskStream:
    """A selector's tasks one at a time over the run (`total_epochs` epochs, or, adaptive, its
    `batch_count` batches), resumable from `state_dict`: an epoch-based selector's order is a
    function of its seed, so its state is how many tasks were taken; an adaptive one's is also
    what it learned and the rest of the batch it was serving."""

    def __init__(
        self, selector: TaskSelector, tasks: Sequence[T], batch_size: int, total_epochs: int
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.selector, self.tasks = selector, tasks
        self.batch_size, self.total_epochs = batch_size, total_epochs
        self.taken = 0
        self.batch_no = 0  # adaptive: batches drawn so far
        self.pending: list[int] = []  # adaptive: the current batch's indices not yet taken
        selector.prepare(tasks)
        self._order = None if selector.adaptive else self._epoch_indices()

    def _epoch_indices(self) -> Iterator[int]:
        n = len(self.tasks)
        for epoch in range(self.total_epochs if n else 0):
            yield from self.selector.epoch_order(n, epoch)

    def __iter__(self) -> TaskStream:
        return self

    def __next__(self) -> T:
        if self._order is not None:
            i = next(self._order)
        else:
            n = len(self.tasks)
            if not self.pending:
                if self.batch_no >= self.selector.batch_count(
                    n, self.batch_size, self.total_epochs
                ):
                    raise StopIteration
                self.pending = self.selector.next_batch(n, self.batch_size, self.batch_no)
                self.batch_no += 1
            i = self.pending.pop(0)
        self.taken += 1
        return self.tasks[i]

    def feedback(self, indices: Sequence[int], values: Sequence[float]) -> None:
        self.selector.feedback(indices, values)

    def length(self) -> int:
        """Tasks the stream hands out over the run: `total_epochs` passes, or an adaptive
        selector's batches of min(batch_size, tasks) each."""
        n = len(self.tasks)
        if not self.selector.adaptive:
            return self.total_epochs * n
        return self.selector.batch_count(n, self.batch_size, self.total_epochs) * min(
            self.batch_size, n
        )

    def state_dict(self) -> dict[str, Any] | None:
        """None for an epoch-based selector (the cursor's task count is its state)."""
        if not self.selector.adaptive:
            return None
        return {"taken": self.taken, "batch_no": self.batch_no, "pending": list(self.pending),
                "selector": self.selector.state_dict()}  # fmt: skip

    def resume(self, taken: int, state: dict[str, Any] | None) -> None:
        """Continue after `taken` tasks: skip them (epoch-based), or restore `state`."""
        if not self.selector.adaptive:
            for _ in range(taken):
                next(self, None)
            return
        if state is None:
            raise ValueError(
                f"the {type(self.selector).__name__} learns from the run: resuming it needs its "
                "state at the cursor, which the buffer does not hold (a buffer written by an "
                "older version?)"
            )
        self.taken, self.batch_no = state["taken"], state["batch_no"]
        self.pending = list(state["pending"])
        self.selector.load_state_dict(state["selector"])
