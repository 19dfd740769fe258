"""A group judge's self-consistency: the same responses scored in two orders, compared.

    first = shuffled_order(4, seed)          # e.g. [2, 0, 3, 1]: response 2 is shown first
    second = first[::-1]                     # every response moves (but a middle one)
    agreement = pairwise_agreement(a, b)     # a, b: the scores per response, in response order

The second order is the first reversed, the strongest probe of position bias: a judge that
scores by position rather than content ranks the group backwards the second time (agreement 0),
one that scores content agrees with itself (agreement 1).
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def shuffled_order(n: int, seed: int) -> list[int]:
    """A permutation of range(n) drawn from `seed`: position p shows response order[p]."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def in_response_order(scores: Sequence[float], order: Sequence[int]) -> list[float]:
    """Scores given in the order shown (`scores[p]` for response `order[p]`) put back in response
    order."""
    out = [0.0] * len(order)
    for position, response in enumerate(order):
        out[response] = float(scores[position])
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pairwise_agreement(a: Sequence[float], b: Sequence[float]) -> float:
    """The share of response pairs (i < j) that the two scorings order alike: sign(a_i - a_j) ==
    sign(b_i - b_j), a tie agreeing only with a tie. 1.0 for fewer than two responses (no pair
    to disagree on). Related to Kendall's tau-a on untied scores: tau = 2 * agreement - 1."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} scores against {len(b)}")
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return 1.0
    same = sum(_sign(a[i] - a[j]) == _sign(b[i] - b[j]) for i, j in pairs)
    return same / len(pairs)
