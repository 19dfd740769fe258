"""MLflow, local: a file store under `<run_dir>/mlruns/` (or the tracking URI `uri` names).

    monitor: {monitor_type: mlflow}
    # mlflow ui --backend-store-uri <run_dir>/mlruns
    monitor: {monitor_type: mlflow, monitor_args: {uri: "sqlite:///runs/mlflow.db"}}

The experiment is `project`; the run is named `<name>` (`<name>_<part>` for one process of a
split run) with tags `group` and `part`, and the whole config as its artifact `config.json`.
Departures from Trinity-RFT: its default `uri` is a server at `http://localhost:5000`; ours is
the file store in the run folder, so nothing needs to run beside it. MLflow keeps the file store
in maintenance mode and refuses it unless `MLFLOW_ALLOW_FILE_STORE=true`, which this backend sets
for its process when the URI is a file store (unless the environment says otherwise).
`username` and `password` are passed to a tracking server as Trinity-RFT does
(`MLFLOW_TRACKING_USERNAME` / `MLFLOW_TRACKING_PASSWORD`). Metric names keep their slashes;
characters MLflow refuses become `_` (`@` becomes `_at_`, as in Trinity-RFT).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, ClassVar
from urllib.parse import urlparse

from trinity.monitor.backends import MONITOR, Arg, RunInfo, require

_REFUSED = re.compile(r"[^/\w.\- ]")


def mlflow_key(key: str) -> str:
    """`key` as a metric name MLflow accepts (module docstring)."""
    return _REFUSED.sub("_", key.replace("@", "_at_"))


def is_file_store(uri: str) -> bool:
    """A plain path or a `file:` URI (MLflow's file store), not a database or a server."""
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter


@MONITOR.register("mlflow")
class MlflowBackend:
    PACKAGE: ClassVar[str | None] = "mlflow"
    EXTRA: ClassVar[str] = "monitors"
    ARGS: ClassVar[dict[str, Arg]] = {
        "uri": Arg("tracking URI; unset: the file store <run_dir>/mlruns"),
        "username": Arg("tracking server user (MLFLOW_TRACKING_USERNAME)"),
        "password": Arg("tracking server password (MLFLOW_TRACKING_PASSWORD)"),
    }
    OUTPUT: ClassVar[str] = "mlruns/"

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        mlflow = require(type(self), "mlflow")
        from mlflow.entities import Metric

        self._metric = Metric
        uri = str(args.get("uri") or (info.run_dir / "mlruns").resolve().as_uri())
        if is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for key, env in (("username", "MLFLOW_TRACKING_USERNAME"),
                         ("password", "MLFLOW_TRACKING_PASSWORD")):  # fmt: skip
            if args.get(key):
                os.environ[env] = str(args[key])
        self.uri = uri
        self._client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(info.project)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(info.project)
        )
        tags = {"group": info.group, "part": info.part}
        run = self._client.create_run(experiment_id, run_name=info.run_name, tags=tags)
        self.run_id = run.info.run_id
        self._client.log_dict(self.run_id, info.config, "config.json")

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
