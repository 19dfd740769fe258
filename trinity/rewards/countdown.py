"""`countdown_reward`: reach the target with the task's numbers (the synthetic `countdown` tasks).

The response must be an arithmetic expression over integers with + - * / and parentheses
(anything after a `=` is ignored, so `(8+16)*4=96` is read as `(8+16)*4`). It is parsed with
`ast`, never evaluated as Python: only binary + - * / over integer literals are accepted (no
unary signs, no powers). It must use each of `task_raw["numbers"]` at most once (not
necessarily all of them) and evaluate exactly (fractions) to `task_raw["target"]`.

    accuracy 1, format 0              correct
    accuracy 0, format format_score   well-formed but wrong (wrong value, a number reused or
                                      not given, division by zero)
    accuracy 0, format 0              not an expression
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from trinity.rewards.base import REWARD_FN, needs_task_fields

_ALLOWED_CHARS = re.compile(r"^[\d+\-*/()\s]+$")
_MAX_LEN = 200  # characters; longer responses are not expressions of a countdown answer
_BINOPS = {ast.Add, ast.Sub, ast.Mult, ast.Div}


class _Malformed(ValueError):
    pass


def parse_expression(text: str) -> ast.expr:
    """The ast of an arithmetic expression, or `_Malformed` if it is anything else."""
    text = text.split("=", 1)[0].strip()
    if not text or len(text) > _MAX_LEN or not _ALLOWED_CHARS.match(text):
        raise _Malformed(text)
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:  # e.g. "3+", "(3", "05"
        raise _Malformed(text) from e
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise _Malformed(text)
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise _Malformed(text)
        elif not isinstance(node, ast.operator):
            raise _Malformed(text)
    return tree


def _numbers(tree: ast.expr) -> list[int]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]


def _evaluate(node: ast.expr) -> Fraction:
    """Exact value; ZeroDivisionError on division by zero."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)  # guaranteed by parse_expression
    left, right = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    return left / right


def evaluate_expression(text: str) -> Fraction:
    """The exact value of an arithmetic expression under `parse_expression`'s rules; ValueError
    if `text` is not one, ZeroDivisionError on a division by zero."""
    return _evaluate(parse_expression(text))


@REWARD_FN.register("countdown_reward")
@needs_task_fields("numbers", "target")
def countdown_reward(
    response: str,
    truth: str | None,
    task_raw: dict[str, Any],
    format_score: float = 0.1,
) -> dict[str, float]:
    """Score a countdown answer (see the module docstring)."""
    if "numbers" not in task_raw or "target" not in task_raw:
        raise ValueError(
            f"countdown_reward: the task row needs 'numbers' and 'target', has {sorted(task_raw)}"
        )
    try:
        tree = parse_expression(response)
    except _Malformed:
        return {"accuracy": 0.0, "format": 0.0}
    allowed = Counter(int(n) for n in task_raw["numbers"])
    used = Counter(_numbers(tree))
    try:
        correct = not (used - allowed) and _evaluate(tree) == Fraction(task_raw["target"])
    except ZeroDivisionError:
        correct = False
    if correct:
        return {"accuracy": 1.0, "format": 0.0}
    return {"accuracy": 0.0, "format": float(format_score)}
