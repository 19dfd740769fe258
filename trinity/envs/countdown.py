"""Countdown with a calculator tool: reach the target from the given numbers.

Each reply either calls the calculator, in the Hermes tool-call format the endpoint parses
(`<tool_call>{"name": "calculator", "arguments": {"expression": "8*(3+1)"}}</tool_call>`), and
gets its value back as a tool message, or gives the final answer as `<answer>8*(3+1)</answer>`,
which ends the episode. The calculator takes + - * / and parentheses over integers (parsed, never
run as Python; `trinity.rewards.countdown`).

The problem comes from `options={"numbers": [...], "target": n}` (a task row's), or else is drawn
by the reset seed as the synthetic `countdown` tasks are. Reward of the answer step:
`countdown_reward`'s (1 correct, 0.1 well-formed but wrong, 0 not an expression); a reply that
neither calls the tool nor answers: -0.1. Components: "accuracy", "format". `success`: the
answer reaches the target.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, ClassVar

from trinity.endpoint.tool_calls import hermes
from trinity.envs.base import ENV, TextEnv, message
from trinity.rewards.countdown import countdown_reward, evaluate_expression
from trinity.tasks.synthetic import countdown_question, random_expression, solve_countdown

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def calculate(expression: str) -> str:
    """The exact value of `expression` as text, or why it has none."""
    try:
        value = evaluate_expression(expression)
    except ValueError:
        return f"error: {expression!r} is not an expression of integers with + - * / ( )"
    except ZeroDivisionError:
        return "error: division by zero"
    return str(value.numerator) if value.denominator == 1 else f"{value} (= {float(value):.6g})"


@ENV.register("countdown_calculator")
class CountdownCalculator(TextEnv):
    system_prompt = (
        "Reach the target number using each given number at most once with + - * / and "
        "parentheses. You may call the calculator tool. Give the final expression as "
        "<answer>expression</answer>."
    )
    tools: ClassVar[list[dict[str, Any]]] = [CALCULATOR]
    max_turns = 6

    def __init__(
        self,
        num_numbers: int = 3,
        max_number: int = 20,
        max_target: int = 100,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(max_turns)
        self.num_numbers, self.max_number, self.max_target = num_numbers, max_number, max_target
        self.problem: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        if options and "numbers" in options and "target" in options:
            numbers, target = [int(n) for n in options["numbers"]], int(options["target"])
        else:
            numbers, target = self._draw(random.Random(seed))
        self.problem, self.turns = {"numbers": numbers, "target": target}, 0
        return message(countdown_question(numbers, target) + "."), dict(self.problem)

    def _draw(self, rng: random.Random) -> tuple[list[int], int]:
        while True:
            nums = sorted(rng.randint(1, self.max_number) for _ in range(self.num_numbers))
            expr = random_expression(nums, rng)
            if expr and expr[1].denominator == 1 and 1 <= expr[1] <= self.max_target:
                return nums, int(expr[1])

    def expert_action(self) -> str:
        """The answer found by exhaustive search over the problem's numbers."""
        found = solve_countdown(self.problem["numbers"], self.problem["target"])
        if found is None:
            raise ValueError(f"countdown_calculator: no expression solves {self.problem}")
        return f"<answer>{found}</answer>"

    def success(self, terminated: bool, reward: float, info: dict[str, Any]) -> bool:
        """Solved: the answer reaches the target (a wrong but well-formed answer scores 0.1)."""
        return terminated and info["reward_components"]["accuracy"] == 1.0

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        last = self._turn()
        answer = _ANSWER.search(action)
        if answer is not None:
            comps = countdown_reward(answer.group(1).strip(), None, self.problem)
            reply = "Correct!" if comps["accuracy"] == 1.0 else "That does not reach the target."
            return message(reply), sum(comps.values()), True, False, {"reward_components": comps}
        parsed = hermes(action)
        calls = [c for c in parsed.calls if c.name == "calculator"]
        if parsed.status == "ok" and calls:
            results = [calculate(str(json.loads(c.arguments).get("expression", ""))) for c in calls]
            comps = {"accuracy": 0.0, "format": 0.0}
            obs = message("\n".join(results), role="tool")
            return obs, 0.0, False, last, {"reward_components": comps}
        comps = {"accuracy": 0.0, "format": -0.1}
        hint = "Call the calculator tool or give <answer>expression</answer>."
        return message(hint), -0.1, False, last, {"reward_components": comps}
