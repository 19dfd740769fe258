"""User plugins: the `*.py` files of plugin directories, imported before any name is looked up.

    trinity run --config x.yaml --plugin-dir ./my_plugins [--plugin-dir ./more]
    TRINITY_PLUGIN_DIRS=./my_plugins:./more trinity run --config x.yaml   # os.pathsep-separated

A plugin file registers pieces with a registry's decorator (`@POLICY_LOSS_FN.register("my_loss")`)
and a config names them like built-in ones (docs/tutorials/custom_loss.md). The rules:

- Every `*.py` file directly in a plugin directory whose name does not start with `_` is imported,
  in name order, once per process (loading again does nothing). `_*.py` files and subfolders are
  helpers, imported only by the plugins that use them.
- Each directory is a package of its own, `trinity.common.plugins.<dirname>_<hash>` (a hash of its
  absolute path), so two directories may hold files of the same name. A plugin imports its
  siblings relatively: `from ._helpers import f`, `from . import other_plugin`. The directory is
  not put on `sys.path` (a sibling imported by its bare name would run twice, and register twice).
- A missing directory, a file that fails to import and a name registered twice are `PluginError`s
  naming the directory or the file (and the line, when the file raised); the CLI turns them into
  exit code 2.

Every process that looks a name up loads the plugins itself: the CLI loads the directories of
`--plugin-dir` and `TRINITY_PLUGIN_DIRS` in the driver before the pre-flight pass and names them
all, absolute, in `TRINITY_PLUGIN_DIRS`; the launcher hands that variable to every actor through
the Ray job's runtime_env (also on a cluster started by `ray start`, whose workers never see the
driver's environment); and `Registry.get` and `in` load the directories that variable names on
their first miss (`load_env_plugins`), so an actor cannot look a name up before its plugins.
A plugin module has the same name in every process, and this module resolves that name from
`TRINITY_PLUGIN_DIRS` (`_PluginDirFinder`), so a class a plugin registers (an engine, a storage)
can be pickled by reference into an actor that has loaded nothing yet. On several machines a
plugin directory must exist at the same path on each.

Departs from Trinity-RFT, which takes one `--plugin-dir`, imports every file as
`trinity.plugins.<file name>` (two directories' `utils.py` clash) and logs a plugin that fails
to import and goes on: here a broken plugin stops the run before it starts.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

ENV_VAR = "TRINITY_PLUGIN_DIRS"

# Plugin packages are submodules of this module (`trinity.common.plugins.<tag>`), so importing
# one by name anywhere first imports this module, which installs the finder that resolves it.
__path__: list[str] = []

_lock = threading.RLock()  # actors look names up from many threads
_dirs: dict[str, Path] = {}  # package tag -> directory, for every directory seen in this process
_loaded: dict[Path, list[ModuleType]] = {}  # directory -> its plugins, once all imported
_loading: set[Path] = set()  # a plugin that looks a name up while it is imported


class PluginError(Exception):
    """A plugin directory that does not exist, or a plugin file that failed to import."""


def env_plugin_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The directories `TRINITY_PLUGIN_DIRS` names (os.pathsep-separated; empty entries are
    skipped), absolute, in order, without repeats. Not checked for existence."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return _unique(Path(p).expanduser().resolve() for p in value.split(os.pathsep) if p.strip())


def load_plugin_dirs(dirs: Iterable[str | Path]) -> list[ModuleType]:
    """Import every plugin of each directory (idempotent). Returns the plugin modules, in order.

    Raises:
        PluginError: a directory does not exist, or a plugin failed to import (naming the file).
    """
    paths = _unique(Path(d).expanduser().resolve() for d in dirs)
    for path in paths:
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            raise PluginError(f"plugin directory {path} {what}")
    return [module for path in paths for module in _load_dir(path)]


def load_env_plugins() -> None:
    """Load the directories `TRINITY_PLUGIN_DIRS` names, if any (what `Registry` does on a miss)."""
    if os.environ.get(ENV_VAR):
        load_plugin_dirs(env_plugin_dirs())


def use_plugin_dirs(dirs: Iterable[str | Path]) -> list[Path]:
    """The driver's start: load `dirs` (`--plugin-dir`) and those of `TRINITY_PLUGIN_DIRS`, then
    name them all, absolute, in `TRINITY_PLUGIN_DIRS` for the actors (`plugin_env`).

    Returns the directories loaded. Raises `PluginError` as `load_plugin_dirs`.
    """
    paths = _unique([*(Path(d).expanduser().resolve() for d in dirs), *env_plugin_dirs()])
    load_plugin_dirs(paths)
    if paths:
        os.environ[ENV_VAR] = os.pathsep.join(str(p) for p in paths)
    return paths


def plugin_env() -> dict[str, str]:
    """`{"TRINITY_PLUGIN_DIRS": ...}` for a Ray runtime_env's env_vars; empty without plugins."""
    value = os.environ.get(ENV_VAR, "")
    return {ENV_VAR: value} if value else {}


def package_name(directory: Path) -> str:
    """The package a plugin directory is imported as: `trinity.common.plugins.<dirname>_<hash>`,
    the same in every process for the same absolute path."""
    return f"{__name__}.{_tag(directory)}"


# --- loading ----------------------------------------------------------------------------------


def _load_dir(path: Path) -> list[ModuleType]:
    with _lock:
        if path in _loaded:
            return list(_loaded[path])
        if path in _loading:  # a plugin of this directory looks a name up while it is imported
            return []
        files = _plugin_files(path)
        _dirs[_tag(path)] = path
        _loading.add(path)
        try:
            modules = [_import(file) for file in files]
        finally:
            _loading.discard(path)
        _loaded[path] = modules
        return modules


def _plugin_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.glob("*.py") if p.is_file() and not p.name.startswith("_"))
    for file in files:
        if not file.stem.isidentifier():
            raise PluginError(
                f"plugin {file}: {file.stem!r} is not a Python module name "
                "(use letters, digits and underscores)"
            )
    return files


def _import(file: Path) -> ModuleType:
    """Import one plugin file (a no-op if it is imported already)."""
    name = f"{package_name(file.parent)}.{file.stem}"
    try:
        return importlib.import_module(name)
    except Exception as e:  # a user's file may raise anything; re-raised with its name
        where = _line_in(e, file)
        raise PluginError(
            f"plugin {file}{f', line {where}' if where else ''}: {type(e).__name__}: {e}"
        ) from e


def _line_in(e: BaseException, file: Path) -> int | None:
    """The line of `file` where `e` was raised (the innermost frame in it), if any."""
    if isinstance(e, SyntaxError) and e.filename and Path(e.filename) == file:
        return e.lineno
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == file]
    return lines[-1] if lines else None


def _tag(directory: Path) -> str:
    digest = hashlib.sha1(str(directory).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", directory.name) or "root"
    return f"{stem}_{digest}" if stem[0].isalpha() else f"d{stem}_{digest}"


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


# --- resolving a plugin package by name in any process ----------------------------------------


class _DirLoader(importlib.abc.Loader):
    """A plugin directory as a package with no code of its own: its `__path__` is the directory."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _PluginDirFinder(importlib.abc.MetaPathFinder):
    """Finds `trinity.common.plugins.<tag>`: a directory loaded in this process, or one that
    `TRINITY_PLUGIN_DIRS` names (an actor unpickling a plugin's class before any lookup)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        parent, _, tag = fullname.rpartition(".")
        if parent != __name__:
            return None
        directory = _dirs.get(tag)
        if directory is None:
            directory = next((d for d in env_plugin_dirs() if _tag(d) == tag), None)
        if directory is None or not directory.is_dir():
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _DirLoader(), is_package=True)
        spec.submodule_search_locations = [str(directory)]
        return spec


if not any(isinstance(f, _PluginDirFinder) for f in sys.meta_path):
    sys.meta_path.append(_PluginDirFinder())
