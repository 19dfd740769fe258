"""Tools for agent workflows: a name, an OpenAI function schema and a Python function.

    buffer.explorer_input.taskset.workflow_args: {tools: [calculator]}
    buffer.explorer_input.taskset.workflow_args: {tools: [my_pkg.tools.WEATHER]}   # dotted path

A tool is an `AgentTool`, registered in `AGENT_TOOL` (or named by a dotted path to one). An agent
framework takes it in its own form: `openai()` is the OpenAI `tools` entry a plain client sends,
`agentscope()` an AgentScope `FunctionTool` allowed to run without asking a user (a workflow has
none to ask). `call(arguments)` runs it on a parsed tool call's arguments and answers with text;
bad arguments are answered (as an error the model reads), never raised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trinity.common.registry import Registry
from trinity.envs.countdown import CALCULATOR, calculate


@dataclass(frozen=True)
class AgentTool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    fn: Callable[..., str]  # the arguments as keyword arguments -> the result's text

    def openai(self) -> dict[str, Any]:
        """The tool as an entry of an OpenAI request's `tools`."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def call(self, arguments: str | dict[str, Any]) -> str:
        """The result of calling the tool with `arguments` (a JSON object or its text); an
        argument list the function refuses is answered with the reason."""
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
            if not isinstance(args, dict):
                raise TypeError("the arguments are not a JSON object")
            return str(self.fn(**args))
        except (TypeError, ValueError) as e:
            return f"error: {self.name} cannot take {arguments!r}: {e}"

    def agentscope(self) -> Any:
        """The tool as an AgentScope 2.x `FunctionTool`, allowed to run (imports agentscope)."""
        from agentscope.permission import PermissionBehavior, PermissionDecision
        from agentscope.tool import FunctionTool

        return FunctionTool(
            self.fn,
            name=self.name,
            description=self.description,
            input_schema=self.parameters,
            permission=PermissionDecision(
                behavior=PermissionBehavior.ALLOW, message=f"{self.name}: a workflow's own tool"
            ),
        )


AGENT_TOOL: Registry[AgentTool] = Registry("agent_tool")


def resolve_tools(names: list[str], what: str) -> list[AgentTool]:
    """The `AgentTool`s `names` name (registered names or dotted paths); ValueError naming the
    first that is unknown or not an `AgentTool`, and a name given twice."""
    tools = []
    for name in names:
        try:
            tool = AGENT_TOOL.get(name)
        except (LookupError, ImportError) as e:
            raise ValueError(f"{what}: tools: {e}") from None
        if not isinstance(tool, AgentTool):
            raise ValueError(
                f"{what}: tools: {name!r} is a {type(tool).__name__}, not an AgentTool "
                "(trinity.workflows.agent_tools)"
            )
        tools.append(tool)
    seen = [t.name for t in tools]
    if len(set(seen)) != len(seen):
        raise ValueError(f"{what}: tools: a tool is named twice in {names}")
    return tools


def _calculator(expression: str) -> str:
    return calculate(expression)


AGENT_TOOL.register("calculator")(
    AgentTool(
        name="calculator",
        description=CALCULATOR["function"]["description"],
        parameters=CALCULATOR["function"]["parameters"],
        fn=_calculator,
    )
)


PYTHON_TIMEOUT_S = 300.0  # AgentScope's execute_python_code, as Trinity-RFT's math agents set it


def execute_python_code(code: str, timeout: float = PYTHON_TIMEOUT_S) -> str:
    """Run `code` in a fresh Python process (this interpreter, no sandbox: as Trinity-RFT's math
    agents run AgentScope's `execute_python_code` with `use_docker=False`); its exit code,
    stdout and stderr as AgentScope formats them. A run past `timeout` seconds is killed and
    answered with a message saying so."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=float(timeout)
        )
    except subprocess.TimeoutExpired:
        return (
            f"<returncode>-1</returncode><stdout></stdout><stderr>TimeoutError: the code ran "
            f"past {timeout} seconds</stderr>"
        )
    return (
        f"<returncode>{done.returncode}</returncode><stdout>{done.stdout}</stdout>"
        f"<stderr>{done.stderr}</stderr>"
    )


AGENT_TOOL.register("execute_python_code")(
    AgentTool(
        name="execute_python_code",
        description=(
            "Execute Python code and return its exit code, stdout and stderr. Print the values "
            "you want to see."
        ),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
        fn=lambda code: execute_python_code(code),
    )
)
