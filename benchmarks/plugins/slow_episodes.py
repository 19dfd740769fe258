"""A workflow whose rollouts wait before they run: an environment, a tool or a sandbox that is
slower than the model, so the explorer is the bottleneck and the trainer would otherwise idle.

    buffer.explorer_input.default_workflow_type: slow_episodes.SlowMathWorkflow
    buffer.explorer_input.taskset.workflow_args: {delay_s: 2.0}   (PYTHONPATH holds this folder)
"""

from __future__ import annotations

import asyncio
from typing import Any

from trinity.common.experience import Experience
from trinity.workflows.math_workflow import MathWorkflow


class SlowMathWorkflow(MathWorkflow):
    """The quickstart's `math_workflow`, each task's rollout (its samples) first waiting `delay_s`."""

    def __init__(self, delay_s: float = 2.0) -> None:
        super().__init__()
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.delay = float(delay_s)

    async def run(self, task: Any, model: Any) -> list[Experience]:
        await asyncio.sleep(self.delay)
        return await super().run(task, model)
