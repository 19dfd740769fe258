"""Trinity-RFT's boxed-answer names: `math_boxed_reward` and `math_boxed_workflow`."""

from __future__ import annotations

import asyncio

import pytest

from tests.fake_engine import FakeEngine
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.rewards import REWARD_FN, last_boxed_content, math_boxed_reward
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW
from trinity.workflows.math_boxed_workflow import SYSTEM_PROMPT, SYSTEM_PROMPT_THINK


def test_last_boxed_content():
    assert last_boxed_content("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed_content("no box, #### 5") is None
    assert last_boxed_content("\\boxed{unbalanced") is None


@pytest.mark.parametrize(
    "response, truth, accuracy",
    [
        ("so \\boxed{72}", "72", 1.0),
        ("so \\boxed{0.5}", "\\frac{1}{2}", 1.0),  # math-verify, not string equality
        ("so \\boxed{1,234}", "1234", 1.0),
        ("first \\boxed{72}, no: \\boxed{71}", "72", 0.0),  # the last box counts
        ("the answer is 72", "72", 0.0),  # no box: no answer (math_reward would accept it)
        ("#### 72", "72", 0.0),
        ("\\boxed{72}", "She has 72.\n#### 72", 1.0),  # a GSM8K solution as the truth
        ("\\boxed{72}", "\\boxed{72}", 1.0),
    ],
)
def test_math_boxed_reward_accuracy(response, truth, accuracy):
    assert math_boxed_reward(response, truth, {}) == {"accuracy": accuracy, "format_score": 0.0}
    assert REWARD_FN.get("math_boxed_reward") is math_boxed_reward


@pytest.mark.parametrize(
    "response, penalty",
    [
        ("<think>6*12</think> \\boxed{72}", 0.0),
        ("\\boxed{72}", -0.25),  # no think block
        ("</think> x <think> \\boxed{72}", -0.25),  # out of order
        ("<think>a</think><think>b</think> \\boxed{72}", -0.25),  # two
    ],
)
def test_math_boxed_reward_think_format(response, penalty):
    got = math_boxed_reward(response, "72", {}, with_think=True, format_score_coef=0.25)
    assert got == {"accuracy": 1.0, "format_score": penalty}


def _run(workflow, task, replies):
    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.0)
    engine.plan = [(r, "stop") for r in replies]
    handle = TaskModelHandle(engine, tok, SamplingParams(n=len(replies)))
    exps = asyncio.run(workflow.run(task, handle))
    return exps, tok.decode(engine.calls[0][0])


def test_workflow_asks_for_a_box_and_scores_with_math_boxed_reward():
    task = Task(index=0, raw={}, prompt="What is 6*12?", truth="72")
    workflow = WORKFLOW.get("math_boxed_workflow")()
    exps, prompt = _run(workflow, task, ["\\boxed{72}", "72", "\\boxed{71}"])
    assert prompt == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nWhat is 6*12?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert [e.reward for e in exps] == [1.0, 0.0, 0.0]
    assert exps[0].metrics == {"accuracy": 1.0, "format_score": 0.0}


def test_workflow_think_args_reach_the_reward_and_the_taskset_wins():
    task = Task(index=0, raw={}, prompt="What is 6*12?", truth="72")
    workflow = WORKFLOW.get("math_boxed_workflow")(with_think=True, format_score_coef=0.5)
    exps, prompt = _run(workflow, task, ["<think>6*12</think>\\boxed{72}", "\\boxed{72}"])
    assert SYSTEM_PROMPT_THINK in prompt
    assert [e.reward for e in exps] == [1.0, 0.5]  # 1 - 0.5 for the missing think block
    task.reward_fn_args = {"format_score_coef": 0.2}
    exps, _ = _run(workflow, task, ["\\boxed{72}"])
    assert exps[0].reward == pytest.approx(0.8)


def test_workflow_keeps_a_taskset_system_prompt_and_other_reward_fns():
    task = Task(
        index=0,
        raw={},
        prompt="2+3=",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}],
        truth="5",
        reward_fn_type="arithmetic_reward",  # takes no with_think: none is passed
    )
    exps, prompt = _run(WORKFLOW.get("math_boxed_workflow")(with_think=True), task, ["5"])
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "boxed" not in prompt
    assert exps[0].reward == 1.0


def test_workflow_use_base_prompts_with_plain_text():
    task = Task(index=0, raw={}, prompt="What is 6*12?", truth="72")
    exps, prompt = _run(WORKFLOW.get("math_boxed_workflow")(use_base=True), task, ["\\boxed{72}"])
    assert prompt == f"System:{SYSTEM_PROMPT}\nUser:\nWhat is 6*12?\nAssistant:\n"
    assert exps[0].reward == 1.0
