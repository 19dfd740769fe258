"""Experience replay (`trinity/buffer/replay.py`): reads by priority, reuse with use counts,
limits, cooldowns, eviction and a staleness bound, all durable in the sql storage (SQLite and
PostgreSQL), and a restarted trainer replaying exactly what its checkpoint had trained."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import sqlalchemy as sa
import torch
from storages import payloads_as_json_text

from trinity.buffer.replay import (
    ReplaySpec,
    decay_limit_randomization,
    group_noise,
    linear_decay,
    priority_args_problem,
)
from trinity.buffer.sql import SQLStorage
from trinity.buffer.sql_schema import SCHEMA_VERSION, meta
from trinity.buffer.sql_url import database_url
from trinity.buffer.storage import BufferClosed, storage_class
from trinity.common.experience import EID, Experience


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "b.sqlite")
    return request.getfixturevalue("postgres_url")


def group(batch: int, task: int, version: int, size: int = 2) -> list[Experience]:
    """One task's `size` samples of explore step `batch`, made by weights `version`."""
    return [
        Experience(
            tokens=torch.tensor([1, 2, batch, task, r]),
            prompt_length=3,
            logprobs=torch.tensor([-0.5, -0.25]),
            reward=float(r),
            eid=EID(batch=batch, task=task, run=r),
            model_version=version,
        )
        for r in range(size)
    ]


def keys(lease) -> list[tuple[int, int, int]]:
    """(batch, task, use_count) of each experience read, in order."""
    return [(e.eid.batch, e.eid.task, e.info["use_count"]) for e in lease.experiences]


def open_(db: str, capacity: int = 100, settled=(), **spec) -> SQLStorage:
    """A replay storage; reused at once unless `spec` says otherwise."""
    spec = {"reuse_cooldown_time": 0.0} | spec
    return SQLStorage(db, capacity, list(settled), name="p/r/exp", replay=ReplaySpec(**spec))


# -- the priority functions (Trinity-RFT's names and formulas) -----------------------------------


def test_priority_functions_by_hand():
    assert linear_decay(5, 0, 0.3) == (5.0, True)
    assert linear_decay(5, 2, 0.3, decay=1.5) == (2.0, True)
    # put back while the use count is under the limit; sigma scales the group's noise
    assert decay_limit_randomization(4, 1, 0.5) == (2.0, True)
    assert decay_limit_randomization(4, 3, 0.5) == (-2.0, False)
    assert decay_limit_randomization(4, 1, 0.5, sigma=2.0) == (3.0, True)
    assert decay_limit_randomization(4, 9, 0.0, use_count_limit=0) == (-14.0, True)
    # the noise is a fixed draw per group and use count, not per call
    assert group_noise("3/1/", 2) == group_noise("3/1/", 2) != group_noise("3/1/", 1)
    spec = ReplaySpec("decay_limit_randomization", {"sigma": 1.0})
    assert spec.priority(4, 1, "3/1/") == (2.0 + group_noise("3/1/", 1), True)


def test_priority_arguments_are_checked_by_name():
    assert priority_args_problem("linear_decay", {"decay": 1.0}) is None
    assert "unknown: use_count_limit" in priority_args_problem(
        "linear_decay", {"use_count_limit": 2}
    )
    assert "Valid names: decay_limit_randomization, linear_decay" in priority_args_problem(
        "lifo", {}
    )


# -- reads by priority, reuse, limits ------------------------------------------------------------


def test_reads_take_groups_by_priority_and_reuse_them_up_to_the_limit(db):
    """decay 2, use_count_limit 2: each group is read twice, the newest weights and the least
    used first, ties in write order; the copies carry their use count."""

    async def main():
        s = open_(db, priority_fn="decay_limit_randomization",
                  priority_fn_args={"decay": 2.0, "use_count_limit": 2})  # fmt: skip
        await s.register_writer("w")
        await s.write(group(0, 0, version=0) + group(0, 1, version=0) + group(1, 0, version=1))
        # priorities: (1, 0) -> 1; (0, 0), (0, 1) -> 0
        assert keys(await s.read(2)) == [(1, 0, 0)] * 2
        # its copy has priority 1 - 2 = -1: below both fresh groups of version 0
        assert keys(await s.read(4)) == [(0, 0, 0)] * 2 + [(0, 1, 0)] * 2
        # copies: (1, 0) -1, (0, 0) -2, (0, 1) -2; each at its second and last use
        assert keys(await s.read(6)) == [(1, 0, 1)] * 2 + [(0, 0, 1)] * 2 + [(0, 1, 1)] * 2
        await s.release_writer("w")
        with pytest.raises(BufferClosed):  # nothing was put back after the second use
            await s.read(2, timeout=5)
        counts = await s.stats()
        assert counts["written"] == 6 and counts["pending"] == 0 and counts["trained_twice"] == 0
        assert counts["replay_pending"] == 6  # read (leased), not acked yet
        s.shutdown()

    asyncio.run(main())


def test_a_cooldown_holds_a_group_back_until_it_has_passed(db):
    async def main():
        s = open_(db, reuse_cooldown_time=0.6)
        await s.register_writer("w")
        await s.write(group(0, 0, version=0))
        t0 = time.monotonic()
        assert keys(await s.read(2)) == [(0, 0, 0)] * 2
        with pytest.raises(TimeoutError):  # the only rows are cooling down
            await s.read(2, timeout=0.2)
        assert keys(await s.read(2, timeout=5)) == [(0, 0, 1)] * 2
        assert time.monotonic() - t0 >= 0.6
        # a draining read does not wait for a cooldown, and makes no more copies
        await s.release_writer("w")
        assert keys(await s.read(2, timeout=0.3)) == [(0, 0, 2)] * 2
        with pytest.raises(BufferClosed):
            await s.read(2, timeout=0.3)
        s.shutdown()

    asyncio.run(main())


def test_without_a_cooldown_reads_go_by_priority_and_nothing_is_reused(db):
    """reuse_cooldown_time None: Trinity-RFT's meaning (never reused); reads newest first."""

    async def main():
        s = open_(db, reuse_cooldown_time=None)
        await s.register_writer("w")
        await s.write(group(0, 0, version=0) + group(1, 0, version=1))
        assert keys(await s.read(2)) == [(1, 0, 0)] * 2
        assert keys(await s.read(2)) == [(0, 0, 0)] * 2
        await s.release_writer("w")
        with pytest.raises(BufferClosed):
            await s.read(2, timeout=5)
        assert "replayed" not in await s.stats()  # no copy was ever made
        s.shutdown()

    asyncio.run(main())


def test_copies_beyond_capacity_are_evicted_lowest_priority_first_and_never_block_a_write(db):
    async def main():
        s = open_(db, capacity=4)
        await s.register_writer("w")
        await s.write(group(0, 0, version=0) + group(1, 0, version=1))  # 4 pending: full
        await s.read(4)  # copies: (1, 0) at -1, (0, 0) at -2: 4 pending copies, none evicted
        await s.write(group(2, 0, version=2))  # 2 fresh + 4 copies > 4: (0, 0)'s copies go
        counts = await s.stats()
        assert counts["replay_evicted"] == 2 and counts["replay_pending"] == 2
        assert keys(await s.read(4)) == [(2, 0, 0)] * 2 + [(1, 0, 1)] * 2
        s.shutdown()

    asyncio.run(main())


def test_copies_of_stale_weights_are_dropped_and_counted(db):
    async def main():
        s = open_(db, max_staleness=1)
        await s.register_writer("w")
        await s.write(group(0, 0, version=0))
        await s.read(2)  # a copy of version 0
        await s.write(group(1, 0, version=2))  # now version 0 is 2 behind: its copy is stale
        assert keys(await s.read(2)) == [(1, 0, 0)] * 2
        counts = await s.stats()
        assert counts["replay_stale"] == 2 and counts["replay_pending"] == 2  # (1, 0)'s copy
        s.shutdown()

    asyncio.run(main())


# -- durable: a restart keeps what was trained, and replays exactly what the checkpoint had -----


def test_use_counts_and_priorities_survive_a_restart_and_unacked_reads_are_replayed_again(db):
    """Lease 1 is acked (its checkpoint was saved), lease 2 is not (the trainer died): after the
    restart, lease 2's rows are read again and the copy lease 2's read made is gone; lease 1's
    copies are still there, with their use counts."""

    async def main():
        s = open_(db, priority_fn="decay_limit_randomization",
                  priority_fn_args={"use_count_limit": 3})  # fmt: skip
        await s.register_writer("w")
        await s.write(group(0, 0, version=0) + group(0, 1, version=0))
        first = await s.read(2)  # (0, 0) -> copy at -2
        await s.ack([first.id])
        second = await s.read(4)  # (0, 1) at 0, then (0, 0)'s copy at -2 -> copies of both
        assert keys(second) == [(0, 1, 0)] * 2 + [(0, 0, 1)] * 2
        s.shutdown()  # the trainer's process dies with lease `second` open

        s = open_(db, settled=[first.id], priority_fn="decay_limit_randomization",
                  priority_fn_args={"use_count_limit": 3})  # fmt: skip
        back = await s.reader_started([first.id])
        assert back["returned"] == 4
        counts = await s.stats()
        assert counts["trained"] == 2 and counts["replay_pending"] == 2  # (0,0)'s first copy
        assert keys(await s.read(4)) == [(0, 1, 0)] * 2 + [(0, 0, 1)] * 2  # as before the crash
        assert keys(await s.read(4)) == [(0, 1, 1)] * 2 + [(0, 0, 2)] * 2
        s.shutdown()

    asyncio.run(main())


def test_a_version_1_database_is_migrated_and_its_rows_read(db):
    """A database the storage wrote before replay (schema 1) gets the replay columns at open."""

    async def main():
        s = SQLStorage(db, name="p/r/exp")
        await s.register_writer("w")
        await s.write(group(0, 0, version=0))
        s.shutdown()
        payloads_as_json_text(database_url(db))  # back to version 1: JSON payloads,
        engine = sa.create_engine(database_url(db))
        with engine.begin() as conn:  # and no replay columns
            conn.exec_driver_sql("DROP INDEX trinity_experience_origin")
            for column in ("reason", "group_key", "uses", "priority", "ready_at", "origin"):
                conn.exec_driver_sql(f"ALTER TABLE trinity_experience DROP COLUMN {column}")
            conn.execute(meta.update().values(value="1"))
        engine.dispose()
        s = open_(db)
        assert keys(await s.read(2)) == [(0, 0, 0)] * 2  # written without a priority: read
        s.shutdown()
        engine = sa.create_engine(database_url(db))
        with engine.begin() as conn:
            assert conn.execute(sa.select(meta.c.value)).scalar_one() == str(SCHEMA_VERSION)
        engine.dispose()

    asyncio.run(main())


# -- config -------------------------------------------------------------------------------------


def test_a_queue_with_replay_is_the_sql_storage_and_bad_settings_are_refused(tmp_path):
    from trinity.config import ConfigError, load_config

    assert storage_class("queue", replay=True) is SQLStorage
    assert storage_class("queue").__name__ == "QueueStorage"

    def problems(replay: str, storage: str = "queue") -> dict[str, str]:
        path = tmp_path / "cfg.yaml"
        path.write_text(
            f"model: {{model_path: m}}\nmode: train\nalgorithm: {{algorithm_type: grpo}}\n"
            f"buffer:\n  trainer_input:\n    experience_buffer:\n      name: e\n"
            f"      storage_type: {storage}\n      path: x.jsonl\n"
            f"      replay_buffer: {replay}\n"
        )
        try:
            load_config(path)
        except ConfigError as e:
            return {p.path: p.message for p in e.problems}
        return {}

    at = "buffer.trainer_input.experience_buffer.replay_buffer"
    assert problems("{enable: true, priority_fn: decay_limit_randomization}") == {}
    got = problems("{enable: true, priority_fn_args: {use_count_limit: 2}}")
    assert "unknown: use_count_limit" in got[f"{at}.priority_fn_args"]
    assert "read once, in order" in problems("{enable: true}", storage="file")[f"{at}.enable"]


# -- a run ------------------------------------------------------------------------------------


@pytest.mark.slow  # a whole run (10-20 s on 2 cores)
def test_a_grpo_run_with_a_replay_queue_trains_each_group_at_most_its_limit(
    tmp_path, tiny_model_dir
):
    """Trinity-RFT's replay example's buffer (a queue with replay, decay_limit_randomization) in
    `trinity run`, mode both: the buffer is the sql storage's file in the run folder; the
    trainer's 6 steps of 16 take fresh groups and their copies, each group read at most twice,
    nothing trained twice by accident, every fresh experience the trainer read trained."""
    from test_e2e import buffer_counts, grpo_config, run_trinity

    config = grpo_config(tmp_path, tiny_model_dir)
    text = config.read_text().replace("total_steps: 3", "total_steps: 6")
    text = text.replace(
        "{name: exp, storage_type: queue}",
        "{name: exp, storage_type: queue, replay_buffer: {enable: true, reuse_cooldown_time: 0, "
        "priority_fn: decay_limit_randomization, priority_fn_args: {use_count_limit: 2}}}",
    )
    config.write_text(text)
    r = run_trinity(config)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (tmp_path / "ckpt/e2e/grpo/buffer/exp.db").exists()  # no queue log
    counts = buffer_counts(config, "buffer/exp.sqlite e2e/grpo/exp")
    assert counts["trained"] + counts["replayed"] == 6 * 16  # 6 steps of 4 tasks x 4 samples
    assert counts["trained_twice"] == 0 and counts["leased"] == 0
    assert counts["replayed"] <= counts["trained"]  # one reuse per group at most
    assert counts["written"] == counts["trained"] + counts["dropped"] + counts["pending"]


def test_a_batch_reports_its_reuse():
    from trinity.buffer.replay import replay_metrics

    batch = group(0, 0, version=0, size=4)
    assert replay_metrics(batch) == {}  # a storage without replay
    for e, uses in zip(batch, (0, 0, 1, 3), strict=True):
        e.info["use_count"] = uses
    assert replay_metrics(batch) == {
        "replay/reused": 2.0,
        "replay/use_count_mean": 1.0,
        "replay/use_count_max": 3.0,
    }


def test_finishing_drops_copies_without_counting_them_as_experiences_written(db):
    async def main():
        s = open_(db)
        await s.register_writer("w")
        await s.write(group(0, 0, version=0) + group(0, 1, version=0))
        await s.read(2)  # (0, 0) read: one copy of it pending, (0, 1) pending
        assert await s.finish() == 2  # (0, 1): the copies are not experiences written
        counts = await s.stats()
        assert counts["dropped"] == 2 and counts["replay_dropped"] == 2
        s.shutdown()

    asyncio.run(main())


@pytest.mark.slow  # a whole run (about 40 s on 2 cores: PPO with a critic)
def test_trinity_rft_s_replay_example_runs_with_a_tiny_model(tmp_path):
    """Trinity-RFT's examples/ppo_countdown_exp_replay/countdown.yaml, unchanged but for the
    model, the data and the sizes: PPO from a replay queue (explorer_driven sync) runs 3 steps."""
    from test_e2e import ROOT, buffer_counts, run_trinity

    from trinity.tasks.synthetic import countdown

    data = tmp_path / "countdown.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in countdown("train", num_tasks=40)))
    config = ROOT / "tests/data/trinity_configs/ppo_countdown_exp_replay.yaml"
    sets = {
        "model.model_path": "tiny://1m", "model.max_response_tokens": 8,
        "model.max_model_len": 128, "buffer.explorer_input.taskset.path": str(data),
        "cluster.gpu_per_node": 0, "cluster.ray_address": "local", "buffer.batch_size": 4,
        "buffer.total_steps": 3, "checkpoint_root_dir": str(tmp_path / "ckpt"),
    }  # fmt: skip
    r = run_trinity(
        config, timeout=600, overrides=[f"{k}={v}" for k, v in sets.items()], cache=tmp_path
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "a queue with replay keeps its experiences" in r.stdout + r.stderr  # a note
    local = tmp_path / "local.yaml"  # `trinity buffer stats --config` of the same run
    local.write_text(
        config.read_text().replace(
            "checkpoint_root_dir: ${oc.env:TRINITY_CHECKPOINT_ROOT_DIR,./checkpoints}",
            f"checkpoint_root_dir: {tmp_path / 'ckpt'}",
        )
    )
    run = "Trinity-RFT-countdown-experience-replay/qwen2.5-1.5B-countdown"
    counts = buffer_counts(local, f"buffer/experience_buffer.sqlite {run}/experience_buffer")
    assert counts["trained"] == 3 * 4 * 5 and counts["trained_twice"] == 0  # 4 tasks x 5


def test_notes_say_where_a_replay_queue_lives_and_that_no_cooldown_reuses_nothing():
    from trinity.config.buffer_schema import StorageConfig
    from trinity.config.support import replay_notes

    queue = StorageConfig(name="e", storage_type="queue", replay_buffer={"enable": True})
    where, never = replay_notes(queue)
    assert "sql storage's SQLite file" in where and "nothing is reused" in never
    sql = StorageConfig(
        name="e", storage_type="sql", replay_buffer={"enable": True, "reuse_cooldown_time": 0}
    )
    assert replay_notes(sql) == []
    assert replay_notes(StorageConfig(name="e", storage_type="queue")) == []


SLOW_ENV = """
import asyncio
import json
from trinity.workflows.math_workflow import MathWorkflow
class SlowEnv(MathWorkflow):
    '''An episode that takes 1.5 s of waiting (an environment, a tool, a sandbox).'''
    async def run(self, task, model):
        await asyncio.sleep(1.5)
        return await super().run(task, model)
"""


@pytest.mark.long  # two whole runs (about 60 s on 2 cores)
def test_with_a_slow_explorer_replay_trains_twice_per_explore_step(tmp_path, tiny_model_dir):
    """An explorer slower than the trainer (1.5 s episodes: slower than a train step on a busy
    machine too; 0.4 s was not under a load of 6 on 2 cores), trainer_driven sync: without
    replay the trainer waits for every explore step; with replay (each group twice, no
    cooldown) it trains a group's copy while the explorer works, so its 8 steps take about half
    the explore steps, and the explorer samples with weights that advance about 2 versions a
    step."""
    from test_e2e import ROOT, grpo_config, run_trinity, user_module

    user_module(tmp_path, "slowpkg", "slow", SLOW_ENV)
    found = {}
    for name in ("plain", "replay"):
        folder = tmp_path / name
        folder.mkdir()
        config = grpo_config(folder, tiny_model_dir)
        text = config.read_text().replace("total_steps: 3", "total_steps: 8")
        text = text.replace("name: grpo", f"name: {name}")
        if name == "replay":
            text = text.replace(
                "{name: exp, storage_type: queue}",
                "{name: exp, storage_type: queue, replay_buffer: {enable: true, "
                "reuse_cooldown_time: 0, priority_fn: decay_limit_randomization, "
                "priority_fn_args: {use_count_limit: 2}}}",
            )
        config.write_text(text + "synchronizer: {sync_style: trainer_driven}\n")
        r = run_trinity(
            config,
            env_extra={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
            overrides=[
                "buffer.explorer_input.default_workflow_type=slowpkg.slow.SlowEnv",
                "explorer.eval_interval=0",
                "explorer.eval_on_startup=false",
            ],
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        recs = [json.loads(x) for x in (folder / f"ckpt/e2e/{name}/metrics.jsonl").open()]
        found[name] = {
            "explore": [x["rollout/model_version"] for x in recs if "rollout/model_version" in x],
            "reused": [x.get("replay/reused", 0) for x in recs if "train/loss" in x],
        }
    plain, replay = found["plain"], found["replay"]
    assert len(plain["reused"]) == len(replay["reused"]) == 8  # train steps
    assert not any(plain["reused"]) and len(plain["explore"]) >= 8
    assert sum(u > 0 for u in replay["reused"]) >= 3, replay  # about every other step
    assert len(replay["explore"]) <= 6, replay  # about 4-5 explore steps for 8 train steps
    assert replay["explore"][-1] >= 2 * (len(replay["explore"]) - 2), replay  # newer weights
