"""`toolcall_workflow`: single-turn tool calls scored against the reference calls (Tool-N1).

Trinity-RFT's names: `toolcall_workflow`, `tool_call_workflow`. Tool-N1: Zhang et al.,
arXiv:2505.00024.

    buffer.explorer_input.default_workflow_type: toolcall_workflow   # rows: ToolACE, processed

A row holds `raw_system` (the system prompt), `tools` (a JSON list of function definitions),
`conversations` (turns `{from, value}`, from = human/user, gpt/assistant, observation/tool,
function_call) and `answer` (a JSON list of the expected calls `{name, arguments}`), as
Trinity-RFT's `examples/grpo_toolcall/get_toolace_data.py` writes them; the workflow builds the
prompt from them (the taskset's `prompt_key` is not read). The system message is `raw_system`
followed by Tool-N1's tool prompt listing each tool as `{"type": "function", "function": tool}`
and asking for `<think>...</think>` then `<tool_call>[{"name": ..., "arguments": ...}]</tool_call>`.

Reward (binary, Tool-N1's rule; also the `accuracy` metric): 1.0 when the reply has exactly one
`<think>` and one `</think>`, the think block closes before the first `<tool_call>`, the last
`<tool_call>...</tool_call>` holds JSON (a call or a list of calls, each with `name` and
`arguments`), and those calls equal the answer's as a multiset of (name, arguments); 0.0
otherwise. An empty answer is matched by an empty list of calls.

Departs from Trinity-RFT: a row without `answer` is refused when the taskset is read (Trinity-RFT
logs an error and rewards 0.0), and a `<tool_call>` holding JSON that is neither a call nor a
list scores 0.0 (Trinity-RFT raises).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from typing import Any, ClassVar

from trinity.common.experience import Experience
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow
from trinity.workflows.math_workflow import single_turn_experience

TOOL_PROMPT = """# Tool

<tools>
{tools}
</tools>

In each action step, you MUST:
1. Think about the reasoning process in the mind and enclosed your reasoning within <think> </think> XML tags.
2. Then, provide a json object with function names and arguments within <tool_call></tool_call> XML tags. i.e., <tool_call>[{{"name": <function-name>, "arguments": <args-json-object>}}, {{"name": <function-name2>, "arguments": <args-json-object2>}}, ...]</tool_call>
3. Make sure both the reasoning and the tool call steps are included together in one single reply.
A complete reply example is: <think>To address the query, I need to send the email to Bob and then buy the banana through walmart. </think> <tool_call> [{{"name": "email", "arguments": {{"receiver": "Bob", "content": "I will bug banana through walmart"}}}}, {{"name": "walmart", "arguments": {{"input": "banana"}}}}]</tool_call>. Please make sure the type of the arguments is correct.
"""

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
}
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json(value: Any) -> Any:
    """A JSON text parsed; anything else as it is (rows read from JSON may hold either)."""
    return json.loads(value) if isinstance(value, str) else value


def toolcall_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """The prompt of a ToolACE row: the system message with the tools, then its turns."""
    tools = "\n".join(json.dumps({"type": "function", "function": t}) for t in _json(row["tools"]))
    messages = [{"role": "system", "content": row["raw_system"] + TOOL_PROMPT.format(tools=tools)}]
    for turn in row["conversations"]:
        who = turn["from"]
        if who == "function_call":
            messages.append({"role": "assistant", "content": json.dumps(turn["value"])})
        elif who in _ROLES:
            messages.append({"role": _ROLES[who], "content": turn["value"]})
        else:
            raise ValueError(f"toolcall_workflow: a turn from {who!r}; valid: {sorted(_ROLES)}")
    return messages


def _calls_of(reply: str) -> list[Any] | None:
    """The calls in the reply's last `<tool_call>` block; None without readable JSON."""
    blocks = _TOOL_CALL.findall(reply)
    if not blocks:
        return None
    try:
        calls = json.loads(blocks[-1].strip())
        if isinstance(calls, str):
            calls = json.loads(calls)
    except json.JSONDecodeError:
        return None
    if isinstance(calls, dict):
        return [calls]
    return calls if isinstance(calls, list) else None


def _same_calls(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    if not got or not want:
        return len(got) == len(want)
    try:
        key = Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in got)
        return key == Counter((c["name"], json.dumps(c["arguments"], sort_keys=True)) for c in want)
    except TypeError:  # an unhashable name: not a call
        return False


def toolcall_reward(reply: str, answer: Any) -> float:
    """Tool-N1's binary reward of `reply` against the expected calls `answer` (module doc)."""
    want = _json(_json(answer))
    calls = _calls_of(reply)
    if calls is None or reply.count("<think>") != 1 or reply.count("</think>") != 1:
        return 0.0
    first_call = reply.find("<tool_call>")
    if reply.find("</think>") > first_call:
        return 0.0
    if not all(isinstance(c, dict) and "name" in c and "arguments" in c for c in calls):
        return 0.0
    return float(_same_calls(calls, want))


@WORKFLOW.register("tool_call_workflow")
@WORKFLOW.register("toolcall_workflow")
class ToolCallWorkflow(Workflow):
    row_fields: ClassVar[tuple[str, ...]] = ("raw_system", "tools", "conversations", "answer")

    def __init__(self) -> None:
        """No workflow_args."""
        super().__init__()

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        samples = await model.chat(toolcall_messages(task.raw))
        replies = [model.decode(s.response_ids) for s in samples]
        answer = task.raw["answer"]
        rewards = await asyncio.to_thread(lambda: [toolcall_reward(r, answer) for r in replies])
        return [
            single_turn_experience(task, run, s, text, r, {"accuracy": r})
            for run, (s, text, r) in enumerate(zip(samples, replies, rewards, strict=True))
        ]
