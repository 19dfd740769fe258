"""`sync_method: shared`: the engines map the trainer's own parameters.

By hand: an engine process sees every in-place update the trainer's optimizer makes, with no
second send; the config checks refuse every schedule where the explorer could sample while the
trainer trains. End to end: a strictly on-policy run with `shared` trains exactly what the same
run with `memory` trains (rollouts, losses, evaluation, final weights).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_e2e import assert_same_on_policy_training, grpo_config, grpo_outcome, run_trinity

from trinity.config.checks import check_config
from trinity.config.resolved import resolve
from trinity.config.schema import TrinityConfig
from trinity.sync import shared
from trinity.sync.method import SYNC_METHOD
from trinity.sync.shared import SharedSync

ENGINE = textwrap.dedent("""
    import json, pickle, sys
    from trinity.sync import shared
    from trinity.sync.shared import SharedSync
    shared._node = lambda: "node-a"
    got = SharedSync().receive(pickle.loads(bytes.fromhex(sys.argv[1])))
    print(json.dumps(got["weight"].tolist()), flush=True)
    input()  # the trainer has stepped
    print(json.dumps([got["weight"].tolist(), got["bias"].tolist()]), flush=True)
""")


def test_sending_moves_the_parameters_into_shared_memory_once(monkeypatch):
    monkeypatch.setattr(shared, "_node", lambda: "node-a")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    weight, before = model.weight, model.weight.detach().clone()
    before_names = _shm_names()
    method = SharedSync()
    payload = method.send(model.state_dict(), 1, None)
    # in place: the same parameter objects (the optimizer's), the same values, now shared
    assert model.weight is weight and model.weight.is_shared() and model.bias.is_shared()
    assert torch.equal(model.weight.detach(), before)
    assert method.send(model.state_dict(), 2, None) == payload  # nothing moves again
    assert not _shm_names() - before_names  # anonymous: no name in /dev/shm
    with pytest.raises(RuntimeError, match="shares CPU memory"):
        method.send({"w": torch.zeros(1, device="meta")}, 3, None)


def test_an_engine_process_reads_each_update_without_a_second_send(monkeypatch):
    monkeypatch.setattr(shared, "_node", lambda: "node-a")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    payload = SharedSync().send(model.state_dict(), 1, None)
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, pickle.dumps(payload).hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert engine.stdin is not None and engine.stdout is not None
    assert json.loads(engine.stdout.readline()) == model.weight.tolist()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()  # in place, in the shared files
    out, _ = engine.communicate("stepped\n", timeout=60)
    assert engine.returncode == 0
    assert json.loads(out) == [model.weight.tolist(), model.bias.tolist()]


def test_an_engine_on_another_node_is_told_why(monkeypatch):
    monkeypatch.setattr(shared, "_node", lambda: "node-a")
    payload = SharedSync().send(torch.nn.Linear(2, 2).state_dict(), 1, None)
    monkeypatch.setattr(shared, "_node", lambda: "node-b")
    with pytest.raises(RuntimeError, match="trainer runs on node node-a and this engine on node"):
        SharedSync().receive(payload)


def test_only_the_shared_method_is_live():
    assert SYNC_METHOD.get("shared").live and SYNC_METHOD.get("shared").hands_over
    assert not any(SYNC_METHOD.get(m).live for m in ("memory", "checkpoint", "nccl"))


def _config(**synchronizer) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "model": {"model_path": "tiny://1m"},
            "mode": synchronizer.pop("mode", "both"),
            "cluster": synchronizer.pop("cluster", {}),
            "buffer": {
                "batch_size": 2,
                "explorer_input": {"taskset": {"name": "t", "path": "x"}},
                "trainer_input": {"experience_buffer": {"name": "e", "storage_type": "queue"}},
            },
            "synchronizer": {"sync_method": "shared", **synchronizer},
        }
    )


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"sync_offset": 1}, "synchronizer.sync_offset"),
        ({"sync_interval": 2}, "synchronizer.sync_interval"),
        ({"sync_style": "trainer_driven"}, "synchronizer.sync_style"),
        ({"cluster": {"node_num": 2}}, "cluster.node_num"),
        ({"cluster": {"gpu_per_node": 1}}, "cluster.gpu_per_node"),
    ],
)
def test_a_schedule_that_could_race_is_refused(settings, key):
    problems = [p for p in check_config(_config(**settings)) if "sync_method shared" in str(p)]
    assert [p.path for p in problems] == [key], problems


def test_strictly_on_policy_is_accepted_and_split_modes_fall_back():
    assert not [p for p in check_config(_config()) if "sync_method shared" in str(p)]
    assert resolve(_config()).sync_method == "shared"
    assert resolve(_config(mode="train")).sync_method == "checkpoint"


@pytest.mark.slow  # two whole runs (50 s on 2 cores): make test stays under its 10 minutes
def test_shared_trains_exactly_what_memory_trains(tmp_path, tiny_model_dir):
    """The same strictly on-policy run (evaluation at step 2 of 3) with each method: the same
    rollouts, losses, evaluation and final weights, bit for bit."""
    pinned = ["trainer.num_threads=1", "explorer.rollout_model.num_threads=1"]
    before = _shm_names()
    runs = {}
    for method in ("memory", "shared"):
        d = tmp_path / method
        d.mkdir()
        cfg = grpo_config(d, tiny_model_dir, extra=f"synchronizer: {{sync_method: {method}}}\n")
        r = run_trinity(cfg, overrides=pinned)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"weight sync method {method}" in " ".join(r.stdout.split())
        runs[method] = grpo_outcome(d / "ckpt" / "e2e" / "grpo")
    assert_same_on_policy_training(runs["memory"], runs["shared"])
    # the weights lived in anonymous segments: the run's end (Ray kills its actors) left no
    # file behind in /dev/shm (named ones leaked a model's size per run)
    assert _shm_names() - before == set()


def _shm_names() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("torch_*")} if shm.is_dir() else set()
