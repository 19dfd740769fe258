"""Joining a Ray cluster, or starting a private local instance, and a run's namespace."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import ray
from rich.console import Console

from trinity.common.plugins import plugin_env


def run_namespace(cfg: Any) -> str:
    """The Ray namespace of a run, `trinity:<project>/<group>/<name>`: its actors' names live
    there, so two processes of one run (mode explore + mode train) find each other by name and
    two runs never do."""
    return "trinity:" + "/".join(p for p in (cfg.project, cfg.group, cfg.name) if p)


def init_ray(
    address: str, namespace: str | None = None, env_vars: dict[str, str] | None = None
) -> bool:
    """Join the configured cluster, or start a private local instance.

    `auto` joins a cluster started with `ray start` (its address file, or RAY_ADDRESS) and
    otherwise starts a local instance that lives as long as this run; `RAY_ADDRESS=local` (Ray's
    own name for a new instance, which the test suite sets) announces no cluster, so `auto` then
    starts a local instance even where an address file names a live one. It deliberately does not
    use Ray's own `address="auto"`, which also attaches to another driver's private instance and
    dies with it. A cluster that is named but does not answer (a `ray start --head` that was
    killed leaves its address file behind) is reported and replaced by a local instance within
    seconds, instead of Ray retrying the dead address for half a minute and failing. An explicit
    `ray_address` that does not answer is an error. Returns whether it joined a cluster (False:
    a local instance of this process).

    The user's plugin directories (`TRINITY_PLUGIN_DIRS`, which `--plugin-dir` sets) reach every
    actor of the run, engines included, as the job's runtime_env: the workers of a `ray start`
    cluster never see this process's environment, and an actor loads them on its first registry
    miss (`trinity.common.plugins`). A caller that started Ray itself passes that env itself.
    `env_vars` join them there (`model.external_model`'s URL and key variables).
    """
    if ray.is_initialized():
        return True
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "ERROR",
        "configure_logging": True,
        "namespace": namespace,
    }
    if env_vars := {**plugin_env(), **(env_vars or {})}:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if address == "local":  # Ray's name for a new local instance
        ray.init(address="local", **kwargs)
        return False
    if address != "auto":
        if "://" not in address and not _answers(address):
            raise ConnectionError(
                f"cluster.ray_address={address!r}: no Ray cluster answers there "
                "(start one with `ray start --head`, or use ray_address: auto)"
            )
        ray.init(address=address, **kwargs)
        return address != "local"
    found, source = _announced_address()
    if found is not None and "://" not in found and not _answers(found):
        Console(stderr=True, highlight=False).print(
            f"[yellow]the Ray cluster at {found} ({source}) does not answer; "
            "starting a local instance[/]",
            soft_wrap=True,
        )
        ray.init(address="local", **kwargs)
        return False
    ray.init(**kwargs)
    return found is not None


def announced_cluster() -> str | None:
    """The address of the live cluster `init_ray("auto")` would join, or None (it would start a
    local instance)."""
    found, _ = _announced_address()
    if found is not None and "://" not in found and not _answers(found):
        return None
    return found


def _announced_address() -> tuple[str | None, str]:
    """The cluster `ray.init()` would join: RAY_ADDRESS, else `ray start`'s address file."""
    env = os.environ.get("RAY_ADDRESS")
    if env == "local":
        return None, "RAY_ADDRESS=local"
    if env and env != "auto":
        return env, "RAY_ADDRESS"
    from ray._private.utils import get_ray_address_file, read_ray_address

    return read_ray_address(), f"from {get_ray_address_file(None)}"


def _answers(address: str, timeout: float = 2.0) -> bool:
    """Does something accept TCP connections at `host:port` (a Ray GCS, if anything)?"""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def task_events_flush_s() -> float:
    """How long until every live worker has sent Ray the events of the calls it finished: its
    report interval (`RAY_task_events_report_interval_ms`, 1 s by default) and a margin."""
    return int(os.environ.get("RAY_task_events_report_interval_ms", "1000")) / 1000 + 0.5  # noqa: SIM112


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SAME_STOP_S = 1.0  # a stop signal this soon after another is the same stop, delivered twice


def stops_as_interrupts() -> None:
    """Make SIGTERM and SIGHUP stop this process as Ctrl-C does (a KeyboardInterrupt naming the
    signal), so a run lets its parts go and says how to continue (`launcher.summary`). Called
    again after `ray.init`, whose core worker installs its own handlers for them (which log the
    signal and abort the process). The main thread only, where Python delivers signals.

    A stop signal within `SAME_STOP_S` of another is the same stop arriving twice (a terminal's
    Ctrl-C reaches the whole process group, and a supervising parent, `launcher.supervise`,
    passes on what it gets): it is ignored, so it cannot break off the first one's way out."""
    if threading.current_thread() is not threading.main_thread():
        return
    last: list[float] = []

    def stop(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if last and now - last[-1] < SAME_STOP_S:
            return
        last.append(now)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)


def kill_and_wait(actors: list[Any], timeout_s: float = 30.0) -> bool:
    """Kill `actors` and return once Ray reports each dead: True; False if one still answered
    after `timeout_s`.

    `ray.kill` only asks: until the actor is gone, a trainer in it goes on training and can seal
    a checkpoint. A stopped run names its newest checkpoint as the one to continue from, so it
    must look only after its compute is gone (and say so when it could not wait that long).
    """
    for actor in actors:
        ray.kill(actor)
    deadline = time.monotonic() + timeout_s
    for actor in actors:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=left)
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                return False
            time.sleep(0.05)
    return True
