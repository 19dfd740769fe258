"""AgentScope's ReAct agent as a workflow: an agent framework trained through the endpoint.

    explorer.rollout_model.enable_openai_api: true
    buffer.explorer_input.default_workflow_type: agentscope_react_workflow   # or as_react_workflow
    buffer.explorer_input.taskset.workflow_args: {max_iters: 3, tools: [calculator]}

Per task, `n` episodes (the task's samples: `repeat_times` in training, 1 in evaluation), run
concurrently, each in a session of its own (`model.session()`). An episode is an AgentScope 2.x
`Agent` (`pip install 'trinity[agents]'`) and its reasoning-acting loop, unchanged: its model is
AgentScope's own `OpenAIChatModel` pointed at the session's URL on the explorer's
OpenAI-compatible endpoint. The endpoint renders the agent's messages, parses tool calls out of
the reply (`explorer.rollout_model.tool_call_parser`; a malformed call comes back as text, which
ends the loop as a final answer), the agent runs them with its `Toolkit` and sends the results
back; every call is recorded in the session's ledger and continues its trajectory token for
token. Sampling settings the agent leaves out (all, here) are the task's, as for `model.chat`.
The final message's text is scored by the task's reward fn (default `math_reward`); each episode
is one MULTI_TURN experience: replies trained, tool results and the agent's hints masked.

The agent is given the task's prompt turns (a plaintext prompt is one user turn). Its system
prompt: `system_prompt`, else the task's own system message (`format.system_prompt`), else the
`type` template's.

workflow_args:
- `type`: Trinity-RFT's prompt template name (`gsm8k`: solve with tools, answer in \\boxed{})
- `system_prompt`: the agent's system prompt (above)
- `max_iters`: reasoning-acting iterations (AgentScope's `ReActConfig.max_iters`); when they are
  used up the agent makes one more call with tools not allowed (`tool_choice: none`)
- `tools`: tool names or dotted paths (`trinity.workflows.agent_tools`, e.g. `calculator`)
- `stream`: the model streams its replies (SSE); streamed and plain calls record the same tokens

Metrics per episode: the reward components, `model_calls`, `tool_calls` (results the tools
gave), `tool_errors` (of those, errors: bad arguments, unknown tool), `exceeded_max_iters`,
`context_exceeded`.

Departs from Trinity-RFT's workflow: the answer is the final message's text, not AgentScope's
structured output (that forces a call of its output tool, `tool_choice` naming a function, which
the endpoint refuses: it cannot make a sampled reply a call). AgentScope's runtime-state
injection (the wall-clock time in the prompt) and context compression (a summary that rewrites
the history) are off, so a prompt depends on the episode alone. An episode whose prompt outgrows
the model (`context_length_exceeded`) ends there, unanswered; its calls so far are trained
(`context_exceeded` 1).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

from trinity.common.experience import Experience
from trinity.rewards.guard import score_responses
from trinity.workflows.agent_tools import AgentTool, resolve_tools
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow, built_arg_problems

TEMPLATES = {
    "gsm8k": (
        "You solve math problems step by step. You may call the tools you are given to "
        "calculate. When you are done, reply without calling a tool and put the final answer in "
        "\\boxed{}."
    ),
}
NO_COMPRESSION = 10**12  # AgentScope compresses past a share of this many (estimated) tokens


@WORKFLOW.register("agentscope_react_workflow")
class AgentScopeReActWorkflow(Workflow):
    default_reward_fn_type = "math_reward"  # scores tasks whose taskset names no reward fn
    needs_openai_api = True  # pre-flight: explorer.rollout_model.enable_openai_api

    def __init__(
        self,
        type: str = "gsm8k",
        system_prompt: str | None = None,
        max_iters: int = 5,
        tools: list[str] | None = None,
        stream: bool = False,
    ) -> None:
        """Raises ValueError naming the bad argument (see the module doc for each)."""
        super().__init__(
            type=type, system_prompt=system_prompt, max_iters=max_iters, tools=tools, stream=stream
        )
        what = "agentscope_react_workflow"
        _require_agentscope(what)
        if system_prompt is None and type not in TEMPLATES:
            raise ValueError(
                f"{what}: unknown type {type!r}; templates: {', '.join(sorted(TEMPLATES))} "
                "(or set system_prompt)"
            )
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"{what}: max_iters must be an integer >= 1, got {max_iters!r}")
        self.type, self.system_prompt = type, system_prompt
        self.max_iters = max_iters
        self.tools: list[AgentTool] = resolve_tools(
            ["calculator"] if tools is None else list(tools), what
        )
        self.stream = bool(stream)

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        """What is wrong with `workflow_args` (pre-flight): building the workflow checks them."""
        return built_arg_problems(cls, args)

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. one session per episode (`model.defaults.n` of them), each with its own agent
        2. run the episodes concurrently: the agent replies to the task's prompt
        3. score each final answer with the task's reward fn (bounded: rewards/guard.py)
        4. each session's trajectories as experiences, rewarded and with the episode's metrics
        """
        reward_name = task.reward_fn_type or self.default_reward_fn_type
        system, inputs = _prompt(task)
        system = self.system_prompt if self.system_prompt is not None else system
        # 1. and 2. (an episode that fails cancels the others: the try fails as a whole)
        sessions = [model.session() for _ in range(model.defaults.n)]
        async with asyncio.TaskGroup() as group:
            running = [
                group.create_task(self._episode(s, system or TEMPLATES[self.type], inputs))
                for s in sessions
            ]
        episodes = [t.result() for t in running]
        # 3.
        scores = await score_responses(task, reward_name, [ep.answer for ep in episodes])
        # 4.
        out: list[Experience] = []
        for session, ep, components in zip(sessions, episodes, scores, strict=True):
            reward = float(sum(components.values()))
            exps = session.extract_experiences(reward)
            metrics = {k: float(v) for k, v in components.items()} | ep.metrics(exps)
            for e in exps:
                e.metrics = dict(metrics)
                e.response_text = ep.answer
                e.info.update({"task_index": task.index, "truth": task.truth})
                out.append(e)
        return out

    async def _episode(
        self, session: ModelHandle, system: str, inputs: list[tuple[str, str]]
    ) -> _Episode:
        import openai
        from agentscope.agent import Agent, InjectionConfig, ReActConfig
        from agentscope.credential import OpenAICredential
        from agentscope.message import AssistantMsg, UserMsg
        from agentscope.model import OpenAIChatModel
        from agentscope.tool import Toolkit

        client = session.async_openai_client()  # the session's URL and the served model's name
        chat_model = OpenAIChatModel(
            credential=OpenAICredential(api_key=client.api_key, base_url=str(client.base_url)),
            model=client.model_path,
            stream=self.stream,
            max_retries=0,  # an endpoint error is an answer, not a flaky network
            context_size=NO_COMPRESSION,
            client_kwargs={"max_retries": 0},
        )
        await client.close()
        agent = Agent(
            name="agent",
            system_prompt=system,
            model=chat_model,
            toolkit=Toolkit(tools=[t.agentscope() for t in self.tools]),
            react_config=ReActConfig(max_iters=self.max_iters),
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        ep = _Episode(agent)
        try:
            msgs = [
                UserMsg(name="user", content=text)
                if role == "user"
                else AssistantMsg(name="agent", content=text)
                for role, text in inputs
            ]
            final = await agent.reply(msgs)
            ep.answer = final.get_text_content() or ""
            ep.exceeded = final.finished_reason == "exceed_max_iters"
        except openai.BadRequestError as e:
            if e.code != "context_length_exceeded":
                raise
            ep.context_exceeded = True  # the episode ends unanswered (module doc)
        finally:
            await chat_model.client.close()
        return ep


WORKFLOW.register("as_react_workflow")(AgentScopeReActWorkflow)  # Trinity-RFT's other name


class _Episode:
    """One agent and how its episode went."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.answer = ""
        self.exceeded = self.context_exceeded = False

    def metrics(self, experiences: list[Experience]) -> dict[str, float]:
        """The episode's metrics (module doc); `experiences`: its session's."""
        results = [
            block
            for msg in self.agent.state.context
            for block in msg.get_content_blocks("tool_result")
        ]
        return {
            "model_calls": float(sum(len(e.info["turns"]) for e in experiences)),
            "tool_calls": float(len(results)),
            "tool_errors": float(sum(r.state == "error" for r in results)),
            "exceeded_max_iters": float(self.exceeded),
            "context_exceeded": float(self.context_exceeded),
        }


def _require_agentscope(what: str) -> None:
    """ValueError unless AgentScope 2.x is installed (checked without importing it)."""
    try:
        version = importlib.metadata.version("agentscope")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"{what} runs AgentScope 2.x, which is not installed: pip install 'trinity[agents]'"
        ) from None
    if int(version.split(".")[0]) < 2:
        raise ValueError(
            f"{what} runs AgentScope 2.x; agentscope {version} is installed: "
            "pip install 'agentscope>=2.0'"
        )


def _prompt(task: Any) -> tuple[str | None, list[tuple[str, str]]]:
    """(the task's system message or None, its other turns as (role, text)): the agent is given
    the turns; a plaintext prompt is one user turn."""
    messages = task.to_messages()
    system = None
    if messages and messages[0].get("role") == "system":
        system = str(messages.pop(0).get("content") or "")
    turns = []
    for m in messages:
        role, text = m.get("role"), m.get("content")
        if role not in ("user", "assistant") or not isinstance(text, str):
            raise ValueError(
                f"agentscope_react_workflow: task {task.index} of {task.taskset_name!r}: the "
                f"agent takes user and assistant turns of text, got a {role!r} message"
            )
        turns.append((role, text))
    if not turns or turns[-1][0] != "user":
        raise ValueError(
            f"agentscope_react_workflow: task {task.index} of {task.taskset_name!r}: the prompt "
            "must end with a user turn"
        )
    return system, turns
