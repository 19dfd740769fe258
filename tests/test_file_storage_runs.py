"""An explore-only run fills an experience file (JSONL, or a folder of Parquet parts); a
train-only run, SIGKILLed after its second checkpoint with every actor of the run (its buffer's
too), and started again with `continue_from_checkpoint: true`, trains on it exactly once (slow:
real processes).

The explore run ends before the train run starts, so the file and its sidecar are all they share:
the train run has no step budget and ends when the file is drained (the explore run's writer
released it, `buffer/file_storage.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.ray_cluster import named_actors
from tests.test_topologies import (
    PER_STEP,
    assert_clean,
    config,
    counts,
    explored_steps,
    finish,
    start,
    trained_steps,
    wait_exit,
    wait_for_step,
)
from trinity.buffer.parquet_format import experiences, parts
from trinity.buffer.stats import store_counts
from trinity.common.experience import Experience

pytestmark = pytest.mark.slow

STEPS = 6


def kill_run_actors(cluster, namespace: str) -> None:
    """SIGKILL-like end of every named actor of the run (`ray.kill`, no restart)."""
    probe = (
        "import ray\n"
        f"ray.init(address='{cluster.address}', namespace='{namespace}', logging_level='ERROR')\n"
        "for a in ray.util.list_named_actors():\n"
        "    ray.kill(ray.get_actor(a), no_restart=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=cluster.env, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    deadline = time.time() + 30
    while named_actors(cluster, namespace) and time.time() < deadline:
        time.sleep(0.5)


def stored(store) -> list[Experience]:
    """What the store holds, in write order: its JSONL lines or its Parquet parts' rows."""
    if store.is_dir():
        return [e for part in parts(store) for e in experiences(part)]
    return [Experience.from_dict(json.loads(x)) for x in store.read_text().splitlines()]


@pytest.fixture(scope="module")
def cluster():
    from tests.ray_cluster import private_cluster

    with private_cluster() as c:
        yield c


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.long) for n in ("exp.jsonl", "exp.parquet")]
)
def test_explore_run_writes_a_file_a_killed_train_run_resumes_on_it_exactly(
    tmp_path, tiny_model_dir, cluster, name
):
    cfg = config(tmp_path, tiny_model_dir, "file_split")
    file = tmp_path / "rollouts" / name
    cfg.write_text(
        cfg.read_text().replace("storage_type: queue", f"storage_type: file, path: {file}")
    )
    run_dir = tmp_path / "ckpt" / "topo" / "file_split"
    # 1. the explore-only run: STEPS steps into the file, then it ends
    wait_exit(start(cfg, cluster, "mode=explore", f"buffer.total_steps={STEPS}"), 300)
    assert explored_steps(run_dir, ".explorer-explorer") == list(range(1, STEPS + 1))
    written = stored(file)
    assert len(written) == STEPS * PER_STEP
    assert {e.model_version for e in written} == {0}  # no trainer
    if file.is_dir():
        assert len(parts(file)) == STEPS  # one part per explore step
    # 2. the train-only run, killed after its checkpoint at step 2 (save_interval 2); half an
    # explore step per train step, so 12 steps: the kill lands mid-run even when the metrics
    # file trails the trainer by several steps (a loaded machine)
    half = PER_STEP // 2
    train_args = ("mode=train", "trainer.save_interval=2", f"buffer.train_batch_size={half}")
    trainer = start(cfg, cluster, *train_args)
    wait_for_step(run_dir / "metrics.trainer.jsonl", "train/loss", 3, [trainer], 300)
    assert trainer.poll() is None, "the train run ended before the kill"
    trainer.kill()  # SIGKILL: no clean-up of any kind
    trainer.communicate()
    kill_run_actors(cluster, "trinity:topo/file_split")  # the buffer's process too: only the
    assert named_actors(cluster, "trinity:topo/file_split") == []  # file and sidecar are left
    (left,) = store_counts(str(file)).values()
    assert left["trained"] % (2 * half) == 0 < left["trained"]  # acked at checkpoints only
    assert left["trained"] + left["pending"] + left["leased"] == STEPS * PER_STEP, left
    assert left["trained"] < STEPS * PER_STEP and left["trained_twice"] == 0, left
    # 3. started again: from its newest checkpoint, the leases it had not acked handed out again
    again = start(cfg, cluster, *train_args, "continue_from_checkpoint=true")
    outs = finish({"train": again}, bound_s=300)
    assert "joining the live run" not in outs["train"], outs["train"][-3000:]
    steps = trained_steps(run_dir, ".trainer")
    assert sorted(set(steps)) == list(range(1, 2 * STEPS + 1)), steps
    assert_clean(counts(cfg), trained=STEPS * PER_STEP)  # none lost, none trained twice
    assert len(stored(file)) == STEPS * PER_STEP  # the file only grew by writes
