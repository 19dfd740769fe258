"""`arithmetic_levels`: additions of three difficulty levels mixed by `weights`."""

from __future__ import annotations

from collections import Counter

import pytest

from trinity.rewards import arithmetic_reward
from trinity.tasks import generate, is_heldout
from trinity.tasks.arithmetic_levels import level_counts


def test_level_counts_by_largest_remainder():
    assert level_counts(240, [1, 1, 1]) == [80, 80, 80]
    # 10 / 3 = 3.33 each: floors 3, 3, 3; the one left goes to the lowest level of the tie
    assert level_counts(10, [1, 1, 1]) == [4, 3, 3]
    # 7 · 2/3 = 4.67, 7 · 1/3 = 2.33, 0: floors 4, 2, 0; the one left to the largest remainder
    assert level_counts(7, [2, 1, 0]) == [5, 2, 0]
    assert level_counts(9, [0, 1, 0]) == [0, 9, 0]
    for bad in ([1, 1], [1, -1, 1], [0, 0, 0]):
        with pytest.raises(ValueError, match="weights must be 3 numbers >= 0, not all 0"):
            level_counts(5, bad)


def test_rows_are_right_and_of_their_level():
    rows = generate("arithmetic_levels", "train", seed=0, num_tasks=90, weights=[1, 1, 1])
    assert rows == generate("arithmetic_levels", "train", seed=0, num_tasks=90)  # [1, 1, 1]
    assert rows != generate("arithmetic_levels", "train", seed=1, num_tasks=90)
    assert Counter(r["level"] for r in rows) == {0: 30, 1: 30, 2: 30}
    assert len({r["question"] for r in rows}) == 90
    assert [r["level"] for r in rows[:30]] != sorted(r["level"] for r in rows[:30])  # mixed
    for r in rows:
        a, b = r["a"], r["b"]
        carry = (a % 10) + (b % 10) >= 10
        if r["level"] == 2:
            assert 100 <= a <= 999 and 100 <= b <= 999
        else:
            assert 10 <= a <= 99 and 10 <= b <= 99 and carry == (r["level"] == 1)
        assert r["question"] == f"{a}+{b}=" and r["answer"] == f"{int(carry)}:{a + b}"
        assert arithmetic_reward(r["answer"], r["answer"], r)["accuracy"] == 1.0
    only_carry = generate("arithmetic_levels", "test", seed=0, num_tasks=20, weights=[0, 1, 0])
    assert {r["level"] for r in only_carry} == {1}
    plain = generate("arithmetic_levels", "train", seed=0, num_tasks=3, show_carry=False)
    assert all(r["answer"] == str(r["a"] + r["b"]) for r in plain)


def test_held_out_problems_are_arithmetics_held_out_ones():
    """The split is `arithmetic`'s: no held-out 2-digit problem is in the quickstart's SFT set."""
    test = generate("arithmetic_levels", "test", seed=0, num_tasks=300)
    train = generate("arithmetic_levels", "train", seed=3, num_tasks=300)
    assert all(is_heldout("arithmetic", r["question"], 0.1) for r in test)
    assert not any(is_heldout("arithmetic", r["question"], 0.1) for r in train)
    sft = generate("arithmetic", "train", seed=0, num_tasks=7000, digits=2, min_operand=10)
    assert not {r["question"] for r in test} & {r["question"] for r in sft}


def test_a_level_too_small_for_its_share_says_which():
    # 2-digit sums with a carry: 45 ones pairs of 100 × 81 tens pairs = 3645, a tenth held out
    with pytest.raises(ValueError, match=r"arithmetic_levels, level 1: .*only \d+ distinct"):
        generate("arithmetic_levels", "test", seed=0, num_tasks=3000, weights=[0, 1, 0])
