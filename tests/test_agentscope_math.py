"""Trinity-RFT's AgentScope math agents (`workflows/agentscope_math.py`) on the in-process
endpoint against a scripted engine: the Python tool runs, the boxed answer is scored."""

from __future__ import annotations

import json

import pytest
from test_agentscope import ByTurn, assert_exact, masked_text, needs_agentscope, serve_and_run

from tests.chat_templates import chatml
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW
from trinity.workflows.agent_tools import AGENT_TOOL, execute_python_code
from trinity.workflows.agentscope_math import MATH_AGENT_PROMPT


def python_call(code: str) -> str:
    args = json.dumps({"code": code})
    return f'<tool_call>{{"name": "execute_python_code", "arguments": {args}}}</tool_call>'


def test_execute_python_code_answers_as_agentscope_does():
    assert execute_python_code("print(6*7)") == (
        "<returncode>0</returncode><stdout>42\n</stdout><stderr></stderr>"
    )
    out = execute_python_code("import sys; sys.exit('bad')")
    assert out.startswith("<returncode>1</returncode><stdout></stdout><stderr>bad")
    assert "ran past 0.5 seconds" in execute_python_code("while True: pass", timeout=0.5)
    tool = AGENT_TOOL.get("execute_python_code")
    assert tool.call({"code": "print(1)"}).startswith("<returncode>0</returncode><stdout>1")


@needs_agentscope
@pytest.mark.parametrize(
    "name, iters", [("agentscope_react_math_workflow", 10), ("agentscopev0_react_math_workflow", 5)]
)
def test_math_agent_runs_python_and_scores_the_boxed_answer(name, iters):
    tok = chatml()
    engine = ByTurn(tok, [python_call("print(17+25)"), "So \\boxed{42}"], "<|im_start|>assistant")
    workflow = WORKFLOW.get(name)()
    assert workflow.max_iters == iters
    task = Task(index=0, raw={}, prompt="What is 17+25?", truth="17 plus 25.\n#### 42")
    _, exps = serve_and_run(workflow, task, engine, tok, n=2)
    assert_exact(exps, engine.calls)
    assert len(exps) == 2
    for e in exps:
        # math_boxed_reward: the boxed 42 equals the GSM8K truth's #### 42
        assert e.reward == 1.0 and e.metrics["accuracy"] == 1.0
        assert e.metrics["tool_calls"] == 1.0 and e.metrics["tool_errors"] == 0.0
        prompt = tok.decode(e.tokens[: e.prompt_length].tolist())
        assert MATH_AGENT_PROMPT in prompt and '"name": "execute_python_code"' in prompt
        assert "<stdout>42\n</stdout>" in masked_text(tok, e)  # the code ran; its output masked
