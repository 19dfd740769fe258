"""Trinity-RFT's variants of the math workflow: reward-model scoring, on-policy distillation, BOTS.

    buffer.explorer_input.default_workflow_type: math_rm_workflow
    buffer.explorer_input.taskset: {default_reward_fn_type: math_reward}
    buffer.explorer_input.default_workflow_type: on_policy_distill_math_workflow
    algorithm: {algorithm_type: on_policy_distill}        # teacher: explorer.auxiliary_models[0]
    buffer.explorer_input.default_workflow_type: bots_ref_eval_collect_math_boxed_workflow

- `math_rm_workflow` (and `async_math_rm_workflow`): `math_workflow` whose reward fn may also read
  the prompt, as a reward model does: it is given `messages=` (the chat the policy answered) when
  it takes that keyword. Trinity-RFT calls its reward fn (`rm_gallery_reward`) as
  `fn(response, messages, ground_truth=truth)`; ours are `fn(response, truth, row, **args)`.
- `on_policy_distill_workflow` / `on_policy_distill_math_workflow`: the student samples; the
  teacher's logprobs of the same tokens are computed by the trainer, which loads
  `explorer.auxiliary_models[0]` as its reference model (`algorithm_type: on_policy_distill`,
  `algorithm/advantages/distill.py`), where Trinity-RFT asks a served teacher inside the
  workflow; the logprobs of the same tokens are the same. So the workflow only samples, and
  neither reports the per-sample `kl_divergence` metric Trinity-RFT's does. Its reward: 0.0
  (base), or (math) the `math_reward` accuracy of the answer, under the Qwen2.5-Math prompt
  ("You are a helpful assistant." + the question + "Please reason step by step, and put your
  final answer within \\boxed{}."). `workflow_args.temperature` (the teacher's) must be 1.0:
  the trainer scores at temperature 1.
- `bots_ref_eval_collect_math_boxed_workflow`: BOTS' reference evaluation (Trinity-RFT's
  examples/bots): `math_boxed_workflow` on rows whose `prompt_key` already holds the chat (no
  system prompt is added), scored by `math_boxed_reward` whatever the taskset names (BOTS' own
  reward grades the boxed answer with naive-DAPO's matcher; ours with math-verify), that
  appends one JSON line per task, `{model_version, rewards, question, truth}`, to the file
  `$BOTS_REF_EVAL_LOG_FILE` names (default `./bots_ref_eval_log.jsonl`; `explorer.env_vars`
  can set it), under an exclusive lock so concurrent runners do not interleave lines.
  `examples/bots/workflow/bots_math_boxed_workflow.py` gives the same workflows at Trinity-RFT's
  dotted paths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
from typing import Any

from trinity.common.experience import Experience
from trinity.common.registry import keyword_names
from trinity.rewards import REWARD_FN
from trinity.workflows.base import WORKFLOW, ModelHandle, built_arg_problems
from trinity.workflows.math_boxed_workflow import MathBoxedWorkflow
from trinity.workflows.math_workflow import MathWorkflow, single_turn_experience

QWEN_MATH_SYSTEM = "You are a helpful assistant."
QWEN_MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
BOTS_LOG_ENV = "BOTS_REF_EVAL_LOG_FILE"
BOTS_LOG_DEFAULT = "./bots_ref_eval_log.jsonl"


@WORKFLOW.register("async_math_rm_workflow")
@WORKFLOW.register("math_rm_workflow")
class MathRMWorkflow(MathWorkflow):
    """`math_workflow` whose reward fn also sees the prompt (`messages=`), as a reward model."""

    def reward_args(self, task: Any, reward_fn: Any) -> dict[str, Any]:
        accepted = keyword_names(reward_fn, 3)
        ours = {"messages": task.to_messages()}  # what `sample` sent
        if accepted is not None and "messages" not in accepted:
            ours = {}
        return ours | dict(task.reward_fn_args)


@WORKFLOW.register("on_policy_distill_workflow")
class OnPolicyDistillWorkflow(MathWorkflow):
    """On-policy distillation: the student samples, reward 0.0 (module doc).

    The trainer's teacher gives the advantages."""

    default_reward_fn_type = None  # no reward fn: rows need no reference answer

    def __init__(self, temperature: float = 1.0) -> None:
        """`temperature`: the teacher's, in Trinity-RFT; only 1.0 here (the trainer's)."""
        super().__init__()
        if isinstance(temperature, bool) or temperature != 1.0:
            raise ValueError(
                f"{type(self).__name__}: temperature {temperature!r} not built here: the "
                "teacher's logprobs are computed by the trainer (its reference model) at "
                "temperature 1.0"
            )

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        return built_arg_problems(cls, args)

    def messages(self, task: Any) -> list[dict[str, Any]]:
        return task.to_messages()

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        samples = await model.chat(self.messages(task))
        responses = [model.decode(s.response_ids) for s in samples]
        scores = await asyncio.to_thread(lambda: [self.score(task, r) for r in responses])
        return [
            single_turn_experience(task, run, s, text, sum(m.values()), m)
            for run, (s, text, m) in enumerate(zip(samples, responses, scores, strict=True))
        ]

    def score(self, task: Any, response: str) -> dict[str, float]:
        """The reward's components (their sum is the reward); none: 0.0."""
        return {}


@WORKFLOW.register("on_policy_distill_math_workflow")
class OnPolicyDistillMathWorkflow(OnPolicyDistillWorkflow):
    """The Qwen2.5-Math prompt; reward = the answer's accuracy (0.0 without a reference)."""

    def messages(self, task: Any) -> list[dict[str, Any]]:
        question = task.prompt if task.prompt is not None else _last_user_text(task)
        return [
            {"role": "system", "content": QWEN_MATH_SYSTEM},
            {"role": "user", "content": f"{question}{QWEN_MATH_SUFFIX}"},
        ]

    def score(self, task: Any, response: str) -> dict[str, float]:
        if not response or not task.truth:
            return {}
        return REWARD_FN.get("math_reward")(response, task.truth, task.raw)


def _last_user_text(task: Any) -> str:
    messages = task.to_messages()
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


class BOTSMathBoxedWorkflow(MathBoxedWorkflow):
    """`math_boxed_workflow` on rows that hold the chat already, always `math_boxed_reward`."""

    def messages(self, task: Any) -> list[dict[str, Any]]:
        return task.to_messages()  # the prompts are in message form: no system prompt added

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        bots = _with_reward(task, "math_boxed_reward")
        return await super().run(bots, model)


@WORKFLOW.register("bots_ref_eval_collect_math_boxed_workflow")
class BOTSRefEvalCollectMathBoxedWorkflow(BOTSMathBoxedWorkflow):
    """`BOTSMathBoxedWorkflow` that logs each task's rewards for BOTS' reference evaluation."""

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        exps = await super().run(task, model)
        entry = {
            "model_version": model.model_version,
            "rewards": [e.reward for e in exps],
            "question": task.to_messages(),
            "truth": task.truth,
        }
        await asyncio.to_thread(
            append_locked, os.environ.get(BOTS_LOG_ENV, BOTS_LOG_DEFAULT), entry
        )
        return exps


def append_locked(path: str, entry: dict[str, Any]) -> None:
    """Append `entry` as one JSON line to `path` (its folder made), under an exclusive lock."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(json.dumps(entry) + "\n")
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _with_reward(task: Any, reward_fn_type: str) -> Any:
    """A copy of `task` scored by `reward_fn_type` (its reward_fn_args dropped: BOTS' reward
    takes none but the workflow's)."""
    return dataclasses.replace(task, reward_fn_type=reward_fn_type, reward_fn_args={})
