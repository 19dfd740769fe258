"""End to end through `trinity run` (mode both, 2 steps): the tiny model is both the policy and
its judge (`explorer.auxiliary_models`, served with `enable_openai_api`). Training runs
`group_judge_workflow`; the start-up evaluation runs a probe workflow that calls the judge
through its handle and through the real `openai` client and checks that the two agree with one
seed and that nothing the judge said was recorded as the policy's."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from test_e2e import ROOT, run_trinity, user_module

PROBE = """
from trinity.workflows.base import Workflow


class AuxProbe(Workflow):
    async def run(self, task, model):
        judge = model.auxiliary("judge")
        messages = [{"role": "user", "content": task.prompt}]
        [direct] = await judge.chat(messages, seed=7, max_tokens=8)
        client = judge.async_openai_client()
        reply = await client.chat.completions.create(
            model=client.model_path, messages=messages, seed=7, max_tokens=8
        )
        same = reply.choices[0].message.content == judge.decode(direct.response_ids)
        same_model = model.auxiliary(0).model_path == client.model_path
        [own] = await model.chat(task.to_messages())
        exps = model.extract_experiences(reward=0.0)
        policy_only = len(exps) == 1 and exps[0].tokens.tolist() == own.prompt_ids + own.response_ids
        for e in exps:
            e.metrics["accuracy"] = float(same and same_model and policy_only)
        return exps
"""


def judge_config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = tmp_path / "judge.yaml"
    data = f"""
        project: e2e
        name: judge
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {model_dir}, max_response_tokens: 4}}
        algorithm:
          algorithm_type: grpo
          repeat_times: 4
          optimizer: {{lr: 1.0e-2}}
        buffer:
          batch_size: 2
          total_steps: 2
          explorer_input:
            taskset:
              name: add
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 1, num_tasks: 20, seed: 0}}
              format: {{prompt_key: question, response_key: answer}}
              workflow_args: {{judge: judge, min_agreement: 0.75}}
            eval_tasksets:
              - name: probe
                storage_type: synthetic
                path: arithmetic
                split: test
                generator_args: {{digits: 1, num_tasks: 2, seed: 0}}
                format: {{prompt_key: question, response_key: answer}}
            default_workflow_type: group_judge_workflow
            default_eval_workflow_type: auxpkg.probe.AuxProbe
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue}}
        explorer:
          eval_interval: 0
          auxiliary_models:
            - {{name: judge, model_path: {model_dir}, seed: 1, max_response_tokens: 8,
                enable_openai_api: true}}
        trainer: {{micro_batch_size_per_gpu: 8, use_dynamic_bsz: false}}
        monitor: {{monitor_type: tensorboard}}
        """
    cfg.write_text(textwrap.dedent(data))
    return cfg


@pytest.mark.slow
def test_a_tiny_judge_rewards_and_filters_a_grpo_run(tmp_path, tiny_model_dir) -> None:
    user_module(tmp_path, "auxpkg", "probe", PROBE)
    r = run_trinity(
        judge_config(tmp_path, tiny_model_dir),
        env_extra={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "OpenAI-compatible endpoint of auxiliary_models[0]" in out
    records = [
        json.loads(x)
        for x in (tmp_path / "ckpt" / "e2e" / "judge" / "metrics.jsonl").read_text().splitlines()
    ]
    # the probe: handle and OpenAI client agree, and only the policy's call was recorded
    [start] = [rec for rec in records if "eval/probe/accuracy" in rec and rec["step"] == 0]
    assert start["eval/probe/accuracy"] == 1.0
    steps = [rec for rec in records if "rollout/tasks" in rec]
    assert len(steps) == 2
    for rec in steps:
        parsed = rec["rollout/judge_parsed_mean"]
        inconsistent = rec.get("rollout/judge_inconsistent_mean", 0.0)
        # policy on_parse_failure: exclude, so a group is excluded when the judge's replies
        # held no scores or when they contradict each other
        assert rec["rollout/excluded_groups"] == pytest.approx(
            2 * (1 - parsed) + 2 * parsed * inconsistent
        )
        assert rec["rollout/excluded"] == 4 * rec["rollout/excluded_groups"]
        assert "rollout/reward_mean" in rec
    trained = [rec for rec in records if "train/policy_loss" in rec or "train/loss" in rec]
    assert len(trained) == 2
