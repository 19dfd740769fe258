"""DAPO's parts beyond the clip: the soft overlong punishment by hand, the flat-group filter, and
dynamic sampling end to end (all-equal groups dropped, the step refilled to its size)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from test_e2e import ROOT, grpo_config, run_trinity, user_module

from trinity.algorithm.shaping import overlong_penalty
from trinity.data.pipeline import StepGroups


def test_overlong_penalty_by_hand() -> None:
    # L_max = 10, L_cache = 4: no penalty up to 6 tokens, then (6 - |y|)/4: 7 → -0.25,
    # 8 → -0.5, 10 → -1; past L_max stays -1; factor 2 doubles it
    lengths = torch.tensor([1, 6, 7, 8, 10, 12])
    out = overlong_penalty(lengths, max_len=10, buffer_len=4)
    assert out.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    out = overlong_penalty(lengths, max_len=10, buffer_len=4, penalty_factor=2.0)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -2.0, -2.0]
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, max_len=10, buffer_len=11)


def test_drop_flat_groups() -> None:
    def task(*rewards):
        return [SimpleNamespace(reward=r, info={}) for r in rewards]

    kept = [(0, task(1.0, 1.0)), (1, task(0.0, 1.0)), (2, task(0.5)), (3, task(0.0, 0.0, 0.0))]
    groups = StepGroups(None, drop_flat=True)
    informative = groups.keep(kept)
    assert [i for i, _ in informative] == [1, 2]  # a single sample is not a group
    assert [i for i, _ in groups.flat] == [0, 3]
    # a step one task short is completed with the first flat group, trained as DAPO does
    assert [i for i, _ in groups.complete(informative, 3)] == [1, 2, 0]
    assert [i for i, _ in groups.flat] == [3] and groups.metrics() == {}


FLAT_EVEN = (
    "from trinity.workflows.math_workflow import MathWorkflow\n"
    "class FlatEven(MathWorkflow):\n"
    "    async def run(self, task, model):\n"
    "        exps = await super().run(task, model)\n"
    "        for e in exps:  # even tasks: every sample rewarded 1; odd: the samples differ\n"
    "            e.reward = 1.0 if task.index % 2 == 0 else float(e.eid.run % 2)\n"
    "        return exps\n"
)


def test_dynamic_sampling_drops_flat_groups_and_refills(tmp_path, tiny_model_dir) -> None:
    user_module(tmp_path, "dapopkg", "flat", FLAT_EVEN)
    r = run_trinity(
        grpo_config(tmp_path, tiny_model_dir),
        env_extra={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        overrides=[
            "algorithm.algorithm_type=dapo",
            "buffer.explorer_input.default_workflow_type=dapopkg.flat.FlatEven",
            "explorer.eval_on_startup=false",
            "explorer.eval_interval=0",
            "buffer.explorer_input.eval_tasksets=[]",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [
        json.loads(x)
        for x in (tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [rec for rec in records if "rollout/tasks" in rec]
    assert len(steps) == 3
    for rec in steps:
        # 4 tasks per step: the even half of each 4 drawn is flat, so 8 are sampled, 4 dropped
        assert rec["rollout/tasks"] == 4.0
        assert rec["rollout/filtered_groups"] == 4.0
        assert rec["rollout/sampled_tasks"] == 8.0
        assert rec["rollout/filter_exhausted"] == 0.0
        # rollout/* describe every sample drawn, the dropped groups too: 4 flat groups (all 1)
        # and 4 mixed ones (half 1), where the trainer's batch holds only the mixed ones
        assert rec["rollout/flat_group_frac"] == 0.5
        assert rec["rollout/reward_mean"] == 0.75
        # max_response_tokens 4: L_cache = max(1, 4 // 5) = 1, so a 4-token answer pays -1
        assert "train/overlong_penalty_mean" in rec
