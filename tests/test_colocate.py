"""Colocation (`trinity.common.turns`): the trainer and the rollout engines take turns on one
device, the side without the baton asleep (engines) or in host memory (trainer)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_e2e import assert_same_on_policy_training, grpo_config, grpo_outcome, run_trinity
from test_plan import _cfg

from trinity.common.rollout import SamplingParams
from trinity.common.turns import DeviceTurns, EnginesTurn, overlaps, read_journal
from trinity.config.loader import validate_config
from trinity.config.problems import ConfigError
from trinity.explorer.model_client import BatchingClient
from trinity.launcher.placement import colocated_config
from trinity.launcher.plan import plan_run
from trinity.models import offload

# -- the baton ---------------------------------------------------------------------------------


def test_a_side_waits_for_the_device_until_the_holder_gives_it_back(tmp_path):
    journal = tmp_path / "turns.jsonl"

    async def scenario() -> list[str]:
        turns, order = DeviceTurns(str(journal)), []
        await turns.take("trainer")
        assert await turns.take("trainer") == 0.0  # again while holding: a no-op

        async def engines() -> None:
            waited = await turns.take("engines")
            order.append(f"engines took after {waited:.2f} s")
            await turns.give("engines")

        waiting = asyncio.create_task(engines())
        await asyncio.sleep(0.2)
        order.append("trainer gives")
        assert turns.state() == {"holder": "trainer", "turns": {"trainer": 1, "engines": 0}}
        await turns.give("trainer")
        await waiting
        await turns.give("trainer")  # not holding: a no-op, nothing journaled
        return order

    order = asyncio.run(scenario())
    assert order[0] == "trainer gives" and order[1].startswith("engines took after 0.2")
    turns = read_journal(journal)
    assert [t["side"] for t in turns] == ["trainer", "engines"]
    assert turns[1]["waited_s"] >= 0.2 and overlaps(turns) == []


def test_a_wait_for_the_device_times_out_naming_the_holder():
    async def scenario() -> None:
        turns = DeviceTurns()
        await turns.take("engines")
        with pytest.raises(TimeoutError, match=r"the trainer waited .* which the engines still"):
            await turns.take("trainer", timeout=0.1)
        with pytest.raises(ValueError, match="unknown side 'critic'; one of trainer, engines"):
            await turns.take("critic")

    asyncio.run(scenario())


def test_overlapping_turns_are_found():
    turns = [
        {"side": "engines", "taken": 0.0, "given": 2.0},
        {"side": "trainer", "taken": 1.0, "given": 3.0},  # before the engines gave it
        {"side": "engines", "taken": 3.0, "given": 4.0},
    ]
    assert overlaps(turns) == [(turns[0], turns[1])]
    assert overlaps(turns[1:]) == []


# -- moving state off the device ---------------------------------------------------------------


def test_offload_moves_parameters_gradients_and_optimizer_state_and_counts_their_bytes():
    """Moving to the meta device stands in for host <-> GPU (on a CPU-only machine nothing
    moves): 10×4 + 4 fp32 parameters, their gradients, AdamW's two moments (the step count is
    a CPU scalar tensor too)."""
    layer = torch.nn.Linear(10, 4)
    opt = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(2, 10)).sum().backward()
    opt.step()
    params = (10 * 4 + 4) * 4
    step_counts = 2 * 4  # one float32 `step` per parameter
    assert offload.to_device([layer, None], [opt, None], "cpu") == 0  # already there
    moved = offload.to_device([layer], [opt], "meta")
    assert moved == params * 2 + params * 2 + step_counts  # weights + grads, two moments, steps
    assert layer.weight.device.type == "meta" and layer.weight.grad.device.type == "meta"
    assert all(v.device.type == "meta" for s in opt.state.values() for v in s.values())


def test_an_asleep_engine_refuses_to_sample_and_loads_weights_into_its_host_copy(tiny_model_dir):
    from trinity.explorer.engine import HFRolloutEngine

    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    tokens = [1, 5, 9, 3]
    before = engine.logprobs(tokens)
    assert engine.sleep(1) == 0 and engine.sleep(1) == 0  # CPU: nothing moves; twice: a no-op
    with pytest.raises(RuntimeError, match="asleep while a colocated trainer holds the device"):
        engine.logprobs(tokens)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([tokens], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="level 1 only, not 2"):
        engine.sleep(2)
    doubled = {k: v * 2 for k, v in engine.model.state_dict().items()}
    engine.load_state(doubled, version=1)  # while asleep
    assert engine.wake_up() == 0 and engine.model_version == 1
    reference = HFRolloutEngine(str(tiny_model_dir), seed=0)
    reference.load_state(doubled, version=1)
    assert engine.logprobs(tokens) == reference.logprobs(tokens) != before


# -- the engines' side in the explorer's client -------------------------------------------------


class _Remote:
    """`obj.method.remote(...)` awaitable, as a Ray actor handle's (for objects in this loop)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.obj, name)

        class Call:
            @staticmethod
            async def remote(*args: Any, **kwargs: Any) -> Any:
                out = method(*args, **kwargs)
                return await out if asyncio.iscoroutine(out) else out

        return Call()


class _Engine:
    """Records its calls; refuses to sample asleep, as a real engine does."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.asleep, self.model_version = log, False, 0

    def sleep(self, level: int) -> int:
        self.asleep = True
        self.log.append("sleep")
        return 8

    def wake_up(self) -> int:
        self.asleep = False
        self.log.append("wake")
        return 8

    def logprobs(self, tokens: list[int]) -> list[float]:
        assert not self.asleep
        self.log.append("logprobs")
        return [0.0] * (len(tokens) - 1)

    def weights_version(self) -> int:
        return self.model_version


def test_the_client_wakes_its_engines_once_per_turn_and_rests_them_after_it():
    async def scenario() -> tuple[list[str], dict, dict]:
        log: list[str] = []
        turns = DeviceTurns()
        engines = [_Remote(_Engine(log)), _Remote(_Engine(log))]
        client = BatchingClient(engines)
        client.turn = EnginesTurn(_Remote(turns), engines)
        await client.turn.rest(always=True)  # built awake: asleep before their first turn
        await turns.take("trainer")
        call = asyncio.create_task(client.logprobs([1, 2, 3]))
        await asyncio.sleep(0.05)
        assert log == ["sleep", "sleep"]  # the call waits for the trainer's turn to end
        await turns.give("trainer")
        await asyncio.gather(call, client.logprobs([1, 2]), client.logprobs([3, 4]))
        state = turns.state()
        metrics = await client.turn.rest()
        return log, state, metrics

    log, state, metrics = asyncio.run(scenario())
    assert log == ["sleep", "sleep", "wake", "wake", *["logprobs"] * 3, "sleep", "sleep"]
    assert state == {"holder": "engines", "turns": {"trainer": 1, "engines": 1}}
    assert metrics["colocation/engines_moved_bytes"] == 4 * 8  # two wakes, two sleeps
    assert metrics["colocation/engines_wait_s"] >= 0.05


# -- configuration and the plan -----------------------------------------------------------------


def _data(**over: Any) -> dict[str, Any]:
    base = {
        "model": {"model_path": "m"},
        "buffer": {
            "total_steps": 1,
            "explorer_input": {"taskset": {"path": "t", "storage_type": "file"}},
        },
    }
    return {**base, **over}


def test_trinity_rfts_mode_colocate_reads_as_mode_both_colocated():
    cfg = validate_config(_data(mode="colocate"))
    assert cfg.mode == "both" and cfg.cluster.colocate is True
    assert "mode: 'colocate' read as mode both with cluster.colocate: true" in cfg._rename_notes
    with pytest.raises(ConfigError, match=r"mode: colocate, but cluster\.colocate is false"):
        validate_config(_data(mode="colocate", cluster={"colocate": False}))


@pytest.mark.parametrize(
    ("over", "key", "says"),
    [
        ({"mode": "explore"}, "cluster.colocate", "not mode explore"),
        ({"cluster": {"colocate": True, "one_process": True}}, "cluster.one_process", "remove"),
        ({"cluster": {"colocate": True, "gpu_per_node": 2}}, "cluster.gpu_per_node", "one GPU"),
        ({"cluster": {"colocate": True, "node_num": 2}}, "cluster.node_num", "one node, not 2"),
        ({"synchronizer": {"sync_method": "shared"}}, "synchronizer.sync_method", "use memory"),
        ({"explorer": {"auxiliary_models": [{"model_path": "j"}]}}, "explorer.auxiliary_models",
         "refuses them"),
    ],
)  # fmt: skip
def test_what_colocation_cannot_share_is_refused_naming_the_key(over, key, says):
    data = _data(**over)
    data["cluster"] = {"colocate": True, **data.get("cluster", {})}
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    assert key in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("cluster", "gpus", "on", "why"),
    [
        ({"gpu_per_node": 1}, False, True, "chosen: one GPU on one node"),
        ({}, False, False, ""),  # CPUs only
        ({"gpu_per_node": 2}, False, False, ""),
        ({"gpu_per_node": 1, "colocate": False}, False, False, "cluster.colocate: false"),
        ({"colocate": True}, False, True, "cluster.colocate: true"),
    ],
)
def test_the_plan_colocates_on_one_gpu_as_trinity_rft_does(cluster, gpus, on, why):
    plan = plan_run(_cfg(cluster=cluster), gpus_here=gpus)
    assert plan.layout.colocate is on and plan.layout.colocate_why.startswith(why)
    assert plan.stages[0].colocated is on and plan.stages[0].cfg.cluster.colocate is on
    assert ("colocation: trainer and rollout engines take turns" in plan.describe()) is on
    if on:  # processes that sleep and wake in turn
        assert not plan.layout.one_process


def test_colocated_weights_go_by_memory_and_vllm_on_cpus_is_refused():
    cfg = _cfg(synchronizer={"sync_method": "nccl"})
    got, notes = colocated_config(cfg, on_gpu=True)
    assert (
        got.synchronizer.sync_method == "memory" and "colocated, weights go by memory" in notes[0]
    )
    vllm = _cfg(explorer={"rollout_model": {"engine_type": "vllm"}})
    got, notes = colocated_config(vllm, on_gpu=True)
    assert got.explorer.rollout_model.gpu_memory_utilization == 0.25 and len(notes) == 2
    with pytest.raises(ValueError, match="vLLM's sleep mode needs CUDA"):
        colocated_config(vllm, on_gpu=False)


# -- a whole run ----------------------------------------------------------------------------------


@pytest.mark.slow  # two whole runs (about 40 s on 2 cores)
def test_a_colocated_run_trains_what_a_run_of_processes_trains_and_never_overlaps(
    tmp_path, tiny_model_dir
):
    """The same on-policy run (evaluation at steps 0, 2 and 3 of 3, weights by memory) with a
    process per part and colocated: the same rollouts, losses, evaluations and final weights,
    bit for bit; the colocated run's journal shows the two sides alternating, never holding
    the device at once, the engines' turns being each explore step's and each evaluation's."""
    pinned = ["trainer.num_threads=1", "explorer.rollout_model.num_threads=1"]
    runs, journals = {}, {}
    for name, sets in {"processes": [], "colocated": ["cluster.colocate=true"]}.items():
        d = tmp_path / name
        d.mkdir()
        cfg = grpo_config(d, tiny_model_dir, extra="synchronizer: {sync_method: memory}\n")
        r = run_trinity(cfg, overrides=["cluster.one_process=false", *pinned, *sets])
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        run_dir = d / "ckpt" / "e2e" / "grpo"
        runs[name] = grpo_outcome(run_dir)
        journals[name] = read_journal(run_dir / "device_turns.jsonl")
    assert_same_on_policy_training(runs["processes"], runs["colocated"])
    assert journals["processes"] == []  # no baton without colocation
    turns = journals["colocated"]
    assert overlaps(turns) == []
    # eval at 0; steps 1..3 each an engines' turn (step 2's with its evaluation) and a trainer's;
    # the trainer's final checkpoint and publish; the final evaluation
    sides = [t["side"] for t in turns]
    assert sides == ["engines", *["engines", "trainer"] * 3, "trainer", "engines"], sides
    recs = [json.loads(x) for x in (Path(tmp_path) / "colocated/ckpt/e2e/grpo/metrics.jsonl")
            .read_text().splitlines()]  # fmt: skip
    trained = [r for r in recs if "train/loss" in r]
    assert all(
        "colocation/trainer_wait_s" in r and "colocation/engines_wake_s" in r for r in trained
    )


def test_a_colocated_engine_that_must_know_it_when_built_is_told(monkeypatch, tiny_model_dir):
    """vLLM allocates through its sleep-mode pool only when built with `enable_sleep_mode`:
    colocated vLLM engines get it, others do not, and our engine needs no such keyword."""
    from trinity.explorer import engine_pools
    from trinity.explorer.vllm_engine import VLLMRolloutEngine

    built: list[dict] = []

    class Actor:
        def options(self, **_: Any) -> Actor:
            return self

        def remote(self, *_: Any, **kwargs: Any) -> None:
            built.append(kwargs)

    monkeypatch.setattr(engine_pools.ray, "remote", lambda cls: Actor())
    share = engine_pools.Share(1, 0, 1)
    for engine_type, colocated in (("vllm", True), ("vllm", False), ("transformers", True)):
        cfg = _cfg(explorer={"rollout_model": {"engine_type": engine_type}})
        rm = cfg.explorer.rollout_model
        engine_pools._spawn([], engine_type, rm, "m", [0], share, [], 0, None, None, colocated)
    assert built[0]["enable_sleep_mode"] is True and "enable_sleep_mode" not in built[1]
    assert "enable_sleep_mode" not in built[2]
    assert VLLMRolloutEngine.sleep_kwarg == "enable_sleep_mode"


def test_validate_refuses_colocated_vllm_on_cpus_as_the_run_would(monkeypatch):
    from trinity.config import preflight as pf

    monkeypatch.setattr(pf, "gpu_driver_present", lambda: False)
    cfg = _cfg(cluster={"colocate": True}, explorer={"rollout_model": {"engine_type": "vllm"}})
    said = {p.path: p.message for p in pf.preflight(cfg).problems}
    assert "vLLM's sleep mode needs CUDA" in said["cluster.colocate"]
    plain = _cfg(cluster={"colocate": True})
    assert "cluster.colocate" not in {p.path for p in pf.preflight(plain).problems}
