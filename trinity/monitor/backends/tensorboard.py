"""TensorBoard event files under `<run_dir>/tensorboard/[<part>/]`.

monitor: {monitor_type: tensorboard}    # tensorboard --logdir <run_dir>/tensorboard

Written with the `tensorboard` package's own event writer, one scalar summary per metric (what
`torch.utils.tensorboard.SummaryWriter.add_scalar` writes), so the driver that logs them never
imports torch.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from trinity.monitor.backends import MONITOR, Arg, RunInfo


@MONITOR.register("tensorboard")
class TensorBoardBackend:
    PACKAGE: ClassVar[str | None] = None  # tensorboard is a main dependency
    EXTRA: ClassVar[str] = ""
    ARGS: ClassVar[dict[str, Arg]] = {}
    OUTPUT: ClassVar[str] = "tensorboard/"

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(info.run_dir / "tensorboard" / info.part))

    def log(self, metrics: dict[str, float], step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        event = self._event(wall_time=time.time(), step=step, summary=self._summary(value=values))
        self._writer.add_event(event)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
