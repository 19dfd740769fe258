"""The built-in pieces a config names, as a markdown page section: workflows, reward fns, task
generators, task selectors and text environments, each with the first line of its docstring.

    python scripts/config_reference.py     # rewrites it in docs/plugins.md, with the key reference

Read from the registries themselves, so a piece registered is a piece listed; names that alias
another piece (Trinity-RFT's spellings) say so. Imports the registries' modules (and through them
torch) when called, never at import.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

SECTIONS = (  # (title, the key that names one, registry module, registry attribute)
    ("Workflows", "`buffer.explorer_input.default_workflow_type`", "trinity.workflows", "WORKFLOW"),
    ("Reward fns", "`buffer.explorer_input.default_reward_fn_type`", "trinity.rewards", "REWARD_FN"),
    ("Task generators", "`storage_type: synthetic`, `path: <name>`", "trinity.tasks.synthetic",
     "GENERATORS"),
    ("Task selectors", "a taskset's `data_selector.selector_type`", "trinity.tasks.selector",
     "SELECTORS"),
    ("Text environments", "`workflow_args: {env: <name>}` of `env_workflow`", "trinity.envs.base",
     "ENV"),
    ("Experience operators", "`data_processor.experience_pipeline.operators[*].name`",
     "trinity.data.operators", "EXPERIENCE_OPERATORS"),
)  # fmt: skip


def catalog_markdown() -> str:
    """One table per section: name, and what it is (or which name it aliases)."""
    import importlib

    out = []
    for title, key, module, attr in SECTIONS:
        registry = getattr(importlib.import_module(module), attr)
        pieces = {name: registry.get(name) for name in registry.names()}
        # built-in only: a user's plugin (or a test's) registered in this process is not listed
        pieces = {n: p for n, p in pieces.items() if _built_in(_module(p))}
        first = {}  # a piece -> the name it was first registered under (aliases come later)
        for name in getattr(registry, "registered", list)():
            first.setdefault(id(registry.get(name)), name)
        out += [f"### {title}", "", f"Named by {key}.", "", "| name | what it is |", "|---|---|"]
        for name, piece in pieces.items():
            seen = first.setdefault(id(piece), name)
            about = f"the same as `{seen}`" if seen != name else _summary(piece)
            out.append(f"| `{name}` | {about} |")
        for name, why in sorted(getattr(registry, "refused", dict)().items()):
            out.append(f"| `{name}` | not built here (Trinity-RFT's name, refused): {why} |")
        out.append("")
    return "\n".join(out)


def _built_in(module: str) -> bool:
    """A module of the package, not a plugin directory (imported as a package under
    `trinity.common.plugins`)."""
    from trinity.common.plugins import __name__ as plugins

    return module.startswith("trinity.") and not module.startswith(plugins + ".")


def _module(piece: Any) -> str:
    return str(getattr(piece, "__module__", "") or "")


def _summary(piece: Any) -> str:
    """The first line of the piece's own docstring, else of its module's."""
    doc = piece.__dict__.get("__doc__") if inspect.isclass(piece) else piece.__doc__
    if not doc:
        doc = getattr(sys.modules.get(_module(piece)), "__doc__", None)
    line = (doc or "").strip().split("\n")[0].strip()
    return line.replace("|", "\\|")
