"""`cluster.one_process`: the explorer (its rollout engines on threads), the trainer and the run's
services are objects of one Ray worker process, the run's `ServiceHost`.

The checks refuse what one process cannot be (a part of a split run, a collective weight sync,
several nodes, GPUs) and what contradicts it; end to end, a one-process run trains, bit for bit,
what the same run with an explorer and a trainer process trains, and never starts either process.
"""

from __future__ import annotations

import pytest
import torch
from test_e2e import assert_same_on_policy_training
from test_in_explorer_engine import memory_sync_runs

from trinity.config.checks import check_config
from trinity.config.resolved import engines_in_explorer
from trinity.config.schema import TrinityConfig
from trinity.config.support import not_applicable_notes


def _cfg(mode: str = "both", **over: dict) -> TrinityConfig:
    base = {
        "mode": mode,
        "model": {"model_path": "m"},
        "buffer": {
            "total_steps": 1,
            "explorer_input": {"taskset": {"path": "t", "storage_type": "file"}},
            "trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue"}},
        },
        "cluster": {"one_process": True},
    }
    for section, keys in over.items():
        base[section] = {**base.get(section, {}), **keys} if isinstance(keys, dict) else keys
    return TrinityConfig.model_validate(base)


def _problems(cfg: TrinityConfig) -> dict[str, str]:
    return {p.path: p.message for p in check_config(cfg) if "one_process" in p.message}


def test_a_local_mode_both_run_is_accepted_and_its_engines_are_the_explorers_threads():
    assert _problems(_cfg()) == {}
    assert engines_in_explorer(_cfg())
    assert not engines_in_explorer(_cfg(cluster={"one_process": False}))
    assert engines_in_explorer(
        _cfg(
            cluster={"one_process": False},
            explorer={"rollout_model": {"in_explorer_process": True}},
        )
    )


def test_an_unset_sync_method_is_shared_weights_only_where_nothing_samples_while_training():
    from trinity.config.resolved import resolve

    def sync(**over: dict) -> str:
        return resolve(_cfg(**over)).sync_method

    assert sync() == "shared"  # strictly on-policy: the engines use the trainer's weights
    assert sync(synchronizer={"sync_offset": 1}) == "memory"  # one step off: a copy
    assert sync(synchronizer={"sync_style": "explorer_driven"}) == "memory"
    assert sync(cluster={"one_process": False}) == "memory"
    assert sync(synchronizer={"sync_method": "checkpoint"}) == "checkpoint"  # as set


@pytest.mark.parametrize("mode", ["explore", "serve", "train"])
def test_a_part_of_a_split_run_is_refused(mode):
    # mode train reading the queue that explore processes fill is the split run's trainer
    assert "cluster.one_process" in _problems(_cfg(mode))


def test_what_one_process_cannot_be_is_refused_naming_the_key():
    found = _problems(
        _cfg(
            synchronizer={"sync_method": "nccl"},
            cluster={"one_process": True, "node_num": 2, "gpu_per_node": 1},
            explorer={"rollout_model": {"in_explorer_process": False, "num_threads": 1}},
            trainer={"num_threads": 2},
        )
    )
    assert set(found) == {
        "synchronizer.sync_method",
        "cluster.node_num",
        "cluster.gpu_per_node",
        "explorer.rollout_model.in_explorer_process",
        "explorer.rollout_model.num_threads",
    }
    assert "nccl" in found["synchronizer.sync_method"]
    assert found["cluster.gpu_per_node"].startswith("not built yet")
    assert "(2)" in found["explorer.rollout_model.num_threads"]
    # the same threads, or in_explorer_process said true, are no contradiction
    assert _problems(
        _cfg(explorer={"rollout_model": {"in_explorer_process": True, "num_threads": 2}},
             trainer={"num_threads": 2})
    ) == {}  # fmt: skip
    # the in_explorer_process check does not say the nccl problem a second time
    nccl = _cfg(synchronizer={"sync_method": "nccl"})
    assert not [p for p in check_config(nccl) if p.path.endswith("in_explorer_process")]


def test_max_restarts_is_said_not_to_apply_naming_one_process():
    said = "explorer.rollout_model.max_restarts: not applicable here"
    (note,) = [
        n
        for n in not_applicable_notes(_cfg(explorer={"rollout_model": {"max_restarts": 5}}))
        if said in n
    ]
    assert "cluster.one_process" in note


@pytest.mark.slow  # two whole runs (about 50 s on 2 cores)
def test_one_process_trains_what_an_explorer_and_a_trainer_process_train(tmp_path, tiny_model_dir):
    """The same on-policy run (evaluation at step 2 of 3, weights by `memory`) as processes of
    their own (the engine in the explorer's, `in_explorer_process`) and as one process: the same
    rollouts, losses, evaluation and final weights, bit for bit; the one-process run never
    starts an explorer, trainer, synchronizer, buffer or engine process."""
    engines = "explorer.rollout_model.in_explorer_process=true"
    runs, titles = memory_sync_runs(
        tmp_path,
        tiny_model_dir,
        {
            "processes": [engines, "cluster.one_process=false"],
            "one_process": [engines, "cluster.one_process=true"],
        },
    )
    assert_same_on_policy_training(runs["processes"], runs["one_process"])
    own = ("ray::Explorer", "ray::TrainerRunner")
    assert all(
        any(t.startswith(o) for t in titles["processes"]) for o in own
    )  # the watch sees them
    started = [t for t in titles["one_process"] if t.startswith("ray::") and t != "ray::IDLE"]
    assert not [t for t in started if not t.startswith(("ray::ServiceHost", "ray::Dashboard",
                                                          "ray::RuntimeEnv"))], started  # fmt: skip


@pytest.mark.long  # a shortened quickstart (SFT then GRPO) and a bench of it, about 60 s
def test_the_quickstart_s_stages_and_a_bench_of_them_run_in_one_process(tmp_path):
    """Each stage's compute objects join the one process and leave it at the stage's end: the
    SFT stage (mode train, evaluated by an explorer), then GRPO (mode both) from its weights, then
    mode bench over the run's checkpoints; no run ever starts an explorer or trainer process."""
    import json

    import yaml
    from test_e2e import ROOT
    from test_in_explorer_engine import _run

    cfg = yaml.safe_load((ROOT / "examples" / "quickstart" / "quickstart.yaml").read_text())
    cfg["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    cfg["cluster"] = {"ray_address": "local", "one_process": True}
    cfg["monitor"] = {"monitor_type": "jsonl"}
    cfg["explorer"]["runner_per_model"] = 16
    for ts in cfg["buffer"]["explorer_input"]["eval_tasksets"]:
        ts["generator_args"]["num_tasks"] = 16
    sft, grpo = cfg["stages"]
    sft["buffer"]["total_steps"] = 4
    grpo["buffer"]["total_steps"] = 2
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    own = ("ray::Explorer", "ray::TrainerRunner", "ray::HFRolloutEngine", "ray::Synchronizer")
    run_dir = tmp_path / "ckpt" / "quickstart" / "add2"
    # the bench names the base model (step 0) beside the stages' checkpoints: the GRPO stage
    # (the bench's config) does not evaluate on start-up
    for sets in ([], ["mode=bench", "explorer.bench_checkpoints=[0,4,6]"]):
        r, titles = _run(path, sets, tmp_path / "cache")
        assert r.returncode == 0, r.stdout[-4000:]
        assert not [t for t in titles if t.startswith(own)], titles
    assert (run_dir / "sft" / "global_step_4" / "model.safetensors").exists()
    assert (run_dir / "grpo" / "global_step_2" / "model.safetensors").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(s["name"], s["steps"]) for s in summary["stages"]] == [("sft", 4), ("grpo", 2)]
    assert all(s["eval_end"] for s in summary["stages"])  # each stage's final evaluation ran
    bench = json.loads((run_dir / "bench.json").read_text())
    rows = bench["rows"]
    # run-wide: the GRPO stage's last checkpoint is step 6
    assert rows[0]["checkpoint"].endswith(" (model.model_path)")  # tiny://1m with its seed
    assert [(row["checkpoint"], row["step"]) for row in rows] == [
        (rows[0]["checkpoint"], 0),
        ("sft/global_step_4", 4),
        ("grpo/global_step_2", 6),
    ]
    for s in ("add2_heldout", "add2_heldout_sampled"):
        assert f"best checkpoint for {s}: " in r.stdout and s in bench["best"]
    # the held-out sets, in the run and in the bench: greedy pass@1 = accuracy; sampled (4
    # answers each) avg@4 = accuracy, pass@1/2/4 each inside its interval
    final = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    for rec in (final, rows[-1]):
        assert rec["eval/add2_heldout/pass@1"] == rec["eval/add2_heldout/accuracy"]
        sampled = "eval/add2_heldout_sampled/"
        assert rec[sampled + "avg@4"] == rec[sampled + "accuracy"]
        for k in ("avg@4", "pass@1", "pass@2", "pass@4"):
            assert rec[sampled + f"{k}_ci_low"] <= rec[sampled + k] <= rec[sampled + f"{k}_ci_high"]
        assert rec[sampled + "pass@1"] <= rec[sampled + "pass@2"] <= rec[sampled + "pass@4"]


def test_only_a_run_whose_sides_overlap_in_one_process_lends_cores():
    """Such a run's driver asks MKL for results independent of the thread count
    (`common.core_shares`); a lockstep one, or one of several processes, keeps MKL's default."""
    from trinity.launcher.run import lends_cores

    assert lends_cores(_cfg(synchronizer={"sync_offset": 1}))
    assert not lends_cores(_cfg())  # on-policy lockstep: each side alone on the lane
    assert not lends_cores(_cfg(synchronizer={"sync_offset": 1}, cluster={"one_process": False}))


@pytest.mark.slow  # two whole runs (about 50 s on 2 cores)
def test_a_one_step_off_run_in_one_process_repeats_bit_for_bit(tmp_path, tiny_model_dir):
    """Engine and trainer overlap, one thread each, and lend each other their cores while idle
    (`common.core_shares`): which thread count an op runs with then depends on timing, and the
    same run twice must still train the same (losses, rewards, versions, final weights)."""
    off = [
        "explorer.rollout_model.in_explorer_process=true",
        "cluster.one_process=true",
        "synchronizer.sync_offset=1",
    ]
    runs, _ = memory_sync_runs(tmp_path, tiny_model_dir, {"first": off, "second": off})
    a, b = runs["first"], runs["second"]
    assert [v for *_, v in a["steps"].values()] == [0, 0, 1]  # one step off
    assert b["steps"] == a["steps"] and b["eval"] == a["eval"]
    for k, w in a["weights"].items():
        assert torch.equal(w, b["weights"][k]), k
