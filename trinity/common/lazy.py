"""Modules imported on first use, for the actor classes that the driver imports.

The driver imports an actor's module only to start the actor (`ray.remote(cls)` needs the class),
never to run its methods. Where those methods need torch or transformers, the module names them
with `lazy_module`, so the driver stays a small process that starts quickly, and the actor's
process imports them when its `__init__` first touches them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands for the module `name`, imported on the first attribute read; every read after
    that is the module's own attribute (one extra Python call)."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r}, {state}>"


def lazy_module(name: str) -> Any:
    """A `LazyModule` for `name` (typed Any: callers use it as the module)."""
    return LazyModule(name)


def import_now(*modules: Any) -> None:
    """Import these lazy modules now (an actor's `__init__`, so its start-up timeline's
    `imports` mark counts them); real modules are left as they are."""
    for module in modules:
        if isinstance(module, LazyModule):
            module.__getattr__("__name__")
