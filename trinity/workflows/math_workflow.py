"""Single-turn math: one chat prompt, `repeat_times` sampled answers, each scored by a reward fn.

    buffer.explorer_input.default_workflow_type: math_workflow
    buffer.explorer_input.default_reward_fn_type: arithmetic_reward   # or math_reward, ...

The reward is the sum of the reward fn's named components (e.g. accuracy + format); each
component is also kept in `Experience.metrics` so the monitor reports it separately.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from trinity.common.experience import EID, Experience, ExperienceKind
from trinity.common.lazy import lazy_module
from trinity.common.rollout import Sample
from trinity.rewards import REWARD_FN
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow

if TYPE_CHECKING:
    import torch
else:  # the driver imports this module's users without torch (`common.lazy`)
    torch = lazy_module("torch")

DEFAULT_REWARD_FN = "math_reward"


@WORKFLOW.register("async_math_workflow")  # Trinity-RFT's async twin: every workflow is async here
@WORKFLOW.register("math_workflow")
class MathWorkflow(Workflow):
    default_reward_fn_type = DEFAULT_REWARD_FN  # scores tasks whose taskset names no reward fn

    def __init__(self) -> None:
        """No workflow_args: pre-flight refuses any key under `workflow_args`."""
        super().__init__()

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        reward_name = task.reward_fn_type or self.default_reward_fn_type
        reward_fn = REWARD_FN.get(reward_name)
        samples = await self.sample(task, model)
        responses = [model.decode(s.response_ids) for s in samples]
        reward_args = self.reward_args(task, reward_fn)
        # scored in a thread, so slow reward code does not hold up other tasks' requests (their
        # samples are keyed, so the batching this timing decides does not change them)
        scores = await asyncio.to_thread(
            lambda: [reward_fn(r, task.truth, task.raw, **reward_args) for r in responses]
        )
        return [
            single_turn_experience(
                task,
                run,
                sample,
                response,
                float(sum(components.values())),
                {k: float(v) for k, v in components.items()},
            )
            for run, (sample, response, components) in enumerate(
                zip(samples, responses, scores, strict=True)
            )
        ]

    async def sample(self, task: Any, model: ModelHandle) -> list[Sample]:
        """The task's samples: one chat call on its messages (and its row's tools, if any)."""
        return await model.chat(task.to_messages(), tools=task.tools)

    def reward_args(self, task: Any, reward_fn: Any) -> dict[str, Any]:
        """Keyword arguments of the reward fn: the taskset's `reward_fn_args`."""
        return dict(task.reward_fn_args)


def single_turn_experience(
    task: Any,
    run: int,
    sample: Sample,
    response: str,
    reward: float,
    metrics: dict[str, float],
) -> Experience:
    """Sample `run` of a single-turn task as a SINGLE_TURN experience (prompt + the sampled
    response, the engine's logprobs)."""
    return Experience(
        tokens=torch.tensor(sample.prompt_ids + sample.response_ids),
        prompt_length=len(sample.prompt_ids),
        logprobs=torch.tensor(sample.logprobs, dtype=torch.float32),
        reward=reward,
        eid=EID(task=task.index, run=run),
        model_version=sample.model_version,
        truncated=sample.finish_reason == "length",
        kind=ExperienceKind.SINGLE_TURN,
        response_text=response,
        info={"task_index": task.index, "truth": task.truth},
        metrics=metrics,
    )
