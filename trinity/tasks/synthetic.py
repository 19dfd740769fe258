"""Synthetic task generators: deterministic, offline, with train/eval splits that never overlap.

    buffer.explorer_input.taskset:
      {storage_type: synthetic, path: arithmetic, split: train,
       generator_args: {digits: 2, ops: "+", num_tasks: 4000, seed: 0}}

A generator is `fn(split, seed, num_tasks, **args) -> list[dict]`; each row has at least
`question` and `answer`. Split membership is decided by a stable hash (sha1) of the generator name
and the canonical question text, never by the seed or the position in a list, so a problem that
lands in the held-out split is held out for every seed and every `num_tasks`. The seed only picks
*which* problems of a split are returned and in what order; for a fixed seed a larger `num_tasks`
returns a superset whose prefix is the smaller set.

If the space of distinct problems in the requested split is smaller than `num_tasks`, the
generator raises ValueError with the count it could produce.

A generator may carry `arg_problems(generator_args) -> [(key, message)]`: pre-flight calls it
after checking the argument names and reports each problem at `generator_args.<key>` (e.g. an
unknown dataset name or option of `reasoning_gym`, `trinity/tasks/reasoning_gym_tasks.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from trinity.common.registry import Registry

GeneratorFn = Callable[..., list[dict[str, Any]]]
# reasoning_gym: reasoning-gym's datasets (an optional package), registered on first use
GENERATORS: Registry[GeneratorFn] = Registry(
    "task generator",
    modules={
        "reasoning_gym": "trinity.tasks.reasoning_gym_tasks",
        "env_demos": "trinity.envs.demos",  # an environment's expert: SFT warm-up conversations
        "arithmetic_levels": "trinity.tasks.arithmetic_levels",  # additions of mixed difficulty
    },
)

TRAIN_SPLITS = ("train",)
HELDOUT_SPLITS = ("test", "eval", "validation")
# Spaces up to this many candidates are enumerated exactly; larger ones are sampled.
_ENUMERATE_LIMIT = 200_000
# A sampled space counts as exhausted after this many draws in a row without a new problem.
_SATURATION_DRAWS = 20_000


def is_heldout(generator: str, question: str, eval_fraction: float) -> bool:
    """True when `question` belongs to the held-out split (stable across seeds and machines)."""
    digest = hashlib.sha1(f"{generator}\x00{question}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    return bucket < eval_fraction


def _want_heldout(generator: str, split: str) -> bool:
    if split in TRAIN_SPLITS:
        return False
    if split in HELDOUT_SPLITS:
        return True
    raise ValueError(
        f"{generator}: unknown split {split!r}; use 'train' or one of {', '.join(HELDOUT_SPLITS)}"
    )


def _check_common(generator: str, num_tasks: int, eval_fraction: float) -> None:
    if num_tasks < 0:
        raise ValueError(f"{generator}: num_tasks must be >= 0, got {num_tasks}")
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"{generator}: eval_fraction must be in (0, 1), got {eval_fraction}")


def _too_few(generator: str, split: str, found: int, num_tasks: int, how: str) -> ValueError:
    return ValueError(
        f"{generator}: only {found} distinct problems exist in split {split!r} with these "
        f"generator_args ({how}), but num_tasks={num_tasks}; lower num_tasks or widen the space"
    )


def _select(
    generator: str,
    split: str,
    seed: int,
    num_tasks: int,
    eval_fraction: float,
    space_size: int,
    enumerate_all: Callable[[], Iterable[dict[str, Any]]],
    draw: Callable[[random.Random], dict[str, Any] | None],
) -> list[dict[str, Any]]:
    """Pick `num_tasks` distinct rows of `split`, deterministically from `seed`.

    1. small space: enumerate every candidate, keep those of the split, shuffle with the seed
    2. large space: draw candidates with the seed, keep new ones of the split, until enough or
       the space looks exhausted
    """
    heldout = _want_heldout(generator, split)
    rng = random.Random(f"{generator}:{seed}")

    def in_split(row: dict[str, Any]) -> bool:
        return is_heldout(generator, row["question"], eval_fraction) == heldout

    # 1.
    if space_size <= _ENUMERATE_LIMIT:
        seen: set[str] = set()
        pool = []
        for row in enumerate_all():
            if row["question"] not in seen and in_split(row):
                seen.add(row["question"])
                pool.append(row)
        if len(pool) < num_tasks:
            raise _too_few(generator, split, len(pool), num_tasks, "exact count")
        rng.shuffle(pool)
        return pool[:num_tasks]
    # 2.
    rows: dict[str, dict[str, Any]] = {}
    draws = stale = 0  # stale: draws since the last new problem; a long run means saturation
    while len(rows) < num_tasks and stale < _SATURATION_DRAWS:
        draws += 1
        row = draw(rng)
        if row is not None and row["question"] not in rows and in_split(row):
            rows[row["question"]] = row
            stale = 0
        else:
            stale += 1
    if len(rows) < num_tasks:
        raise _too_few(
            generator,
            split,
            len(rows),
            num_tasks,
            f"none new in the last {_SATURATION_DRAWS} of {draws} random draws",
        )
    return list(rows.values())


# -- arithmetic --------------------------------------------------------------------------------

_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def _arith_row(a: int, op: str, b: int) -> dict[str, Any]:
    return {"question": f"{a}{op}{b}=", "answer": str(_OPS[op](a, b)), "a": a, "b": b, "op": op}


def carry_slip(a: int, op: str, b: int) -> int | None:
    """The answer of a solver who forgets the carry (or borrow) out of the ones digit.

    `+`: 47+38 → 75 instead of 85 (the tens digit misses the carry); `-`: 52-38 → 24 instead of 14
    (the tens digit misses the borrow). None when the ones digits produce no carry or borrow, or
    for `*`, where the slip is not defined.
    """
    if op == "+" and a % 10 + b % 10 >= 10:
        return a + b - 10
    if op == "-" and a % 10 < b % 10:
        return a - b + 10
    return None


def _with_carry(a: int, op: str, b: int, result: int) -> str:
    """`result` preceded by the ones column's carry (or borrow) digit: 47+38 -> `1:85`."""
    return f"{int(carry_slip(a, op, b) is not None)}:{result}"


def _add_teacher(rows: list[dict[str, Any]], seed: int, slip_rate: float, show_carry: bool) -> None:
    """Give every row a `teacher_answer`: the answer, or with `slip_rate` a carry slip.

    With `show_carry` the slipping teacher still notes the carry but does not add it (`1:75`).
    The draw is per (seed, question), so a problem's teacher answer does not depend on
    `num_tasks` or on the order rows were generated in.
    """
    for row in rows:
        a, op, b = row["a"], row["op"], row["b"]
        slip = carry_slip(a, op, b)
        slipped = slip is not None and random.Random(f"teacher:{seed}:{row['question']}").random()
        if not (slipped and slipped < slip_rate):
            row["teacher_answer"] = row["answer"]
        else:
            row["teacher_answer"] = _with_carry(a, op, b, slip) if show_carry else str(slip)


@GENERATORS.register("arithmetic")
def arithmetic(
    split: str,
    seed: int = 0,
    num_tasks: int = 1000,
    digits: int = 2,
    ops: str = "+",
    max_operand: int | None = None,
    min_operand: int = 0,
    allow_negative: bool = False,
    eval_fraction: float = 0.1,
    teacher_slip_rate: float | None = None,
    show_carry: bool = False,
) -> list[dict[str, Any]]:
    """Problems like `23+45=` with answer `68`.

    Operands are in [min_operand, 10**digits - 1] (or [min_operand, max_operand]);
    `min_operand: 10` with `digits: 2` keeps to true 2-digit numbers. `ops` is any of "+-*". With
    `allow_negative=False`, subtraction keeps the larger operand first. Rows carry `a`, `b`, `op`.

    `teacher_slip_rate` (in [0, 1]) adds a `teacher_answer` column: demonstrations from an
    imperfect teacher who, on problems whose ones digits carry (or borrow), forgets the carry with
    that probability (`carry_slip`) and is right otherwise. SFT on `teacher_answer` imitates the
    slip; a reward that checks `answer` can then teach the model past its teacher.

    `show_carry` (ops '+' and '-') writes answers as worked solutions: the ones column's carry
    (or borrow) digit, a colon, the result (`47+38=` -> `1:85`, `52-38=` -> `1:14`, `23+45=` ->
    `0:68`). Every digit of such an answer is then a sum of single digits seen before it, which a
    small model learns steadily; without the note, the ones digit of a sum, `(a + b) mod 10`, says
    nothing about either digit alone, and learning it waits on a long, seed-dependent plateau.
    `arithmetic_reward` reads the last number, so it scores the result alone.
    """
    _check_common("arithmetic", num_tasks, eval_fraction)
    if teacher_slip_rate is not None and not 0.0 <= teacher_slip_rate <= 1.0:
        raise ValueError(
            f"arithmetic: teacher_slip_rate must be in [0, 1], got {teacher_slip_rate}"
        )
    if teacher_slip_rate and "*" in ops:
        raise ValueError("arithmetic: teacher_slip_rate is defined for ops '+' and '-' only")
    if show_carry and "*" in ops:
        raise ValueError("arithmetic: show_carry is defined for ops '+' and '-' only")
    if not ops or any(op not in _OPS for op in ops):
        raise ValueError(f"arithmetic: ops must be a non-empty string of '+-*', got {ops!r}")
    if max_operand is None:
        if digits < 1:
            raise ValueError(f"arithmetic: digits must be >= 1, got {digits}")
        max_operand = 10**digits - 1
    if not 0 <= min_operand <= max_operand:
        raise ValueError(
            f"arithmetic: need 0 <= min_operand <= max_operand, got {min_operand} and {max_operand}"
        )
    op_list = sorted(set(ops))
    values = range(min_operand, max_operand + 1)

    def valid(a: int, op: str, b: int) -> bool:
        return allow_negative or op != "-" or a >= b

    def enumerate_all() -> Iterable[dict[str, Any]]:
        for op, a, b in itertools.product(op_list, values, values):
            if valid(a, op, b):
                yield _arith_row(a, op, b)

    def draw(rng: random.Random) -> dict[str, Any] | None:
        op = rng.choice(op_list)
        a, b = rng.randint(min_operand, max_operand), rng.randint(min_operand, max_operand)
        if not valid(a, op, b):
            a, b = b, a
        return _arith_row(a, op, b)

    space = len(op_list) * len(values) ** 2
    rows = _select("arithmetic", split, seed, num_tasks, eval_fraction, space, enumerate_all, draw)
    if show_carry:
        for row in rows:
            row["answer"] = _with_carry(row["a"], row["op"], row["b"], int(row["answer"]))
    if teacher_slip_rate is not None:
        _add_teacher(rows, seed, teacher_slip_rate, show_carry)
    return rows


# -- countdown ---------------------------------------------------------------------------------


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


_Item = tuple[str, Fraction, int]  # (expression text, exact value, precedence of its top op)


def _combine(left: _Item, op: str, right: _Item) -> _Item | None:
    """`left op right` with parentheses only where precedence needs them (`(8+16)*4`,
    `12-(3+4)`); None for a division that is inexact or by zero."""
    (ls, lv, lp), (rs, rv, rp) = left, right
    if op == "/" and (rv == 0 or (lv / rv).denominator != 1):
        return None
    val = {"+": lv + rv, "-": lv - rv, "*": lv * rv}[op] if op != "/" else lv / rv
    prec = _PREC[op]
    text_l = f"({ls})" if lp < prec else ls
    text_r = f"({rs})" if rp < prec or (rp == prec and op in "-/") else rs
    return text_l + op + text_r, val, prec


def random_expression(nums: list[int], rng: random.Random) -> tuple[str, Fraction] | None:
    """A random expression using every number of `nums` once; None if a division is inexact.

    Parentheses only where precedence needs them: `(8+16)*4`, `19+3-19`, `12-(3+4)`.
    """
    items: list[_Item] = [(str(n), Fraction(n), _ATOM) for n in nums]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        joined = _combine(items[i], rng.choice("+-*/"), items[j])
        if joined is None:
            return None
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [joined]
    return items[0][0], items[0][1]


def solve_countdown(numbers: list[int], target: int) -> str | None:
    """An expression reaching `target` with each of `numbers` used at most once, by exhaustive
    search over the same moves `random_expression` makes (any two values joined by + - * or an
    exact /); the fewest numbers first, so a number alone equal to the target is its own
    answer. None when there is none. Exponential in len(numbers): meant for a handful."""

    def search(items: list[_Item]) -> str | None:
        for text, value, _ in items:
            if value == target:
                return text
        for i, j in itertools.permutations(range(len(items)), 2):
            rest = [it for k, it in enumerate(items) if k not in (i, j)]
            for op in "+-*/":
                joined = _combine(items[i], op, items[j])
                if joined is not None and (found := search([*rest, joined])) is not None:
                    return found
        return None

    atoms = [(str(n), Fraction(n), _ATOM) for n in sorted(numbers)]
    for size in range(1, len(atoms) + 1):
        for subset in itertools.combinations(atoms, size):
            if (found := search(list(subset))) is not None:
                return found
    return None


def countdown_question(numbers: list[int], target: int) -> str:
    """The canonical question text: numbers sorted ascending, e.g. `Use 3 5 7 to make 22`."""
    return f"Use {' '.join(str(n) for n in sorted(numbers))} to make {target}"


@GENERATORS.register("countdown")
def countdown(
    split: str,
    seed: int = 0,
    num_tasks: int = 1000,
    num_numbers: int = 3,
    max_number: int = 20,
    max_target: int = 100,
    eval_fraction: float = 0.1,
) -> list[dict[str, Any]]:
    """Problems like `Use 3 5 7 to make 22`: reach the target with + - * / using each number once.

    Numbers are drawn from [1, max_number]; the target is the value of a random expression over
    all of them, a whole number in [1, max_target]. Rows carry `numbers` (sorted), `target`, and
    `answer`, one expression that reaches the target.
    """
    _check_common("countdown", num_tasks, eval_fraction)
    if num_numbers < 2 or max_number < 1 or max_target < 1:
        raise ValueError(
            "countdown: need num_numbers >= 2, max_number >= 1 and max_target >= 1, got "
            f"{num_numbers}, {max_number}, {max_target}"
        )

    def draw(rng: random.Random) -> dict[str, Any] | None:
        nums = sorted(rng.randint(1, max_number) for _ in range(num_numbers))
        expr = random_expression(nums, rng)
        if expr is None:
            return None
        text, value = expr
        if value.denominator != 1 or not 1 <= value <= max_target:
            return None
        target = int(value)
        return {
            "question": countdown_question(nums, target),
            "answer": text,
            "numbers": nums,
            "target": target,
        }

    # The space of (numbers, target) pairs is not known in closed form: always sample.
    return _select(
        "countdown", split, seed, num_tasks, eval_fraction, _ENUMERATE_LIMIT + 1, list, draw
    )


# -- environment episodes ----------------------------------------------------------------------


@GENERATORS.register("env_episodes")
def env_episodes(
    split: str,
    seed: int = 0,
    num_tasks: int = 1000,
    num_seeds: int = 100_000,
    eval_fraction: float = 0.1,
) -> list[dict[str, Any]]:
    """Rows `{"question": "episode 17", "seed": 17}` for environments that need no problem file:
    `env_workflow` resets its environment with the row's `seed`, which alone decides the episode.

    Seeds are drawn from [0, num_seeds); a seed lands in the train or the held-out split by the
    hash of its question, as every generator's problems do, so train and test episodes never
    share a seed.
    """
    _check_common("env_episodes", num_tasks, eval_fraction)
    if num_seeds < 1:
        raise ValueError(f"env_episodes: num_seeds must be >= 1, got {num_seeds}")

    def row(s: int) -> dict[str, Any]:
        return {"question": f"episode {s}", "seed": s}

    def draw(rng: random.Random) -> dict[str, Any]:
        return row(rng.randrange(num_seeds))

    return _select(
        "env_episodes",
        split,
        seed,
        num_tasks,
        eval_fraction,
        num_seeds,
        lambda: (row(s) for s in range(num_seeds)),
        draw,
    )


def generate(name: str, split: str, seed: int, num_tasks: int, **args: Any) -> list[dict[str, Any]]:
    """Run the generator registered as `name` (or a dotted path)."""
    return GENERATORS.get(name)(split=split, seed=seed, num_tasks=num_tasks, **args)
