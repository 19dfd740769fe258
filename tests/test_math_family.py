"""Trinity-RFT's math workflow variants (`workflows/math_family.py`, `trainable_ruler.py`) on a
scripted engine, and the workflows refused by name (`workflows/not_built.py`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.fake_engine import FakeEngine
from trinity.common.registry import RegistryError
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.tasks.task import Task
from trinity.tasks.taskset import row_value
from trinity.workflows import WORKFLOW
from trinity.workflows.math_boxed_workflow import SYSTEM_PROMPT
from trinity.workflows.math_family import QWEN_MATH_SUFFIX
from trinity.workflows.trainable_ruler import MATH_SYSTEM_PROMPT, parse_scores


def rm_reward(response: str, truth: str | None, row: dict, messages: list, scale: float = 1.0):
    """A reward model stand-in: 1 when the reply repeats the prompt's last word."""
    row.setdefault("seen", []).append({"messages": messages, "scale": scale})
    return {"rm": scale * float(messages[-1]["content"].split()[-1] in response)}


def _run(workflow, task, *plans, n=None):
    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.0)
    engine.plans = [[(r, "stop") for r in plan] for plan in plans]
    handle = TaskModelHandle(engine, tok, SamplingParams(n=n or len(plans[0])))
    exps = asyncio.run(workflow.run(task, handle))
    return exps, [tok.decode(call[0]) for call in engine.calls]


def test_async_names_are_the_same_workflows():
    assert WORKFLOW.get("async_math_workflow") is WORKFLOW.get("math_workflow")
    assert WORKFLOW.get("async_math_boxed_workflow") is WORKFLOW.get("math_boxed_workflow")
    assert WORKFLOW.get("async_math_rm_workflow") is WORKFLOW.get("math_rm_workflow")


def test_math_rm_workflow_gives_the_reward_fn_the_prompt():
    row: dict[str, Any] = {}
    task = Task(
        index=0, raw=row, prompt="say banana", truth=None,
        reward_fn_type="tests.test_math_family.rm_reward", reward_fn_args={"scale": 2.0},
    )  # fmt: skip
    exps, _ = _run(WORKFLOW.get("math_rm_workflow")(), task, ["banana!", "apple"])
    assert [e.reward for e in exps] == [2.0, 0.0]  # scale 2 x (banana in reply)
    assert exps[0].metrics == {"rm": 2.0}
    assert row["seen"][0] == {"messages": [{"role": "user", "content": "say banana"}], "scale": 2.0}


def test_math_rm_workflow_leaves_out_messages_for_a_reward_fn_without_them():
    task = Task(index=0, raw={}, prompt="6*12?", truth="72", reward_fn_type="math_reward")
    exps, _ = _run(WORKFLOW.get("math_rm_workflow")(), task, ["\\boxed{72}", "71"])
    assert [e.reward for e in exps] == [1.0, 0.0]


def test_on_policy_distill_math_prompt_and_accuracy_reward():
    task = Task(index=0, raw={}, prompt="What is 6*12?", truth="#### 72")
    exps, prompts = _run(
        WORKFLOW.get("on_policy_distill_math_workflow")(), task, ["\\boxed{72}", "\\boxed{7}"]
    )
    assert prompts[0] == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"What is 6*12?{QWEN_MATH_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert [e.metrics for e in exps] == [{"accuracy": 1.0}, {"accuracy": 0.0}]
    no_truth = Task(index=1, raw={}, prompt="Hi", truth=None)
    exps, _ = _run(WORKFLOW.get("on_policy_distill_math_workflow")(), no_truth, ["\\boxed{1}"])
    assert exps[0].reward == 0.0 and exps[0].metrics == {}


def test_on_policy_distill_base_rewards_nothing_and_refuses_a_teacher_temperature():
    task = Task(index=0, raw={}, prompt="Hi", truth="x")
    exps, prompts = _run(WORKFLOW.get("on_policy_distill_workflow")(), task, ["hello", "yo"])
    assert [e.reward for e in exps] == [0.0, 0.0]
    assert prompts[0].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    cls = WORKFLOW.get("on_policy_distill_math_workflow")
    assert cls.arg_problems({"temperature": 1.0}) == []
    (problem,) = cls.arg_problems({"temperature": 0.7})
    assert "temperature 0.7 not built here" in problem


def test_bots_ref_eval_collect_logs_rewards_and_keeps_the_row_chat(tmp_path, monkeypatch):
    log = tmp_path / "sub" / "ref.jsonl"
    monkeypatch.setenv("BOTS_REF_EVAL_LOG_FILE", str(log))
    chat = [{"role": "user", "content": "What is 6*12?"}]
    row = {"prompt": chat, "reward_model": {"ground_truth": "72"}}
    truth = row_value(row, "reward_model.ground_truth")
    assert truth == "72" and row_value(row, "reward_model.missing") is None
    # the taskset names another reward fn: BOTS scores with math_boxed_reward all the same
    task = Task(index=0, raw=row, messages=chat, truth=truth, reward_fn_type="exact_match")
    workflow = WORKFLOW.get("bots_ref_eval_collect_math_boxed_workflow")()
    exps, prompts = _run(workflow, task, ["\\boxed{72}", "72", "\\boxed{72}"])
    assert SYSTEM_PROMPT not in prompts[0] and "system" not in prompts[0]
    assert [e.reward for e in exps] == [1.0, 0.0, 1.0]  # "72" has no box: 0
    _run(workflow, task, ["\\boxed{1}"])
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines == [
        {"model_version": 0, "rewards": [1.0, 0.0, 1.0], "question": chat, "truth": "72"},
        {"model_version": 0, "rewards": [0.0], "question": chat, "truth": "72"},
    ]


def test_bots_dotted_paths_resolve_from_the_repo_root():
    from trinity.workflows.math_family import BOTSMathBoxedWorkflow

    got = WORKFLOW.get("examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow")
    assert issubclass(got, BOTSMathBoxedWorkflow)


@pytest.mark.parametrize(
    "text, want",
    [
        ("so [0.5, 1, 0]", [0.5, 1.0, 0.0]),
        ("[9, 9, 9] then [1.5, -2, 0.25]", [1.0, 0.0, 0.25]),  # the last list, clipped
        ("[0.5, 1]", None),  # wrong length
        ("[a, b, c]", None),
        ("no list", None),
        ("] [", None),
    ],
)
def test_ruler_scores_parse(text, want):
    assert parse_scores(text, 3) == want


def test_trainable_ruler_with_gold_trains_the_judge_too():
    task = Task(index=3, raw={}, prompt="What is 6*12?", truth="72", taskset_name="t")
    workflow = WORKFLOW.get("math_trainable_ruler_workflow")(gold_probability=1.0)
    answers = ["\\boxed{72}", "\\boxed{70}", "\\boxed{72}"]
    judged = ["[1, 0, 1]", "I think [0.5, 0.5, 0.5]", "no scores"]
    exps, prompts = _run(workflow, task, answers, judged, n=len(answers))
    assert prompts[0].startswith(f"<|im_start|>system\n{MATH_SYSTEM_PROMPT}")
    assert "Candidate solution 2: \\boxed{70}" in prompts[1]
    # answers: gold rewards 1, 0, 1 (math_reward accuracy)
    assert [e.reward for e in exps[:3]] == [1.0, 0.0, 1.0]
    assert exps[0].metrics == {"accuracy": 1.0, "gold_reward": 1.0, "judge_success": 2 / 3}
    # judgements: gold scaled (g + 0.1) / 1.2 = [11/12, 1/12, 11/12];
    # [1, 0, 1]: 1 - (3 x 1/12) / 3 = 11/12; [0.5]*3: 1 - (3 x 5/12) / 3 = 7/12; none: 0
    judge = exps[3:]
    assert [e.reward for e in judge] == pytest.approx([11 / 12, 7 / 12, 0.0])
    assert all(e.info["subgroup"] == "ruler" for e in judge)
    assert judge[1].metrics == pytest.approx({"judge_success": 2 / 3, "reward_for_judge": 7 / 12})
    assert "subgroup" not in exps[0].info


def test_trainable_ruler_without_gold_rewards_the_judges_scores():
    task = Task(index=0, raw={}, prompt="What is 6*12?", truth="72")
    workflow = WORKFLOW.get("math_trainable_ruler_workflow")(gold_probability=0.0)
    exps, _ = _run(workflow, task, ["\\boxed{72}", "\\boxed{70}"], ["[0.25, 0.75]"], n=2)
    assert [e.reward for e in exps] == [0.25, 0.75]  # one judgement, n=1: its scores
    assert len(exps) == 2 and exps[1].metrics["gold_reward"] == 0.0
    exps, _ = _run(workflow, task, ["\\boxed{72}", "\\boxed{70}"], ["[oops]"], n=2)
    assert [e.reward for e in exps] == [0.0, 0.0] and exps[0].metrics["judge_success"] == 0.0


def test_trainable_ruler_draw_is_reproducible_and_its_probability_checked():
    cls = WORKFLOW.get("math_trainable_ruler_workflow")
    task = Task(index=0, raw={}, prompt="q", truth="1")
    draws = [cls(gold_probability=0.2).gold_available(task, [str(i)]) for i in range(400)]
    assert draws == [cls(gold_probability=0.2).gold_available(task, [str(i)]) for i in range(400)]
    assert 40 < sum(draws) < 120  # ~ 0.2 x 400 = 80
    assert (
        "gold_probability must be a number in [0, 1]"
        in cls.arg_problems({"gold_probability": 1.5})[0]
    )


@pytest.mark.parametrize(
    "name, why",
    [
        ("alfworld_workflow", "ALFWorld environment package and its game files"),
        ("step_wise_alfworld_workflow", "ALFWorld"),
        ("RAFT_alfworld_workflow", "ALFWorld"),
        ("RAFT_reflect_alfworld_workflow", "ALFWorld"),
        ("webshop_workflow", "WebShop server"),
        ("agentscope_v1_react_search_workflow", "queries the web"),
    ],
)
def test_environment_workflows_are_refused_by_name(name, why):
    with pytest.raises(RegistryError, match=f"workflow {name!r} is not built here: .*{why}"):
        WORKFLOW.get(name)
    assert name not in WORKFLOW.names()


def test_validate_refuses_them_by_name():
    from trinity.config.preflight import _lookup

    _, problems = _lookup(WORKFLOW, "webshop_workflow", "buffer.explorer_input.x")
    (p,) = problems
    assert "webshop_workflow" in p.message and "not built here" in p.message
    assert "unknown" not in p.message
