"""The test session's Ray is hermetic: with a live `ray start --head` cluster announced both ways
a machine can announce one (`ray start`'s address file in the temp folder, and a shell's exported
`RAY_ADDRESS`), a process with the environment `conftest.py` gives every test starts its own local
instance, through the launcher's `ray_address: auto` and through a bare `ray.init()` alike.

The cluster runs on a private port with a Ray temp folder of its own, and the "machine's" temp
folder holding its address file is a private folder too: no other Ray user on this machine sees
or is disturbed by any of it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import RAY_TMP, hermetic_ray_env
from test_plugins import ray_head

ROOT = Path(__file__).resolve().parents[1]

# where a process's Ray goes through `init_ray("auto")` (as `trinity run` with the default
# `cluster.ray_address: auto`) and through a bare `ray.init()` (as a test that starts Ray itself)
PROBE = """
import json, ray, sys
from trinity.launcher.run import init_ray
joined = init_ray("auto")
via_launcher = ray.get_runtime_context().gcs_address
ray.shutdown()
via_ray_init = None
if sys.argv[1] == "both":
    ray.init(logging_level="ERROR")
    via_ray_init = ray.get_runtime_context().gcs_address
    ray.shutdown()
print(json.dumps([joined, via_launcher, via_ray_init]))
"""

# the drivers that ever connected to the cluster at `address`, as the cluster itself counts them
JOBS = """
import json, ray, sys
ray.init(address=sys.argv[1], logging_level="ERROR")
print(len(ray._private.state.jobs()))
"""


def probe(env: dict[str, str], ways: str = "both") -> tuple[bool, str, str | None]:
    """(init_ray("auto") joined a cluster, its GCS port, a bare ray.init()'s GCS port, unless
    `ways` is "launcher"): ports, since Ray reports the node's IP for a head on 127.0.0.1."""
    r = subprocess.run(
        [sys.executable, "-c", PROBE, ways], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    joined, via_launcher, via_ray_init = json.loads(r.stdout.strip().splitlines()[-1])
    return joined, port(via_launcher), via_ray_init and port(via_ray_init)


def port(address: str) -> str:
    return address.rpartition(":")[2]


def test_the_session_environment_is_hermetic() -> None:
    # every test, and every process a test starts, inherits these from conftest.py
    assert os.environ["RAY_ADDRESS"] == "local"
    assert os.environ["RAY_TMPDIR"] == RAY_TMP and Path(RAY_TMP).is_dir()


@pytest.mark.long  # a topology: a live `ray start --head` cluster and three drivers
def test_a_live_announced_cluster_is_never_joined(tmp_path) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    # the cluster's token, given to head and drivers alike (Ray's token auth is on by default)
    base |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    machine_tmp = Path(tempfile.mkdtemp(prefix="rm", dir="/tmp"))  # stands for the machine's /tmp
    own_tmp = Path(tempfile.mkdtemp(prefix="ro", dir="/tmp"))
    try:
        with ray_head(base) as address:
            head = port(address)
            (machine_tmp / "ray").mkdir()
            (machine_tmp / "ray" / "ray_current_cluster").write_text(address)  # as `ray start`
            # 1. the trap is real: without the session's environment, both ways join the cluster
            announced = {**base, "RAY_TMPDIR": str(machine_tmp)}
            assert probe(announced) == (True, head, head)
            # 2. the session's environment over a shell that exports RAY_ADDRESS as well: a local
            # instance each time, never the cluster
            shell = {**announced, "RAY_ADDRESS": address}
            joined, via_launcher, via_ray_init = probe(hermetic_ray_env(shell, str(own_tmp)))
            assert not joined
            assert head not in (via_launcher, via_ray_init), (head, via_launcher, via_ray_init)
            # 3. RAY_ADDRESS=local alone keeps the launcher's `auto` off a live address file
            # (`trinity.launcher.run._announced_address`; Ray's own `ray.init()` honours it anyway)
            joined, via_launcher, _ = probe({**announced, "RAY_ADDRESS": "local"}, "launcher")
            assert not joined and via_launcher != head, (head, via_launcher)
            # 4. the cluster's own count: the two drivers of step 1 and this one, no other
            jobs = subprocess.run(
                [sys.executable, "-c", JOBS, address], capture_output=True, text=True, env=base,
                timeout=120,
            )  # fmt: skip
            assert jobs.returncode == 0, jobs.stderr[-3000:]
            assert jobs.stdout.strip().splitlines()[-1] == "3", jobs.stdout
    finally:
        shutil.rmtree(machine_tmp, ignore_errors=True)
        shutil.rmtree(own_tmp, ignore_errors=True)
