"""Monitor backends: where each step's record goes besides `metrics.jsonl` and the console.

    monitor:
      monitor_type: [tensorboard, wandb]   # jsonl and console are always on
      monitor_args: {}                     # the backends' arguments, one dict for all

A backend is a class registered in `MONITOR` under its `monitor_type` name, built by the driver's
`Monitor` with the run's `RunInfo` and `monitor.monitor_args`, then given each merged record
(numbers only) with its step, and closed at the end of the run:

    backend = MONITOR.get("wandb")(info, args)
    backend.log({"train/loss": 0.5, "rollout/reward_mean": 0.25}, step=3)
    backend.close()

Every backend writes under the run folder and needs no network: TensorBoard event files,
wandb in `mode=offline` (`wandb/`), an MLflow file store (`mlruns/`), SwanLab in its offline or
local mode (`swanlog/`). The wandb, mlflow and swanlab packages are optional extras, imported
only when a run names them; a missing one is a `MonitorUnavailable` naming the pip extra, and
`trinity validate` reports it before anything starts (`config_problems`).

Each backend declares the `monitor_args` keys it reads (`ARGS`): acted upon, or accepted with a
note saying why it has no effect here (e.g. wandb's `api_key`: the run is offline; upload it
later with `wandb sync`). A key that no backend of the run knows is a config problem.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from trinity.common.registry import Registry
from trinity.config.problems import Problem, suggest

ALWAYS_ON = ("jsonl", "console")
"""monitor_type names the driver's `Monitor` always writes itself (not backends)."""


@dataclass(frozen=True)
class RunInfo:
    """What a backend knows of its run. `part`: the process's share of a run split over
    processes ("" for a whole run; `metrics.<part>.jsonl`), so two processes of one run write two
    backend runs named `<name>_<part>`."""

    run_dir: Path
    project: str = "trinity"
    group: str = ""
    name: str = "run"
    part: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def run_name(self) -> str:
        return f"{self.name}_{self.part}" if self.part else self.name


@dataclass(frozen=True)
class Arg:
    """A `monitor_args` key a backend accepts. `values`: the values accepted (None: any);
    `refused`: why the other values are refused; `note`: set, the key has no effect here and
    is noted with this reason instead of acted upon."""

    doc: str
    values: tuple[Any, ...] | None = None
    refused: str = ""
    note: str = ""


class MonitorBackend(Protocol):
    """One destination of the run's records (module docstring)."""

    PACKAGE: ClassVar[str | None]  # the import it needs beyond trinity's own (None: none)
    EXTRA: ClassVar[str]  # the pip extra that installs it
    ARGS: ClassVar[dict[str, Arg]]
    OUTPUT: ClassVar[str]  # what it writes, relative to the run folder (for the summary)

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None: ...

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


MONITOR: Registry[type[MonitorBackend]] = Registry(
    "monitor_type",
    modules={
        "tensorboard": "trinity.monitor.backends.tensorboard",
        "wandb": "trinity.monitor.backends.wandb",
        "mlflow": "trinity.monitor.backends.mlflow",
        "swanlab": "trinity.monitor.backends.swanlab",
    },
)


class MonitorUnavailable(ImportError):
    """A backend's package is not installed; the message names the pip extra."""


def require(backend: type[MonitorBackend], name: str) -> Any:
    """Import `backend.PACKAGE` (the module), or raise `MonitorUnavailable` saying how to get
    it."""
    assert backend.PACKAGE is not None
    if importlib.util.find_spec(backend.PACKAGE) is None:
        raise MonitorUnavailable(missing_message(backend, name))
    return importlib.import_module(backend.PACKAGE)


def missing_message(backend: type[MonitorBackend], name: str) -> str:
    return (
        f"monitor_type {name!r} needs the {backend.PACKAGE} package, which is not installed: "
        f"pip install 'trinity[{backend.EXTRA}]' (or pip install {backend.PACKAGE})"
    )


def monitor_types(value: str | list[str]) -> list[str]:
    """`monitor.monitor_type` as a list of names, in order, without repeats."""
    names = [value] if isinstance(value, str) else list(value)
    return list(dict.fromkeys(names))


def config_problems(monitor: Any) -> tuple[list[Problem], list[str]]:
    """(problems, notes) of a `MonitorConfig`: backends whose package is missing, and every
    `monitor_args` key checked against the backends the run names (a key known only to a
    backend the run does not name is noted; one no backend knows is a problem)."""
    problems: list[Problem] = []
    notes: list[str] = []
    chosen = [n for n in monitor_types(monitor.monitor_type) if n not in ALWAYS_ON]
    for name in chosen:
        backend = MONITOR.get(name)
        if backend.PACKAGE is not None and importlib.util.find_spec(backend.PACKAGE) is None:
            problems.append(Problem("monitor.monitor_type", missing_message(backend, name)))
    args = monitor.monitor_args or {}
    accepted = {n: MONITOR.get(n).ARGS for n in chosen}
    known_elsewhere = {
        key: n for n in MONITOR.names() if n not in accepted for key in MONITOR.get(n).ARGS
    }
    for key, value in args.items():
        path = f"monitor.monitor_args.{key}"
        owners = {n: spec[key] for n, spec in accepted.items() if key in spec}
        if not owners and key in known_elsewhere:
            why = (
                f"an argument of monitor_type {known_elsewhere[key]!r}, which the run does not use"
            )
            notes.append(f"{path}: not applicable here ({why})")
        elif not owners:
            names = sorted({k for spec in accepted.values() for k in spec})
            valid = f"they accept: {', '.join(names)}" if names else "they take no arguments"
            used = ", ".join(chosen) or "none besides jsonl and console"
            problems.append(
                Problem(path, f"unknown argument of the monitors in use ({used}); {valid}",
                        suggest(key, names))
            )  # fmt: skip
        for name, arg in owners.items():
            if arg.values is not None and value not in arg.values:
                allowed = ", ".join(repr(v) for v in arg.values)
                why = f"; {arg.refused}" if arg.refused else ""
                problems.append(
                    Problem(path, f"{value!r} is not accepted by {name}: expected {allowed}{why}")
                )
            elif arg.note:
                notes.append(f"{path}: not applicable here ({name}: {arg.note})")
    return problems, notes


def build(names: list[str], info: RunInfo, args: dict[str, Any]) -> list[MonitorBackend]:
    """The backends `names` asks for (jsonl and console left out), each given the arguments it
    declares; if one fails to start, those already started are closed before the error goes
    on."""
    backends: list[MonitorBackend] = []
    try:
        for name in names:
            if name in ALWAYS_ON:
                continue
            cls = MONITOR.get(name)
            backends.append(cls(info, {k: v for k, v in args.items() if k in cls.ARGS}))
    except BaseException:
        for backend in backends:
            backend.close()
        raise
    return backends
