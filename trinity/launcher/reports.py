"""Waiting on the run's actors while their metric reports reach the monitor as they come."""

from __future__ import annotations

import re
import time
from typing import Any

from trinity.common import refs
from trinity.monitor.monitor import Monitor

REPORTS_WAIT_S = 5.0  # the longest one `MetricsHub.reports` call waits (the driver calls again)
CHECK_S = 2.0  # how often the driver lets the stall doctor look (`monitor.stall`)


_HEADLINE = re.compile(r"^eval/.+/(accuracy|avg@\d+_ci_(low|high)|pass@\d+(_ci_(low|high))?)$")


def accuracies(metrics: dict[str, float]) -> dict[str, float]:
    """What a stage's summary keeps of an evaluation: each eval set's `accuracy`, its pass@k
    and the intervals of both (`avg@n_ci_*` is accuracy's)."""
    return {k: v for k, v in metrics.items() if _HEADLINE.match(k)}


def _merge(reports: list[Any], monitor: Monitor) -> None:
    for source, step, metrics, replay in reports:
        monitor.add(source, step, metrics, replay)


def _pump(hub: Any, monitor: Monitor) -> None:
    _merge(refs.get(hub.drain.remote()), monitor)


def wait(ref: Any, hub: Any, monitor: Monitor) -> Any:
    return wait_all([ref], hub, monitor)[0]


def wait_all(calls: list[Any], hub: Any, monitor: Monitor) -> list[Any]:
    """Wait for all `calls` (their refs) while merging the hub's reports as they come (`MetricsHub.reports`).
    The first failure is raised at once, after what the other actors reported is kept."""
    pending = list(calls)
    news = hub.reports.remote(REPORTS_WAIT_S)
    doctor, checked = monitor.doctor, time.monotonic()
    try:
        while pending:
            # bounded: the doctor looks even when nothing comes back (the hub's loop stuck too)
            done, _ = refs.wait([*pending, news], num_returns=1, timeout=CHECK_S)
            if doctor is not None and time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                doctor.check()  # a stall: reported; raises with monitor.on_stall: fail
            if not done:
                continue
            if done[0] == news:
                _merge(refs.get(news), monitor)
                news = hub.reports.remote(REPORTS_WAIT_S)
                continue
            pending.remove(done[0])
            refs.get(done[0])  # raises the actor's exception, with its traceback
    except BaseException as err:
        try:
            _settle(hub, news, monitor)
        except Exception as lost:
            err.add_note(f"the reports made before this failure were not merged: {lost!r}")
        raise
    _settle(hub, news, monitor)
    return refs.get(calls)


def _settle(hub: Any, news: Any, monitor: Monitor) -> None:
    """Merge the waiting `reports` call's reports (ended now) and any left in the hub."""
    hub.wake.remote()
    _merge(refs.get(news), monitor)
    _pump(hub, monitor)
