"""A private `ray start --head` cluster for tests of runs split over processes.

On its own port and temp dir, with its own auth token, so it never meets another test's or a
user's cluster; `trinity run` processes join it with `cluster.ray_address=127.0.0.1:<port>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Cluster:
    port: int
    env: dict[str, str]  # what a process needs to join it (token, temp dir)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def private_cluster(num_cpus: int = 2) -> Iterator[Cluster]:
    ray_tmp = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # short: Ray's socket paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the cluster's token, given to head and drivers alike (Ray's token auth is on by default)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), **auth}
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", f"--num-cpus={num_cpus}", "--include-dashboard=false",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "ray start --head did not come up"
                time.sleep(0.5)
        yield Cluster(port, env)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        subprocess.run(["pkill", "-f", str(ray_tmp)], check=False)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def named_actors(cluster: Cluster, namespace: str) -> list[str]:
    """The named actors left in `namespace` of the cluster."""
    probe = (
        "import ray\n"
        f"ray.init(address='{cluster.address}', namespace='{namespace}', logging_level='ERROR')\n"
        "import json\n"
        "print(json.dumps(ray.util.list_named_actors(all_namespaces=False)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=cluster.env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
