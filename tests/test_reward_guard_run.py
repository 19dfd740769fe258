"""A reward fn that hangs no longer freezes a run: `trinity run` on a tiny model whose reward
sleeps (about forever) on one training task and one eval task, with `reward_fn_args.timeout`.
The run ends, the two tasks are dropped and counted with their ids, the eval counts its task as
wrong."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.test_e2e import grpo_config, run_trinity
from trinity.config import load_config
from trinity.tasks import load_taskset

PLUGIN = """
import time

from trinity.rewards import REWARD_FN

HANG = {hang!r}


@REWARD_FN.register("hangs_on_two")
def hangs_on_two(response, truth, task_raw):
    if task_raw["question"] in HANG:
        time.sleep(3600)
    return {{"accuracy": float(truth is not None and truth in response)}}
"""


@pytest.mark.long  # a whole run (3 steps and an evaluation)
def test_a_hanging_reward_does_not_freeze_a_run(tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    text = cfg.read_text().replace(
        "default_reward_fn_type: arithmetic_reward", "default_reward_fn_type: hangs_on_two"
    )
    text = text.replace(
        "format: {prompt_key: question, response_key: answer}",
        "format: {prompt_key: question, response_key: answer}\n      reward_fn_args: {timeout: 1}",
        1,  # the training taskset
    )
    text = text.replace(
        "generator_args: {digits: 1, num_tasks: 8, seed: 0}",
        "generator_args: {digits: 1, num_tasks: 8, seed: 0}\n        reward_fn_args: {timeout: 1}",
    )
    text = text.replace(
        "explorer: {eval_interval: 2, runner_per_model: 16}",
        "explorer: {eval_interval: 2, runner_per_model: 16, max_retry_times: 0,\n"
        "  max_failure_fraction: 1.0}",
    )
    cfg.write_text(text)
    loaded = load_config(cfg)
    train = load_taskset(loaded.buffer.explorer_input.taskset)
    held_out = load_taskset(loaded.buffer.explorer_input.eval_tasksets[0], is_eval=True)
    # the sequential selector's first step takes training tasks 0..3: task 1 hangs
    hang = {train[1].raw["question"], held_out[0].raw["question"]}
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hang_reward.py").write_text(textwrap.dedent(PLUGIN.format(hang=sorted(hang))))

    proc = run_trinity(cfg, env_extra={"TRINITY_PLUGIN_DIRS": str(plugins)}, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "explore step 1: reward fn failures: 1 timeout (tasks add#1)" in out
    assert "reward fn failures: 1 timeout (tasks add_eval#0)" in out
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in recs if r["step"] == 1 and "rollout/reward_timeouts" in r)
    assert first["rollout/reward_timeouts"] == 1.0
    assert first["rollout/reward_failed_tasks"] == {"timeout": ["add#1"]}
    assert first["rollout/failed_tasks"] == 1.0  # dropped, and replaced by the next task
    assert first["rollout/tasks"] == 4.0
    assert 0 < first["rollout/reward_time_p50"] <= first["rollout/reward_time_p99"]
    later = [r for r in recs if r["step"] > 1 and "rollout/reward_timeouts" in r]
    assert later and all(r["rollout/reward_timeouts"] == 0.0 for r in later)
    evals = [r for r in recs if "eval/add_eval/failed_tasks" in r]
    assert evals and all(r["eval/add_eval/failed_tasks"] == 1.0 for r in evals)
    assert all(r["eval/reward_failed_tasks"] == {"timeout": ["add_eval#0"]} for r in evals)
