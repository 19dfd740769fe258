"""The multi-turn self-correction workflow: by hand on a fake engine, then trained end to end."""

from __future__ import annotations

import asyncio
import json

from test_e2e import grpo_config, run_trinity

from tests.fake_engine import FakeEngine
from trinity.common.experience import ExperienceKind
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW


def test_wrong_answers_get_a_second_turn_and_each_episode_is_one_row():
    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.5)
    handle = TaskModelHandle(engine, tok, SamplingParams(n=3))
    task = Task(index=0, raw={}, prompt="2+3=", truth="5", reward_fn_type="arithmetic_reward")
    workflow = WORKFLOW.get("math_self_correction_workflow")(max_turns=3)
    # episode 0 right at once; episode 1 right on its 2nd answer; episode 2 wrong three times
    engine.plans = [
        [("5", "stop"), ("4", "stop"), ("7", "stop")],
        [("5", "stop")],
        [("6", "length")],
        [("8", "stop")],
    ]
    exps = asyncio.run(workflow.run(task, handle))
    assert [e.kind for e in exps] == [ExperienceKind.MULTI_TURN] * 3
    assert [e.eid.run for e in exps] == [0, 1, 2]
    assert [e.reward for e in exps] == [1.0, 1.0, 0.0]
    assert [e.metrics["turns"] for e in exps] == [1.0, 2.0, 3.0]
    assert [e.metrics["first_accuracy"] for e in exps] == [1.0, 0.0, 0.0]
    # episode 2: three sampled answers, two feedback turns between them (masked)
    e = exps[2]
    mask = e.action_mask.tolist()
    answers = [tok.decode(e.response_tokens[s:t].tolist()) for s, t, _ in e.info["turns"]]
    assert answers == ["7<|im_end|>", "6", "8<|im_end|>"]
    feedback = tok.decode(e.response_tokens[~e.action_mask].tolist())
    # after "6" (cut by its budget, no eos sampled) the turn end is rendered: <|im_end|> masked
    assert feedback == (
        "\n<|im_start|>user\nThat is not right. Try again.<|im_end|>\n<|im_start|>assistant\n"
        "<|im_end|>\n<|im_start|>user\nThat is not right. Try again.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert sum(mask) == sum(t - s for s, t, _ in e.info["turns"])
    assert handle.ledger.stats.drift == 0 and handle.ledger.stats.bridged == 3


def test_self_correction_trains_on_multi_turn_experiences_end_to_end(tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    overrides = [
        "buffer.explorer_input.default_workflow_type=math_self_correction_workflow",
        "buffer.total_steps=2",
        "explorer.eval_interval=0",
    ]
    r = run_trinity(cfg, overrides=overrides)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [rec for rec in records if "rollout/tasks" in rec]
    assert len(steps) == 2
    for rec in steps:
        # 4 tasks x 4 episodes, each episode one trajectory; every second answer bridged
        assert rec["rollout/ledger_segments"] == 16.0
        assert rec["rollout/ledger_drift"] == 0.0
        second_turns = rec["rollout/turns_mean"] * 16 - 16
        assert rec["rollout/ledger_bridged"] == round(second_turns)
        assert rec["rollout/ledger_calls"] == 4 + rec["rollout/ledger_bridged"]
    trained = [rec for rec in records if "train/loss" in rec]
    assert len(trained) == 2 and all(rec["train/experiences"] == 16.0 for rec in trained)
