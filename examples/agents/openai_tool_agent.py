"""A tool-using agent written against the plain `openai` client, trained inside the explorer.

    trinity run --config examples/agents/openai_tool_agent.yaml --plugin-dir examples/agents

`run_agent` is an ordinary chat loop any OpenAI-client agent has: send the messages and the
tools, run the tool calls the reply makes, append their results, repeat until a reply calls no
tool. Nothing in it knows about training. The workflow below (`openai_tool_agent`, registered by
this plugin file) hands it, per episode, the blocking client of a session of the explorer's
OpenAI-compatible endpoint (`model.session().openai_client()`, with
`explorer.rollout_model.enable_openai_api: true`): each call is recorded token for token in that
session's ledger, and the session's trajectory becomes one MULTI_TURN experience (replies
trained, tool results masked), rewarded by the task's reward fn on the final reply.

The same agent trained from outside the run, where it keeps its own process and posts its own
rewards, is `examples/serve/agent.py` (`trinity serve`).

workflow_args: `max_turns` (model calls per episode), `tools` (`trinity.workflows.agent_tools`
names or dotted paths), `system_prompt` (else the task's own system message, if any).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from trinity.common.experience import Experience
from trinity.rewards.guard import score_responses_sync
from trinity.workflows import WORKFLOW, SyncWorkflow
from trinity.workflows.agent_tools import AgentTool, resolve_tools
from trinity.workflows.base import SyncModelHandle

SYSTEM_PROMPT = (
    "Answer the question. You may call the calculator tool; give the final answer as a number."
)


def run_agent(
    client: openai.OpenAI,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[AgentTool],
    max_turns: int,
) -> tuple[str, int]:
    """The agent: (its final answer, the tool calls it made). Appends every turn to `messages`.
    Out of turns before a reply without tool calls: the answer is ""."""
    by_name = {t.name: t for t in tools}
    schemas = [t.openai() for t in tools]
    calls = 0
    for _ in range(max_turns):
        r = client.chat.completions.create(model=model, messages=messages, tools=schemas)
        reply = r.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))  # sent back as it came
        if not reply.tool_calls:
            return reply.content or "", calls
        for call in reply.tool_calls:
            tool = by_name.get(call.function.name)
            result = (
                tool.call(call.function.arguments)
                if tool is not None
                else f"error: there is no tool {call.function.name!r}"
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            calls += 1
    return "", calls


@WORKFLOW.register("openai_tool_agent")
class OpenAIToolAgent(SyncWorkflow):
    default_reward_fn_type = "math_reward"  # scores tasks whose taskset names no reward fn
    needs_openai_api = True  # pre-flight: explorer.rollout_model.enable_openai_api

    def __init__(
        self, max_turns: int = 4, tools: list[str] | None = None, system_prompt: str | None = None
    ) -> None:
        super().__init__(max_turns=max_turns, tools=tools, system_prompt=system_prompt)
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"openai_tool_agent: max_turns must be an integer >= 1: {max_turns!r}")
        self.max_turns = max_turns
        self.tools = resolve_tools(["calculator"] if tools is None else tools, "openai_tool_agent")
        self.system_prompt = system_prompt

    def run_sync(self, task: Any, model: SyncModelHandle) -> list[Experience]:
        """1. one session (an OpenAI client) per episode, `model.defaults.n` of them
        2. the agent runs each episode, in threads of its own (its client blocks)
        3. the final answers scored; each session's trajectory is an experience"""
        reward_name = task.reward_fn_type or self.default_reward_fn_type
        messages = task.to_messages()
        if self.system_prompt is not None or messages[0]["role"] != "system":
            messages = [m for m in messages if m["role"] != "system"]
            system = self.system_prompt if self.system_prompt is not None else SYSTEM_PROMPT
            messages.insert(0, {"role": "system", "content": system})
        # 1.
        sessions = [model.session() for _ in range(model.defaults.n)]

        def episode(session: SyncModelHandle) -> tuple[str, int]:
            client = session.openai_client()
            try:
                return run_agent(
                    client,
                    client.model_path,
                    [dict(m) for m in messages],
                    self.tools,
                    self.max_turns,
                )
            finally:
                client.close()

        # 2.
        with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
            outcomes = list(pool.map(episode, sessions))
        # 3.
        out = []
        # each call bounded by the taskset's reward_fn_args limits (trinity/rewards/guard.py)
        scores = score_responses_sync(task, reward_name, [answer for answer, _ in outcomes])
        for session, (answer, calls), components in zip(sessions, outcomes, scores, strict=True):
            exps = session.extract_experiences(float(sum(components.values())))
            for e in exps:
                e.metrics = {**components, "tool_calls": float(calls)}
                e.response_text = answer
                e.info["task_index"] = task.index
            out += exps
        return out
