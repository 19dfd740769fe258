"""Weights & Biases, offline: a run folder under `<run_dir>/wandb/` (`offline-run-*`).

    monitor: {monitor_type: wandb}
    # afterwards, to upload:  wandb sync <run_dir>/wandb/offline-run-*

The wandb run is named `<name>` (`<name>_<part>` for one process of a split run), in the
project `project` and the group `group`, with the whole config as its config. Runs never talk
to a server here (no network): Trinity-RFT's `base_url` and `api_key` are accepted and noted,
since they only matter to an online run; `wandb sync` uses the ones of your environment.
Closing waits until wandb's service has written the run's file (`wandb.teardown`).
wandb keeps steps increasing: a record of an earlier step than one already logged (a resumed
run's replayed report) is dropped by wandb with a warning, and stays in `metrics.jsonl`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from trinity.monitor.backends import MONITOR, Arg, RunInfo, require

_OFFLINE = "runs are offline here; `wandb sync <run_dir>/wandb/offline-run-*` uploads them"


@MONITOR.register("wandb")
class WandbBackend:
    PACKAGE: ClassVar[str | None] = "wandb"
    EXTRA: ClassVar[str] = "monitors"
    ARGS: ClassVar[dict[str, Arg]] = {
        "base_url": Arg("the W&B server (WANDB_BASE_URL)", note=_OFFLINE),
        "api_key": Arg("the W&B API key (WANDB_API_KEY)", note=_OFFLINE),
    }
    OUTPUT: ClassVar[str] = "wandb/"

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        self._wandb = wandb = require(type(self), "wandb")
        self._run = wandb.init(
            mode="offline",
            dir=str(info.run_dir),
            project=info.project,
            group=info.group or None,
            name=info.run_name,
            job_type=info.part or None,
            config=info.config,
            reinit="create_new",  # several runs in one process (tests; one per Monitor)
            settings=wandb.Settings(console="off", quiet=True, save_code=False),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        """Finish the run and wait until its file is complete: `finish` returns before wandb's
        service has flushed an offline run to disk, `teardown` waits for it (it also ends
        any other wandb run of this process: the driver has only this one)."""
        self._run.finish()
        self._wandb.teardown()
