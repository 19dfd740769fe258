"""`toolcall_workflow`: Tool-N1's prompt from a ToolACE row and its binary reward."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fake_engine import FakeEngine
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.tasks.files import TasksetError
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW
from trinity.workflows.toolcall import toolcall_messages, toolcall_reward

WEATHER = {"name": "weather", "description": "Weather of a city", "parameters": {}}
ROW = {
    "raw_system": "You are a helper.",
    "tools": json.dumps([WEATHER]),
    "conversations": [{"from": "user", "value": "Weather in Paris and Rome?"}],
    "answer": json.dumps(
        [
            {"name": "weather", "arguments": {"city": "Paris"}},
            {"name": "weather", "arguments": {"city": "Rome"}},
        ]
    ),
}
CALLS = '[{"name": "weather", "arguments": {"city": "Rome"}}, ' + (
    '{"name": "weather", "arguments": {"city": "Paris"}}]'
)


@pytest.mark.parametrize(
    "reply, reward",
    [
        (f"<think>two cities</think><tool_call>{CALLS}</tool_call>", 1.0),  # order does not count
        (f"<think>a</think><tool_call>[]</tool_call> <tool_call>{CALLS}</tool_call>", 1.0),
        (f"<tool_call>{CALLS}</tool_call>", 0.0),  # no think block
        (f"<think>a</think><think>b</think><tool_call>{CALLS}</tool_call>", 0.0),  # two
        (f"<tool_call>{CALLS}</tool_call><think>late</think>", 0.0),  # think after the call
        ("<think>a</think><tool_call>not json</tool_call>", 0.0),
        ("<think>a</think> no call", 0.0),
        ('<think>a</think><tool_call>{"name": "weather", "arguments": {"city": "Paris"}}'
         "</tool_call>", 0.0),  # one call of two: a single object is a list of one
        ('<think>a</think><tool_call>[{"name": "weather"}]</tool_call>', 0.0),  # no arguments
        ("<think>a</think><tool_call>5</tool_call>", 0.0),  # JSON, not a call
    ],
)  # fmt: skip
def test_reward(reply, reward):
    assert toolcall_reward(reply, ROW["answer"]) == reward


def test_an_empty_answer_is_matched_by_no_calls_only():
    assert toolcall_reward("<think>none</think><tool_call>[]</tool_call>", "[]") == 1.0
    assert toolcall_reward(f"<think>x</think><tool_call>{CALLS}</tool_call>", "[]") == 0.0


def test_prompt_lists_the_tools_in_the_system_message_and_maps_roles():
    row = dict(ROW, conversations=[
        {"from": "human", "value": "hi"},
        {"from": "function_call", "value": {"name": "weather"}},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "It is sunny."},
    ])  # fmt: skip
    messages = toolcall_messages(row)
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("You are a helper.# Tool\n\n<tools>\n")
    assert json.dumps({"type": "function", "function": WEATHER}) in messages[0]["content"]
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "hi"),
        ("assistant", '{"name": "weather"}'),
        ("tool", "sunny"),
        ("assistant", "It is sunny."),
    ]


def test_workflow_samples_and_scores():
    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.0)
    engine.plan = [(f"<think>t</think><tool_call>{CALLS}</tool_call>", "stop"), ("no", "stop")]
    handle = TaskModelHandle(engine, tok, SamplingParams(n=2))
    task = Task(index=0, raw=ROW)
    exps = asyncio.run(WORKFLOW.get("toolcall_workflow")().run(task, handle))
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert exps[0].metrics == {"accuracy": 1.0}
    assert "Weather in Paris and Rome?" in tok.decode(engine.calls[0][0])
    assert WORKFLOW.get("tool_call_workflow") is WORKFLOW.get("toolcall_workflow")


def test_the_taskset_reads_rows_without_a_prompt_key(tmp_path):
    from trinity.config.buffer_schema import StorageConfig
    from trinity.tasks.taskset import load_taskset

    path = tmp_path / "toolace.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    storage = StorageConfig(
        name="toolace", path=str(path), default_workflow_type="toolcall_workflow"
    )
    (task,) = load_taskset(storage)
    assert task.prompt is None and task.raw["answer"] == ROW["answer"]
    path.write_text(json.dumps({k: v for k, v in ROW.items() if k != "answer"}) + "\n")
    with pytest.raises(
        TasksetError, match="row has no 'answer', which workflow 'toolcall_workflow'"
    ):
        load_taskset(storage)
