"""A registry is a dict plus a decorator.

    POLICY_LOSS = Registry("policy_loss_fn")

    @POLICY_LOSS.register("ppo")
    def ppo_policy_loss(...): ...

    POLICY_LOSS.get("ppo")            # the function
    POLICY_LOSS.get("my_pkg.mod.Fn")  # a dotted path loads a user's object (also from the cwd)

A duplicate name raises; an unknown name raises with the sorted list of valid names; a name
`refuse(name, reason)` marks (Trinity-RFT's name for something not built here) raises with its
reason. A name not
registered yet is first looked for in the user's plugins: `get` and `in` load the plugin
directories that `TRINITY_PLUGIN_DIRS` names on a miss (`trinity.common.plugins`), so every
process that looks a name up (the driver, each actor) sees the names its plugins register.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from trinity.common.plugins import load_env_plugins

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate registry name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, modules: dict[str, str] | None = None) -> None:
        """`modules`: name -> the module whose import registers it, imported on first use (so
        a registry can name implementations whose modules are heavy or optional)."""
        self.kind = kind
        self._items: dict[str, T] = {}
        self._modules = dict(modules or {})
        self._refused: dict[str, str] = {}

    def refuse(self, name: str, reason: str) -> None:
        """Mark `name` as known but not built here: `get` raises naming `reason` (e.g. "needs
        the ALFWorld environment package and its game files"), not "unknown"."""
        if name in self._items or name in self._modules or name in self._refused:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._refused[name] = reason

    def refused(self) -> dict[str, str]:
        """Every name `refuse` marked, with its reason."""
        return dict(self._refused)

    def refusal(self, name: str) -> str | None:
        """Why `name` is not built here (`refuse`); None for any other name."""
        return self._refused.get(name)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering `obj` under `name`. A name taken, or one `modules` reserves for
        another module (imported on first use), raises."""

        def decorator(obj: T) -> T:
            owner = self._modules.get(name)
            if (
                name in self._items
                or name in self._refused
                or (owner and getattr(obj, "__module__", owner) != owner)
            ):
                by = f" (by {owner})" if owner else ""
                raise RegistryError(f"{self.kind} {name!r} is already registered{by}")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name in self._refused:
            raise RegistryError(f"{self.kind} {name!r} is not built here: {self._refused[name]}")
        if name not in self._items and name in self._modules:  # only the module it names
            importlib.import_module(self._modules[name])
        if name not in self._items:  # a user's plugin may register it
            load_env_plugins()
        if name not in self._items:  # import them all, so a miss lists every valid name
            for module in self._modules.values():
                importlib.import_module(module)
        if name in self._items:
            return self._items[name]
        if "." in name:
            return _load_dotted(name, self.kind)
        hint = difflib.get_close_matches(name, self.names(), n=1)
        did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
        raise RegistryError(
            f"unknown {self.kind} {name!r}.{did_you_mean} Valid names: {', '.join(self.names())}"
            " (or a dotted path package.module.Name)"
        )

    def registered(self) -> list[str]:
        """The names registered so far, in the order they were registered."""
        return list(self._items)

    def names(self) -> list[str]:
        """Every valid name: registered ones and those of `modules` not imported yet."""
        return sorted(set(self._items) | set(self._modules))

    def __contains__(self, name: object) -> bool:
        if name in self._items or name in self._modules:
            return True
        load_env_plugins()  # a user's plugin may register it
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _import_here(module_name: str) -> Any:
    """Import `module_name`; a package found nowhere on the path is also looked for in the
    directory the process runs in (appended to `sys.path`, so installed packages win): the
    `trinity` console script does not put it there, while Ray's workers of a local run have it
    (Trinity-RFT's example configs name its `examples/` code, run from its repository root)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.path.abspath(os.curdir)
        if e.name != module_name.split(".")[0] or here in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def _load_dotted(path: str, kind: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    try:
        module = _import_here(module_name)
    except ImportError as e:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no {attr!r}") from e


def keyword_names(
    fn: Callable[..., Any], n_fixed: int, skip: tuple[str, ...] = ()
) -> set[str] | None:
    """The names `fn` accepts as keywords after its first `n_fixed` parameters, less `skip`;
    None when it takes `**kwargs` (any name)."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in params[n_fixed:] if p.kind in kinds and p.name not in skip}
