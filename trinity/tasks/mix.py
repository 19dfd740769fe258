"""Several training tasksets mixed by ratio into one task stream (`buffer.explorer_input.tasksets`).

    buffer.explorer_input:
      tasksets: [{name: math, path: data/math}, {name: code, path: data/code}]
      taskset_ratios: [3, 1]        # ours; unset = in proportion to the sets' sizes

Each set keeps its own selector (its `data_selector`: a curriculum per set) in a `TaskStream` of
its own; the mix decides, slot by slot, which set the next task comes from. The slots are dealt
by smooth weighted round-robin: every set i holds a credit c_i (0 at the start); for each slot
every credit grows by the set's weight w_i, the set with the largest credit (ties: the earlier
set) gives the slot's task, and its credit drops by W = sum(w). Over any run of slots each set
has given within one task of its share (slots x w_i / W), and with whole-number weights exactly
w_i tasks of every W consecutive slots. So every explore step of `batch_size` tasks holds the
sets in the ratio, as nearly as its size allows, and the mix is a function of the weights alone
(the sets' selectors draw from their seeds): the same config deals the same steps.

Unset `taskset_ratios` weighs each set by its size, as Trinity-RFT's `TasksetScheduler` does.
Trinity-RFT deals the sets' slots of an epoch in a random order (seeded by the epoch); here they
are interleaved evenly, so each step's share of each set is the same up to one task rather than
varying by chance from step to step (less variance in what a train step sees, the same share).

The mix ends at its first slot whose set has run out of its `total_epochs` passes ("first
exhausted", as `datasets.interleave_datasets`' default): with weights in proportion to the sizes
every set runs out at the same slot, and every task of every epoch is served.

Its state (`state_dict`, kept in the explorer's cursor) is each set's count of tasks taken and
selector state and the credits, so a resumed explorer continues the same deal bit-exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trinity.tasks.selector import TaskStream


class TaskMix:
    """The tasks of several `TaskStream`s, dealt by `weights` (module docstring). Iterates like a
    TaskStream; `feedback` takes indices into the sets' tasks laid end to end (`tasks`)."""

    def __init__(self, streams: Sequence[TaskStream], weights: Sequence[float]) -> None:
        if len(streams) != len(weights) or not streams:
            raise ValueError(f"{len(streams)} tasksets and {len(weights)} weights")
        if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
            raise ValueError(f"taskset weights must be >= 0 and not all 0, got {list(weights)}")
        self.streams, self.weights = list(streams), [float(w) for w in weights]
        self.total = sum(self.weights)
        self.credits = [0.0] * len(self.weights)
        self.taken = 0
        self.taken_by_set = [0] * len(self.streams)
        self.offsets, at = [], 0
        for s in self.streams:
            self.offsets.append(at)
            at += len(s.tasks)
        self.tasks = [t for s in self.streams for t in s.tasks]

    def next_set(self, credits: list[float]) -> int:
        """The set dealt the next slot; `credits` updated in place (module docstring)."""
        for i, w in enumerate(self.weights):
            credits[i] += w
        best = max(range(len(credits)), key=lambda i: (credits[i], -i))
        credits[best] -= self.total
        return best

    def __iter__(self) -> TaskMix:
        return self

    def __next__(self) -> Any:
        credits = list(self.credits)
        i = self.next_set(credits)
        task = next(self.streams[i])  # StopIteration: the first set to run out ends the mix
        self.credits = credits
        self.taken += 1
        self.taken_by_set[i] += 1
        return task

    def length(self) -> int:
        """Tasks the mix hands out over the run (from each set's `TaskStream.length`)."""
        left = [s.length() - s.taken for s in self.streams]
        credits, n = list(self.credits), 0
        while True:
            i = self.next_set(credits)
            if left[i] == 0:
                return self.taken + n
            left[i] -= 1
            n += 1

    def feedback(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Pass rates of the tasks at `indices` (into `tasks`), each told to its own set."""
        for s, stream in enumerate(self.streams):
            lo, hi = self.offsets[s], self.offsets[s] + len(stream.tasks)
            mine = [(i - lo, v) for i, v in zip(indices, values, strict=True) if lo <= i < hi]
            if mine:
                stream.feedback([i for i, _ in mine], [v for _, v in mine])

    def state_dict(self) -> dict[str, Any]:
        return {"mix": {"taken": list(self.taken_by_set), "credits": list(self.credits),
                        "sets": [s.state_dict() for s in self.streams]}}  # fmt: skip

    def resume(self, taken: int, state: dict[str, Any] | None) -> None:
        """Continue after `taken` tasks from `state` (`state_dict`, at the cursor)."""
        mix = (state or {}).get("mix")
        if mix is None:
            raise ValueError(
                f"the cursor holds no state of a mix of tasksets ({len(self.streams)} here): it "
                "was written by a run with one taskset, or by an older version"
            )
        if len(mix["taken"]) != len(self.streams) or sum(mix["taken"]) != taken:
            raise ValueError(
                f"the cursor's mix ({len(mix['taken'])} tasksets, {sum(mix['taken'])} tasks) "
                f"is not this config's ({len(self.streams)} tasksets) after {taken} tasks"
            )
        for stream, n, sub in zip(self.streams, mix["taken"], mix["sets"], strict=True):
            stream.resume(n, sub)
        self.credits = [float(c) for c in mix["credits"]]
        self.taken_by_set, self.taken = list(mix["taken"]), taken


def mix_weights(ratios: Sequence[float] | None, sizes: Sequence[int]) -> list[float]:
    """The mix's weights: the configured ratios, else the sets' sizes (Trinity-RFT's)."""
    return [float(r) for r in ratios] if ratios else [float(n) for n in sizes]
