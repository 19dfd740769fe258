"""Single-turn math: one chat prompt, `repeat_times` sampled answers, each scored by a reward fn.

    buffer.explorer_input.default_workflow_type: math_workflow
    buffer.explorer_input.default_reward_fn_type: arithmetic_reward   # or math_reward, ...

The reward is the sum of the reward fn's named components (e.g. accuracy + format); each
component is also kept in `Experience.metrics` so the monitor reports it separately.

With `format.reply_prefix` (e.g. `"<think>"`) every reply is forced to start with that text: its
tokens end the prompt (never trained), and the reward fn scores what was sampled after it, as in
Trinity-RFT (`Task.prompt_messages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity.common.experience import EID, Experience, ExperienceKind
from trinity.common.lazy import lazy_module
from trinity.common.rollout import Sample
from trinity.rewards import REWARD_FN
from trinity.rewards.guard import score_responses
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
    takes_reply_prefix = True  # samples `task.prompt_messages()` (format.reply_prefix)
    passes_response_length = True  # to a reward fn that asks (`needs_response_length`)

    def __init__(self) -> None:
        """No workflow_args: pre-flight refuses any key under `workflow_args`."""
        super().__init__()

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        reward_name = task.reward_fn_type or self.default_reward_fn_type
        reward_fn = REWARD_FN.get(reward_name)
        samples = await self.sample(task, model)
        responses = [model.decode(s.response_ids) for s in samples]
        reward_args = self.reward_args(task, reward_fn)
        # scored off the event loop, so slow reward code does not hold up other tasks' requests
        # (their samples are keyed, so the batching this timing decides does not change them),
        # each call bounded by the taskset's limits; a failed call fails the try (guard.py)
        wants_length = getattr(reward_fn, "needs_response_length", None)
        if wants_length is not None and wants_length(reward_args):  # DAPO's overlong penalty
            scores = []
            for response, sample in zip(responses, samples, strict=True):
                args = {**reward_args, "response_length": len(sample.response_ids)}
                scores += await score_responses(task, reward_name, [response], args)
        else:
            scores = await score_responses(task, reward_name, responses, reward_args)
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
        """The task's samples: one chat call on its messages (and its row's tools, if any),
        the reply forced to start with `format.reply_prefix` when one is set."""
        return await model.chat(task.prompt_messages(), tools=task.tools)

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
        **top_logprobs(sample),
    )


def top_logprobs(sample: Sample) -> dict[str, Any]:
    """The Experience fields of a sample's top-k logprobs (`rollout_args.logprobs`): none
    without them."""
    if sample.top_ids is None or sample.top_logprobs is None:
        return {}
    k = len(sample.top_ids[0]) if sample.top_ids else 0
    return {
        "topk_ids": torch.tensor(sample.top_ids, dtype=torch.long).reshape(-1, k),
        "topk_logprobs": torch.tensor(sample.top_logprobs, dtype=torch.float32).reshape(-1, k),
    }
