"""Imports point down: the lowest floors of the package import nothing above them, not even
inside a function (a lazy import is still an arrow up)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trinity"
# a floor and the floors it may import (itself included)
BELOW = {
    "common": {"common"},
    "models": {"common", "models"},
    "launcher": None,  # the top: anything
}


def _imported_floors(path: Path) -> set[str]:
    floors = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        floors |= {n.split(".")[1] for n in names if n.startswith("trinity.") and "." in n}
    return floors


@pytest.mark.parametrize("floor", [f for f, allowed in BELOW.items() if allowed is not None])
def test_a_low_floor_imports_nothing_above_it(floor):
    above = {
        str(path.relative_to(PACKAGE.parent)): sorted(_imported_floors(path) - BELOW[floor])
        for path in sorted((PACKAGE / floor).rglob("*.py"))
    }
    assert {k: v for k, v in above.items() if v} == {}


def test_the_check_sees_an_arrow_up_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from trinity.tasks.synthetic import GENERATORS\n")
    assert _imported_floors(module) == {"tasks"}
