"""Additions of mixed difficulty, for curricula: three levels mixed by a knob, `weights`.

    buffer.explorer_input.taskset:
      {storage_type: synthetic, path: arithmetic_levels, split: train,
       generator_args: {num_tasks: 240, weights: [1, 1, 1]}}

- level 0: two 2-digit numbers whose ones digits do not carry (`23+45=`);
- level 1: two 2-digit numbers whose ones digits carry (`47+38=`);
- level 2: two 3-digit numbers (`347+238=`).

`weights` (three numbers >= 0, not all 0) is the share of each level in the `num_tasks` rows
(largest remainders: [1, 1, 1] and 240 rows give 80 of each; [0, 1, 0] gives level 1 alone).
After the quickstart's SFT stage (a teacher that forgets the carry 70% of the time, on 2-digit
sums only) level 0 is solved, level 1 is learnable (the model imitates the slip, and a reward
that checks the true sum teaches it away) and level 2 is out of reach (it never saw a 3-digit
operand): the mix `benchmarks/curriculum.py` measures selectors on.

Answers are worked as the quickstart's (`show_carry`: `1:85`, the ones column's carry, a colon,
the sum). Rows carry `question`, `answer`, `a`, `b`, `op` and `level`. A problem is held out
exactly when `arithmetic`'s generator holds it out (the same hash, named `arithmetic`), so no
held-out problem of level 0 or 1 is in the quickstart's training set. Unlike `arithmetic`, a
larger `num_tasks` is not a prefix-extension of a smaller one (each level's share changes).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Any

from trinity.tasks.synthetic import GENERATORS, _check_common, _select, _with_carry

LEVELS = 3


def level_of(a: int, b: int) -> int:
    """0: 2-digit operands, no ones carry; 1: 2-digit, ones carry; 2: 3-digit operands."""
    if 100 <= a <= 999 and 100 <= b <= 999:
        return 2
    if not (10 <= a <= 99 and 10 <= b <= 99):
        raise ValueError(f"arithmetic_levels: {a}+{b} is in no level")
    return int(a % 10 + b % 10 >= 10)


def level_counts(num_tasks: int, weights: Sequence[float]) -> list[int]:
    """Rows of each level: num_tasks · w / Σw rounded down, the rest one each to the largest
    remainders (ties: the lower level)."""
    if len(weights) != LEVELS or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"arithmetic_levels: weights must be {LEVELS} numbers >= 0, not all 0; got "
            f"{list(weights)}"
        )
    exact = [num_tasks * w / sum(weights) for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(LEVELS), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in by_remainder[: num_tasks - sum(counts)]:
        counts[k] += 1
    return counts


def _row(a: int, b: int, show_carry: bool) -> dict[str, Any]:
    answer = _with_carry(a, "+", b, a + b) if show_carry else str(a + b)
    return {"question": f"{a}+{b}=", "answer": answer, "a": a, "b": b, "op": "+",
            "level": level_of(a, b)}  # fmt: skip


def _level_rows(
    level: int, split: str, seed: int, count: int, eval_fraction: float, show_carry: bool
) -> list[dict[str, Any]]:
    low, high = (100, 999) if level == 2 else (10, 99)
    values = range(low, high + 1)

    def enumerate_all() -> Iterable[dict[str, Any]]:
        for a, b in itertools.product(values, values):
            if level_of(a, b) == level:
                yield _row(a, b, show_carry)

    def draw(rng: random.Random) -> dict[str, Any] | None:
        a, b = rng.randint(low, high), rng.randint(low, high)
        return _row(a, b, show_carry) if level_of(a, b) == level else None

    space = len(values) ** 2
    try:  # named `arithmetic`: the same held-out split as that generator's
        return _select("arithmetic", split, seed, count, eval_fraction, space, enumerate_all, draw)
    except ValueError as e:
        raise ValueError(f"arithmetic_levels, level {level}: {e}") from e


@GENERATORS.register("arithmetic_levels")
def arithmetic_levels(
    split: str,
    seed: int = 0,
    num_tasks: int = 240,
    weights: Sequence[float] = (1.0, 1.0, 1.0),
    eval_fraction: float = 0.1,
    show_carry: bool = True,
) -> list[dict[str, Any]]:
    """Additions of 3 levels mixed by `weights`: 2-digit without and with a carry, 3-digit.

    `num_tasks` rows, `weights` the share of each level (module docstring), shuffled together
    with the seed."""
    _check_common("arithmetic_levels", num_tasks, eval_fraction)
    counts = level_counts(num_tasks, weights)
    rows = []
    for level, count in enumerate(counts):
        rows += _level_rows(level, split, seed, count, eval_fraction, show_carry)
    random.Random(f"arithmetic_levels:{seed}").shuffle(rows)
    return rows
