"""Data parallelism over trainer ranks: which rows each rank trains, and the sums that keep a
split train step equal to one process's.

    trainer: {trainer_strategy: fsdp2, world_size: 2}

Every rank receives the WHOLE train batch and computes everything that needs the whole batch
(the sample strategy, advantages over groups, the aggregator's counts) itself, identically. Only
the model passes are split: rank r forwards and backwards its own contiguous block of rows
(`rows`; a DPO pair never split), and the results are summed back:

- no-grad passes (reference, old logprobs, values) fill their rows of a zero [B, R] tensor; a sum
  over ranks (`all_sum`) gives every rank the whole batch's, exactly (x + 0 = x);
- losses are pre-scaled by the whole (mini-)batch's token and sequence counts (`Aggregator`), so
  the per-rank gradients SUM to the one-process gradient: FSDP2 reduce-scatters with a plain sum
  (`trinity.trainer.sharding`), not its default mean over ranks (verl divides by `dp_size`
  instead; the global counts make that unnecessary here);
- metrics add the same way (`sum_metrics`): losses are already scaled by the global counts, and
  per-token means are weighted by each micro-batch's token share of the whole mini-batch.

FSDP2 gathers each layer's parameters in a collective at every forward and backward, so every
rank must run the same number of micro-batches: a rank with fewer rows runs idle ones (`None`
in `micro_batches`; `idle_rows` makes one whose tokens are all untrained: it contributes exactly
0 to every loss and gradient).

With sequence parallelism (`trainer.ulysses_sequence_parallel_size: sp`,
`trinity.trainer.sequence_parallel`) the world is `dp = world / sp` data-parallel groups of `sp`
consecutive ranks: the rows are split over the groups (`dp_rank`), and the ranks of a group take
the same rows, each a slice of their sequence. A group's ranks end each pass holding the same
whole rows' results, so the sums above count each group once: its first rank's (`leads`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trinity.trainer.batch import Batch, micro_batches


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's ranks (world 1: one process): `sp` consecutive
    ranks split each sequence (1: none), and their groups split the rows. `sp_group`: the
    process group of this rank's sequence-parallel group (`sharding.sequence_groups`)."""

    rank: int = 0
    world: int = 1
    sp: int = 1
    sp_group: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.world % self.sp:
            raise ValueError(
                f"trainer.ulysses_sequence_parallel_size {self.sp} must divide "
                f"trainer.world_size {self.world}"
            )

    @property
    def dp(self) -> int:
        """Data-parallel groups: the ways the rows are split."""
        return self.world // self.sp

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel group: which rows it takes."""
        return self.rank // self.sp

    @property
    def sp_rank(self) -> int:
        """This rank's place in its sequence-parallel group: which slice of each sequence."""
        return self.rank % self.sp

    @property
    def leads(self) -> bool:
        """This rank reports its group's results (the first of its sequence-parallel group)."""
        return self.sp_rank == 0

    def rows(self, n: int, unit: int = 1, rank: int | None = None) -> torch.Tensor:
        """Row indices of data-parallel group `rank` (default: this rank's) in a batch of `n`
        rows: contiguous blocks of whole units, the first `n_units % dp` groups one unit more."""
        r = self.dp_rank if rank is None else rank
        units = n // unit
        base, extra = divmod(units, self.dp)
        start = r * base + min(r, extra)
        count = base + (1 if r < extra else 0)
        return torch.arange(start * unit, (start + count) * unit)

    def micro_batches(
        self, batch: Batch, size: int, max_tokens: int | None, unit: int = 1
    ) -> list[torch.Tensor | None]:
        """This rank's micro-batches (row indices into `batch`; its data-parallel group's), then
        `None` (an idle micro-batch) up to the largest count of any group: every rank can
        compute every group's split, so no message is needed to agree on the count."""
        if self.dp == 1:  # one group: the batch's own micro-batches, nothing to pad
            return list(micro_batches(batch, size, max_tokens, unit))
        counts, mine = [], []
        for r in range(self.dp):
            rows = self.rows(len(batch), unit, r)
            parts = (
                [] if len(rows) == 0 else micro_batches(batch.select(rows), size, max_tokens, unit)
            )
            counts.append(len(parts))
            if r == self.dp_rank:
                mine = [rows[p] for p in parts]
        return [*mine, *[None] * (max(counts) - len(mine))]

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over data-parallel groups (each group's copy, its leading rank's, once),
        in place (world 1: `t` itself)."""
        if self.world > 1:
            import torch.distributed as dist

            if not self.leads:
                t.zero_()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Each metric summed over data-parallel groups (a rank without a key counts 0 for it;
        a group counts once, its leading rank's)."""
        if self.world == 1:
            return sums
        import torch.distributed as dist

        keys: list[list[str]] = [[] for _ in range(self.world)]
        dist.all_gather_object(keys, sorted(sums))
        names = sorted(set().union(*keys))
        own = sums if self.leads else {}
        values = torch.tensor([own.get(k, 0.0) for k in names], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return dict(zip(names, values.tolist(), strict=True))


def idle_rows(batch: Batch, unit: int = 1) -> Batch:
    """An idle micro-batch: the first unit of `batch` with no trained token, so its forward and
    backward take part in the ranks' collectives and add exactly 0 to every loss term."""
    idle = batch.select(torch.arange(unit))
    idle.response_mask = torch.zeros_like(idle.response_mask)
    return idle
