"""The rows tests/trinity_examples.py generates for Trinity-RFT's examples: an addition problem
per row under the config's own format keys, plus what its workflow or reward reads beyond them
(ROW_EXTRAS, by registered name)."""

from __future__ import annotations

import json
from typing import Any


def set_key(row: dict, key: str, value: Any) -> None:
    """row[key] = value, a dotted key (`reward_model.ground_truth`) as nested objects."""
    *parents, last = key.split(".")
    for p in parents:
        row = row.setdefault(p, {})
    row[last] = value


def task_row(fmt: dict, workflow: str | None, reward: str | None, i: int) -> dict:
    """Row i of a taskset read with format `fmt` by `workflow` and `reward`: an addition
    problem with its answer, plus what the workflow or reward reads (ROW_EXTRAS)."""
    a, b = i + 1, i + 2
    question = f"What is {a} + {b}?"
    row: dict[str, Any] = {}
    prompt_key = fmt.get("prompt_key", "prompt")
    if prompt_key == "messages" or fmt.get("prompt_type") == "messages":
        set_key(row, fmt.get("messages_key", "messages"), [{"role": "user", "content": question}])
        if prompt_key != "messages":
            set_key(row, prompt_key, question)
    else:
        set_key(row, prompt_key, question)
    set_key(row, fmt.get("response_key", "response"), str(a + b))
    for name in (workflow, reward):
        for key, make in ROW_EXTRAS.get(name or "", {}).items():
            row[key] = make(a, b, i)
    return row


def train_row(fmt: dict, i: int) -> dict:
    """Row i of an SFT or DPO buffer with format `fmt`: messages, prompt/response, or a pair."""
    a, b = i + 1, i + 2
    question, answer = f"What is {a} + {b}?", str(a + b)
    row: dict[str, Any] = {}
    if fmt.get("prompt_type") == "messages":
        row[fmt.get("messages_key", "messages")] = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
        return row
    row[fmt.get("prompt_key", "prompt")] = question
    if "chosen_key" in fmt or "rejected_key" in fmt:
        row[fmt.get("chosen_key", "chosen")] = answer
        row[fmt.get("rejected_key", "rejected")] = str(a + b + 1)
    else:
        row[fmt.get("response_key", "response")] = answer
    return row


def _tool_answer(a: int, b: int, i: int) -> str:
    return json.dumps([{"name": "add", "arguments": {"a": a, "b": b}}])


_TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]

# row keys a workflow or reward reads beyond the format's keys, by its registered name
ROW_EXTRAS: dict[str, dict[str, Any]] = {
    "countdown_reward": {
        "numbers": lambda a, b, i: [a, b],
        "target": lambda a, b, i: a + b,
    },
    "toolcall_workflow": {  # a ToolACE row
        "raw_system": lambda a, b, i: "You are a helpful assistant with a calculator.",
        "tools": lambda a, b, i: json.dumps(_TOOLS),
        "conversations": lambda a, b, i: [{"from": "user", "value": f"Add {a} and {b}."}],
        "answer": _tool_answer,
    },
    "frozen_lake_workflow": {  # {seed, size, p}: a 3x3 map drawn by chance
        "seed": lambda a, b, i: i,
        "size": lambda a, b, i: 3,
        "p": lambda a, b, i: 0.8,
    },
    "examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow": {
        "seed": lambda a, b, i: i,
        "size": lambda a, b, i: 3,
        "p": lambda a, b, i: 0.8,
    },
    "email_search_workflow": {  # an ART-E query of the inbox EMAILS builds
        "question": lambda a, b, i: f"What is the sum in email {i}?",
        "answer": lambda a, b, i: str(a + b),
        "message_ids": lambda a, b, i: [f"<{i}@x>"],
        "inbox_address": lambda a, b, i: "jeff@x",
        "query_date": lambda a, b, i: "2001-06-01",
    },
    "examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow": {
        "decision_truth": lambda a, b, i: "stop" if i % 2 else "continue",
        "info_truth": lambda a, b, i: f"the sum of {a} and {b}",
    },
    "alfworld_workflow": {"game_file": lambda a, b, i: f"game_{i}.tw-pddl"},
    "RAFT_alfworld_workflow": {"game_file": lambda a, b, i: f"game_{i}.tw-pddl"},
    "RAFT_reflect_alfworld_workflow": {"game_file": lambda a, b, i: f"game_{i}.tw-pddl"},
    "step_wise_alfworld_workflow": {"game_file": lambda a, b, i: f"game_{i}.tw-pddl"},
    "webshop_workflow": {"task_id": lambda a, b, i: i},
    "sciworld_workflow": {
        "task_desc": lambda a, b, i: json.dumps({"task_name": "boil", "var_num": i})
    },
    "simple_mm_workflow": {"images": lambda a, b, i: []},
}
