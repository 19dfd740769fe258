"""The stall doctor on real runs: a reward that sleeps forever, an engine that stops answering,
a trainer that stops reading and a weight sync that never lands, each injected by a plugin
(tests/data/stall_faults/, chosen by STALL_FAULT). Each run must name the right part within
2 x `monitor.stall_timeout` and end with exit 1 (`monitor.on_stall: fail`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_e2e import grpo_config, run_trinity

FAULTS = Path(__file__).parent / "data" / "stall_faults"
TIMEOUT = 12

STALL = f"""
monitor: {{monitor_type: tensorboard, stall_timeout: {TIMEOUT}, on_stall: fail}}
synchronizer: {{sync_method: checkpoint, sync_interval: 1}}
"""

REWARD = r"cause: reward_fn 'sleepy_reward' has not answered for \d+ s \(task add(_eval)?#\d+\)"
CAUSES = {
    "reward": REWARD,
    "reward, a process per part": REWARD,  # the heartbeats and stacks of several processes
    "engine": r"cause: engine 0 has not answered for \d+ s \(generate for \d+ prompts\)",
    "trainer": r"cause: trainer has not progressed for \d+ s and waits on no other part",
    "sync": r"cause: synchronizer has not answered for \d+ s \(engine 0 loading weights v1 "
    r"\(checkpoint\)\)",
}


@pytest.mark.slow  # four runs that stall on purpose
@pytest.mark.parametrize(
    "fault",
    [f if f == "engine" else pytest.param(f, marks=pytest.mark.long) for f in sorted(CAUSES)],
)
def test_a_stalled_run_names_what_holds_it_up_and_fails(fault, tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    text = cfg.read_text().replace("monitor: {monitor_type: tensorboard}\n", "") + STALL
    if fault.startswith("reward"):
        text = text.replace(
            "default_reward_fn_type: arithmetic_reward", "default_reward_fn_type: sleepy_reward"
        )
    if fault.endswith("a process per part"):
        text += "cluster: {one_process: false}\n"
    cfg.write_text(text)
    env = {"TRINITY_PLUGIN_DIRS": str(FAULTS), "STALL_FAULT": fault.split(",")[0]}
    r = run_trinity(cfg, env_extra=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    head = re.search(r"stall: no part of the run has progressed for (\d+) s", out)
    assert head is not None, out[-4000:]
    assert int(head.group(1)) < 2 * TIMEOUT
    assert re.search(CAUSES[fault], out), out[-6000:]
    assert "monitor.on_stall: fail" in out
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    stacks = "".join(p.read_text() for p in (run_dir / "heartbeat").glob("stacks-*.txt"))
    assert "stall_faults" in stacks  # the faulty frame is in the dump
    if fault.endswith("a process per part"):  # the explorer's and the trainer's processes
        assert len(list((run_dir / "heartbeat").glob("*.json"))) >= 2
