"""A second live process of a run that would start an explorer (or serve endpoint) under a name
another process of the run holds is refused with the config key to change, not Ray's
duplicate-actor error. Real Ray, two `StageParts` standing for the run's two processes."""

from __future__ import annotations

import collections
import types

import pytest
import ray

from trinity.config.problems import ConfigError
from trinity.launcher.stage import StageParts

Part = collections.Counter  # an actor class its workers import by itself (not from tests/)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, namespace="stage-names")
    yield
    ray.shutdown()


def _stage() -> types.SimpleNamespace:
    cfg = types.SimpleNamespace(
        project="p", group="", name="run1", explorer=types.SimpleNamespace(name="explorer")
    )
    return types.SimpleNamespace(name="main", cfg=cfg, one_process=False)


def test_a_second_explorer_of_one_name_is_refused_naming_explorer_name(ray_local):
    ctx = types.SimpleNamespace(host=None)
    first = StageParts(_stage(), ctx).start(Part, "explorer/explorer")
    assert ray.get(first.total.remote()) == 0
    with pytest.raises(ConfigError) as e:
        StageParts(_stage(), ctx).start(Part, "explorer/explorer")
    text = str(e.value)
    assert "explorer.name" in text and "--set explorer.name=explorer-2" in text
    assert "run1" in text
    # another name is another explorer of the run
    other = StageParts(_stage(), ctx).start(Part, "explorer/explorer-2")
    assert ray.get(other.total.remote()) == 0
