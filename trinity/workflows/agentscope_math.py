"""Trinity-RFT's AgentScope math agents: a ReAct agent with a Python tool, boxed answers.

`agentscope_react_math_workflow` (Trinity-RFT's AgentScope 1.x agent) and
`agentscopev0_react_math_workflow` (its AgentScope 0.x agent), both run here as our
`agentscope_react_workflow` (AgentScope 2.x through the endpoint; its docstring says how).

    explorer.rollout_model: {enable_openai_api: true, tool_call_parser: hermes}
    buffer.explorer_input.default_workflow_type: agentscope_react_math_workflow

As in Trinity-RFT: the agent's system prompt asks it to solve the problem, optionally writing and
running Python code, and to put the final answer in \\boxed{}; its one tool is
`execute_python_code` (`trinity.workflows.agent_tools`: a fresh Python process, no sandbox, 300 s
timeout, as Trinity-RFT runs AgentScope's with `use_docker: false`); the final answer is scored by
`math_boxed_reward` against the truth (a GSM8K solution's `#### answer` counts). Reasoning-acting
iterations: 10 (AgentScope 1.x's default) and 5 (Trinity-RFT's v0 agent).

Departs from Trinity-RFT: one multi-turn experience per episode rather than one per model call,
the answer is the final message's text (`agentscope_react_workflow`), a taskset that names a
reward fn is scored by it (Trinity-RFT always uses its boxed reward), and the workflow_args of
`agentscope_react_workflow` (`max_iters`, `tools`, `system_prompt`, `stream`) are accepted.
"""

from __future__ import annotations

from trinity.workflows.agentscope_react import AgentScopeReActWorkflow
from trinity.workflows.base import WORKFLOW

MATH_AGENT_PROMPT = (
    "You are an agent specialized in solving math problems with tools. Please solve the math "
    "problem given to you. You can write and execute Python code to perform calculation or "
    "verify your answer. You should return your final answer within \\boxed{}."
)


@WORKFLOW.register("agentscope_react_math_workflow")
class AgentScopeReactMathWorkflow(AgentScopeReActWorkflow):
    default_reward_fn_type = "math_boxed_reward"
    default_max_iters = 10

    def __init__(
        self,
        max_iters: int | None = None,
        tools: list[str] | None = None,
        system_prompt: str | None = None,
        stream: bool = False,
    ) -> None:
        super().__init__(
            system_prompt=MATH_AGENT_PROMPT if system_prompt is None else system_prompt,
            max_iters=self.default_max_iters if max_iters is None else max_iters,
            tools=["execute_python_code"] if tools is None else tools,
            stream=stream,
        )


@WORKFLOW.register("agentscopev0_react_math_workflow")
class AgentScopeV0ReactMathWorkflow(AgentScopeReactMathWorkflow):
    default_max_iters = 5
