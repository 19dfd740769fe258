"""TensorBoard event files under `<run_dir>/tensorboard/[<part>/]`.

monitor: {monitor_type: tensorboard}    # tensorboard --logdir <run_dir>/tensorboard
"""

from __future__ import annotations

from typing import Any, ClassVar

from trinity.monitor.backends import MONITOR, Arg, RunInfo


@MONITOR.register("tensorboard")
class TensorBoardBackend:
    PACKAGE: ClassVar[str | None] = None  # torch's writer; tensorboard is a main dependency
    EXTRA: ClassVar[str] = ""
    ARGS: ClassVar[dict[str, Arg]] = {}
    OUTPUT: ClassVar[str] = "tensorboard/"

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(info.run_dir / "tensorboard" / info.part))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
