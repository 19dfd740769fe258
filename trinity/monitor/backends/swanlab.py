"""SwanLab, offline or local: a run folder under `<run_dir>/swanlog/` (or `logdir`).

    monitor: {monitor_type: swanlab}                            # mode offline
    # afterwards, to upload:  swanlab sync <run_dir>/swanlog/run-*
    monitor: {monitor_type: swanlab, monitor_args: {mode: local}}   # swanlab watch <logdir>

The experiment is named `<name>` (`<name>_<part>` for one process of a split run; or
`experiment_name`) in the project `project`, tagged with its part and group, with the whole
config. Trinity-RFT's arguments keep their names: `mode` (here `offline`, the default, `local`
or `disabled`; `cloud`/`online` needs the network and is refused), `logdir`,
`experiment_name`, `description`, `tags`; `api_key` and `workspace` only matter to an upload
(noted); `id`, `resume`, `reinit` and `settings` resume or tune a cloud experiment (noted).
Written for SwanLab 0.10 (`swanlab.init(log_dir=..., name=...)`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from trinity.monitor.backends import MONITOR, Arg, RunInfo, require

_UPLOAD = "runs are offline or local here; `swanlab sync <run folder>` uploads them"
_CLOUD = "resuming or tuning a cloud experiment; runs here are offline or local"


@MONITOR.register("swanlab")
class SwanlabBackend:
    PACKAGE: ClassVar[str | None] = "swanlab"
    EXTRA: ClassVar[str] = "swanlab"
    ARGS: ClassVar[dict[str, Arg]] = {
        "mode": Arg(
            "offline (default), local or disabled",
            values=("offline", "local", "disabled"),
            refused="cloud logging needs the network and is not built: run offline and upload "
            "with `swanlab sync`",
        ),
        "logdir": Arg("the folder of SwanLab's runs; unset: <run_dir>/swanlog"),
        "experiment_name": Arg("the experiment's name; unset: <name>[_<part>]"),
        "description": Arg("the experiment's description"),
        "tags": Arg("a list of tags (the part and the group are added)"),
        "api_key": Arg("the SwanLab API key", note=_UPLOAD),
        "workspace": Arg("the SwanLab workspace", note=_UPLOAD),
        "id": Arg("a cloud experiment to resume", note=_CLOUD),
        "resume": Arg("resume policy of a cloud experiment", note=_CLOUD),
        "reinit": Arg("re-init on a repeated init", note=_CLOUD),
        "settings": Arg("swanlab.Settings", note=_CLOUD),
    }
    OUTPUT: ClassVar[str] = "swanlog/"

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        swanlab = require(type(self), "swanlab")
        tags = [str(t) for t in args.get("tags") or []]
        tags += [t for t in (info.part, info.group) if t and t not in tags]
        self.log_dir = str(args.get("logdir") or info.run_dir / "swanlog")
        kwargs = {
            "mode": args.get("mode") or "offline",
            "log_dir": self.log_dir,
            "project": info.project,
            "name": args.get("experiment_name") or info.run_name,
            "description": args.get("description"),
            "tags": tags or None,
            "config": info.config,
            "reinit": True,  # one experiment per Monitor, several in one process (tests)
        }
        self._run = swanlab.init(**{k: v for k, v in kwargs.items() if v is not None})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()
