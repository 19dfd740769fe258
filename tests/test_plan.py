"""The run's plan (`trinity.launcher.plan`): the layout chosen when `cluster.one_process` is unset,
each stage's roles, and the name a relaunched run agrees on, decided once from the config."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e import ROOT
from test_one_process import _cfg as one_process_cfg

from trinity.config import load_config
from trinity.config.schema import TrinityConfig
from trinity.launcher.plan import plan_run


def _cfg(mode: str = "both", **over: dict) -> TrinityConfig:
    """test_one_process's small config, its layout key unset unless `cluster` sets it."""
    return one_process_cfg(
        mode, **{**over, "cluster": {"one_process": None, **over.get("cluster", {})}}
    )


def test_one_cpu_node_runs_in_one_process_unless_told_otherwise():
    plan = plan_run(_cfg(), gpus_here=False)
    assert plan.layout.one_process and "chosen" in plan.layout.why
    assert plan.cfg.cluster.one_process is True  # applied: every consumer reads a bool
    assert [s.one_process for s in plan.stages] == [True]
    assert plan.stages[0].cfg.cluster.one_process is True
    kept = plan_run(_cfg(cluster={"one_process": False}), gpus_here=False)
    assert not kept.layout.one_process
    assert kept.layout.why == "cluster.one_process: false"
    assert kept.stages[0].cfg.cluster.one_process is False


@pytest.mark.parametrize(
    ("over", "gpus", "reason"),
    [
        ({"cluster": {"node_num": 2}}, False, "spreads over 2 nodes"),
        ({}, True, "has GPUs"),
        ({"cluster": {"gpu_per_node": 1}}, False, "has GPUs"),
        ({"synchronizer": {"sync_method": "nccl"}}, False, "nccl"),
        ({"explorer": {"rollout_model": {"in_explorer_process": False}}}, False, "engine proc"),
        ({"explorer": {"rollout_model": {"max_restarts": 2}}}, False, "max_restarts"),
        ({"explorer": {"rollout_model": {"engine_type": "vllm"}}}, False, "engine_type vllm"),
        ({"explorer": {"rollout_model": {"tensor_parallel_size": 2}}}, False, "ranks are proc"),
        ({"trainer": {"num_threads": 1}, "explorer": {"rollout_model": {"num_threads": 2}}},
         False, "thread counts"),
    ],
)  # fmt: skip
def test_what_needs_processes_keeps_a_process_per_part_and_says_why(over, gpus, reason):
    plan = plan_run(_cfg(**over), gpus_here=gpus)
    assert not plan.layout.one_process
    assert reason in plan.layout.why
    assert "a process per part" in plan.layout.describe()


def test_a_one_process_run_needs_no_ray_unless_something_in_it_is_a_ray_actor(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "local")  # no cluster announced here
    plan = plan_run(_cfg(), gpus_here=False)
    assert not plan.layout.ray
    assert "without Ray: nothing in the run spans processes" in plan.layout.describe()
    assert plan_run(_cfg(cluster={"one_process": False}), gpus_here=False).layout.ray
    told = plan_run(_cfg(cluster={"ray_address": "local"}), gpus_here=False)
    assert told.layout.one_process and told.layout.ray
    assert "on Ray: cluster.ray_address: local" in told.layout.describe()
    timeline = plan_run(_cfg(monitor={"enable_ray_timeline": True}), gpus_here=False)
    assert timeline.layout.ray and "enable_ray_timeline" in timeline.layout.ray_why


def test_a_one_process_run_joins_a_cluster_that_answers(monkeypatch):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as gcs:  # something answers there
        address = f"127.0.0.1:{gcs.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        plan = plan_run(_cfg(), gpus_here=False)
    assert plan.layout.one_process and plan.layout.ray
    assert f"a Ray cluster answers at {address}" in plan.layout.ray_why


def test_gpus_the_run_is_told_not_to_use_do_not_rule_one_process_out():
    assert plan_run(_cfg(cluster={"gpu_per_node": 0}), gpus_here=True).layout.one_process


@pytest.mark.parametrize("mode", ["explore", "serve"])
def test_a_part_of_a_split_run_is_a_process_of_its_own(mode):
    plan = plan_run(_cfg(mode), gpus_here=False)
    assert not plan.layout.one_process
    assert f"mode {mode} is one process of a run split" in plan.layout.why
    (stage,) = plan.stages
    assert stage.shared and not stage.trains and stage.role == "explorer/explorer"


def test_a_trainer_fed_by_explore_processes_is_split_and_one_from_a_dataset_is_not():
    queue = plan_run(_cfg("train"), gpus_here=False)
    assert not queue.layout.one_process
    (stage,) = queue.stages
    assert stage.reads_queue and stage.shared and stage.trains and stage.role == "trainer"
    assert not stage.explores and not stage.has_explorer
    sft = {"name": "sft", "storage_type": "file", "path": "d.jsonl"}
    over = {"buffer": {"trainer_input": {"experience_buffer": sft}}}
    dataset = _cfg("train", algorithm={"algorithm_type": "sft"}, **over)
    (alone,) = plan_run(dataset, gpus_here=False).stages
    assert not alone.reads_queue and not alone.shared and alone.lockstep
    # the same file with an algorithm that trains on rollouts: experiences explore runs wrote
    (rollouts,) = plan_run(_cfg("train", **over), gpus_here=False).stages
    assert rollouts.reads_queue and rollouts.shared


def test_one_stage_that_needs_processes_decides_for_the_run_naming_the_stage():
    cfg = _cfg(
        stages=[
            {"stage_name": "warm", "synchronizer": {"sync_offset": 1}},
            {"stage_name": "rl", "cluster": {"node_num": 2}},
        ]
    )  # fmt: skip
    plan = plan_run(cfg, gpus_here=False)
    assert not plan.layout.one_process
    assert "stage rl: the run spreads over 2 nodes" in plan.layout.why
    assert [s.one_process for s in plan.stages] == [False, False]


def test_the_quickstart_plan_and_its_stages_under_a_fresh_name():
    """Stages merge onto the config as written: renaming the run (`<name>_<timestamp>`) must
    reach every stage's config and folder."""
    cfg = load_config(ROOT / "examples" / "quickstart" / "quickstart.yaml")
    plan = plan_run(cfg, gpus_here=False)
    assert plan.layout.one_process
    assert [(s.name, s.mode, s.trains, s.explores, s.evaluates) for s in plan.stages] == [
        ("sft", "train", True, False, True),
        ("grpo", "both", True, True, True),
    ]
    assert all(s.lockstep and not s.overlaps for s in plan.stages)  # on-policy: they take turns
    assert not plan.lends_cores
    renamed = plan.renamed("add2_20261128000000")
    assert renamed.layout == plan.layout
    run_dir = Path("./checkpoints/quickstart/add2_20261128000000")
    assert renamed.run_dir == run_dir
    for stage in renamed.stages:
        assert stage.cfg.name == "add2_20261128000000"
        assert stage.stage_dir == run_dir / stage.name
        assert Path(stage.resolved.run_dir) == run_dir
    text = renamed.describe()
    assert text.splitlines()[0].startswith("layout: one process (chosen")
    assert "stage grpo: mode both, starts explorer, trainer, buffer" in text
    assert "experiences per train step" in text  # each stage's batch table


def test_a_bench_of_a_staged_run_benches_its_last_stage_in_the_run_folder():
    cfg = load_config(ROOT / "examples" / "quickstart" / "quickstart.yaml", ["mode=bench"])
    (stage,) = plan_run(cfg, gpus_here=False).stages
    assert (stage.name, stage.mode, stage.stage_dir) == (
        "bench",
        "bench",
        Path("./checkpoints/quickstart/add2"),
    )


def test_overlapping_sides_in_one_process_lend_cores():
    assert plan_run(_cfg(synchronizer={"sync_offset": 1}), gpus_here=False).lends_cores
    assert not plan_run(
        _cfg(synchronizer={"sync_offset": 1}, cluster={"one_process": False}), gpus_here=False
    ).lends_cores
