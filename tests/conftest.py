"""Shared fixtures, and the environment every test and every process it starts inherits.

Hermetic Ray: a test never joins a Ray cluster that happens to run on the machine (a user's
`ray start --head`, or one a shell's `RAY_ADDRESS` names). At import, before any test, this
module sets, for this process and so for every `trinity run` subprocess a test starts:

- `RAY_ADDRESS=local`: `ray.init()` with no address starts a new local instance, and the
  launcher's `cluster.ray_address: auto` (`trinity.launcher.run.init_ray`) announces no cluster;
- `RAY_TMPDIR=<a private folder>`: `ray start`'s address file in the machine's temp folder is not
  seen, and this session's Ray instances keep their sockets and logs apart from others'.

A test that deliberately starts its own cluster (`ray start --head --port=P` with a `RAY_TMPDIR`
of its own, or `ray.cluster_utils.Cluster`) names its address explicitly
(`cluster.ray_address=127.0.0.1:P`), which both Ray and the launcher honour over `RAY_ADDRESS`; a
test of `auto`'s own resolution passes `RAY_ADDRESS=""` to its subprocess.
`tests/test_hermetic_ray.py` proves the isolation against a live cluster.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import tempfile
from collections.abc import Mapping

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def hermetic_ray_env(environ: Mapping[str, str], ray_tmp: str) -> dict[str, str]:
    """`environ` with Ray confined to private local instances whose files live in `ray_tmp`
    (a short path: Ray's socket paths must stay under ~100 characters)."""
    return {**environ, "RAY_ADDRESS": "local", "RAY_TMPDIR": ray_tmp}


RAY_TMP = tempfile.mkdtemp(prefix="rt", dir="/tmp")
os.environ.update(hermetic_ray_env(os.environ, RAY_TMP))


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RAY_TMP, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `long` is slow as well (`make test` never runs it; `make test-slow`
    leaves it to `make test-long`). Tests marked `vllm` are skipped where vLLM is not
    installed (`.venv` has none; `make test-vllm` runs them in `.venv-vllm`)."""
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.slow)
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed here (scripts/setup.sh vllm)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from trinity.models import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", preset="1m", seed=0)


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory, tiny_model_dir):
    """One finished `trinity run` of test_e2e's GRPO config (3 steps, evaluation at steps 0, 2
    and 3, a checkpoint after every step, monitors tensorboard + wandb + mlflow and Ray's
    timeline): (the CompletedProcess, the folder holding `ckpt/`).
    Tests only read it, or copy `ckpt/` into their own folder before running on it (`copy_run`),
    so one run serves the end-to-end checks, bench mode and the rerun's fresh folder."""
    from test_e2e import grpo_config, run_trinity

    root = tmp_path_factory.mktemp("grpo_run")
    monitors = [
        "monitor.monitor_type=[tensorboard,wandb,mlflow]",
        "monitor.enable_ray_timeline=true",
    ]
    r = run_trinity(
        grpo_config(root, tiny_model_dir), overrides=["trainer.save_interval=1", *monitors]
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, root


def copy_run(grpo_run, tmp_path):
    """The shared GRPO run's `ckpt/` copied into `tmp_path`, as if the run had been made there
    with `grpo_config(tmp_path, ...)`."""
    _, root = grpo_run
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")


def postgres_required() -> bool:
    """Whether the PostgreSQL tests must run: in CI (`CI` set, as CI services and `.ci/run` do)
    or with `TRINITY_REQUIRE_POSTGRES=1`. Then a server that cannot start fails them; elsewhere
    they skip, saying why."""
    return any(
        os.environ.get(k, "") not in ("", "0", "false") for k in ("CI", "TRINITY_REQUIRE_POSTGRES")
    )


@pytest.fixture(scope="session")
def postgres_server():
    """A private PostgreSQL server for the session (`tests/postgres.py`), stopped at its end."""
    from postgres import PostgresServer, PostgresUnavailable

    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as e:
        server.stop()
        if postgres_required():
            pytest.fail(f"PostgreSQL is required here (CI / TRINITY_REQUIRE_POSTGRES): {e}")
        pytest.skip(f"no PostgreSQL server here: {e}")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server, request) -> str:
    """The URL of a new, empty database of the session's server, one per test."""
    import re

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[-50:]
    return postgres_server.create_database(f"t{next(_databases)}_{name}")


_databases = itertools.count()
