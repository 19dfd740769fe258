"""`math_boxed_workflow` (Trinity-RFT's name): math with the answer asked for in `\\boxed{}`.

    buffer.explorer_input.default_workflow_type: math_boxed_workflow
    buffer.explorer_input.taskset.workflow_args: {with_think: false, format_score_coef: 0.1,
                                                  use_base: false}

`math_workflow` with three differences, as in Trinity-RFT:
- a task without a system prompt (`format.system_prompt`) gets one asking for step-by-step
  reasoning and a `\\boxed{}` answer (with `with_think`: reasoning inside `<think>...</think>`
  first);
- tasks whose taskset names no reward fn are scored by `math_boxed_reward`, and `with_think` and
  `format_score_coef` are passed to the reward fn when it takes them (the taskset's
  `reward_fn_args` win);
- `use_base: true` prompts a base model with plain text (`System: ...` / `User:` / `Assistant:`,
  then `format.reply_prefix` if set: Trinity-RFT leaves the prefix out of this prompt) through
  `generate` instead of the chat template.
"""

from __future__ import annotations

from typing import Any

from trinity.common.registry import keyword_names
from trinity.common.rollout import Sample
from trinity.workflows.base import WORKFLOW, ModelHandle
from trinity.workflows.math_workflow import MathWorkflow

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
SYSTEM_PROMPT_THINK = (
    "You are a helpful assistant that solves math problems. First think about the reasoning "
    "process in your mind, inside <think> </think> tags, then give the user the answer. Always "
    "put your final answer within \\boxed{}."
)


@WORKFLOW.register("async_math_boxed_workflow")  # Trinity-RFT's async twin
@WORKFLOW.register("math_boxed_workflow")
class MathBoxedWorkflow(MathWorkflow):
    default_reward_fn_type = "math_boxed_reward"

    def __init__(
        self, with_think: bool = False, format_score_coef: float = 0.1, use_base: bool = False
    ) -> None:
        """`with_think`: ask for (and let the reward check) `<think>` reasoning;
        `format_score_coef`: the penalty for a bad think format; `use_base`: plain-text prompt."""
        super().__init__()
        self.args = {"with_think": with_think, "format_score_coef": format_score_coef}
        self.use_base = use_base

    def messages(self, task: Any) -> list[dict[str, Any]]:
        """The task's messages (a reply prefix last), the default system prompt first when it
        has none."""
        messages = task.prompt_messages()
        if not messages or messages[0]["role"] != "system":
            prompt = SYSTEM_PROMPT_THINK if self.args["with_think"] else SYSTEM_PROMPT
            messages.insert(0, {"role": "system", "content": prompt})
        return messages

    async def sample(self, task: Any, model: ModelHandle) -> list[Sample]:
        messages = self.messages(task)
        if not self.use_base:
            return await model.chat(messages)
        prefix = task.reply_prefix or ""  # the plain prompt ends with it
        messages = [m for m in messages if not m.get("prefix")]
        system = "".join(m["content"] for m in messages if m["role"] == "system")
        user = "\n".join(m["content"] for m in messages if m["role"] != "system")
        return await model.generate(f"System:{system}\nUser:\n{user}\nAssistant:\n{prefix}")

    def reward_args(self, task: Any, reward_fn: Any) -> dict[str, Any]:
        accepted = keyword_names(reward_fn, 3)
        ours = {k: v for k, v in self.args.items() if accepted is None or k in accepted}
        return ours | dict(task.reward_fn_args)
