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


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports, lazily too; not those under `if TYPE_CHECKING:`
    (annotations only, never run)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def _cycles(package: Path) -> list[list[str]]:
    """Groups of modules that import each other, round a cycle (Tarjan's strongly connected
    components of more than one module)."""
    paths = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: _module_imports(p, set(paths)) - {m} for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other_round_a_cycle():
    assert _cycles(PACKAGE) == []


def test_the_cycle_check_sees_a_lazy_import_back(tmp_path):
    package = tmp_path / "trinity"
    (package / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a" / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from trinity.a.y import f\n")
    (package / "a" / "y.py").write_text("def f():\n    from trinity.a import x\n")
    (package / "a" / "z.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trinity.a import x\n"
    )
    assert _cycles(package) == [["trinity.a.x", "trinity.a.y"]]
