"""Learn2Ask (Trinity-RFT's `examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow`):
train a doctor model to ask the next useful question of a patient, or to stop asking.

    buffer.explorer_input.default_workflow_type:
      examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow
    buffer.explorer_input.taskset.workflow_args: {train_mode: Ra+Rs, fusion_mode: default}
    explorer.auxiliary_models: [{model_path: ...}]      # the grader: auxiliary model 0

A row holds the conversation so far (`format.prompt_key`: a chat list, or a text),
`decision_truth` ("continue" or "stop"; default "continue") and `info_truth` (the reference
information a good question asks about; default "None"). The policy answers the doctor's system
prompt plus the conversation, `repeat_times` times. Each reply is scored:

- decision (R_s, `action_score`): the reply stops (it holds `<stop />`) exactly when the row's
  decision is "stop": 1.0, else 0.0 (and the other two scores are 0.0);
- when the decision is right and is "continue", the grader (auxiliary model 0) reads the
  dialogue (`patient: ...` / `doctor: ...` lines, the reply last) and the reference information
  and answers `<format_score>` and `<content_score>` (R_a) tags; a missing or unreadable tag
  scores 0.0;
- when the decision is right and is "stop": content 1.0, format 1.0 only for a reply that is
  exactly `<stop />`.

Reward by `train_mode`: `Ra+Rs` (default) `action·(1 + 2·content) + format`, or with
`fusion_mode: sum` `action + content + format`; `Ra` `2·content + format` (the system prompt
asks for no stop decision); `Rs` `3·action + format`. Metrics: the three scores.

Departs from Trinity-RFT: the grader is asked once (a failing call fails the task, which the
explorer retries), not retried five times and then scored 0.0.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from examples.learn_to_ask.workflow.prompt_learn2ask import (
    GRADER_PROMPT,
    ROLLOUT_PROMPT,
    ROLLOUT_PROMPT_RA,
)
from trinity.common.experience import Experience
from trinity.workflows.base import ModelHandle, Workflow, built_arg_problems
from trinity.workflows.math_workflow import single_turn_experience

TRAIN_MODES = ("Ra+Rs", "Ra", "Rs")
FUSION_MODES = ("default", "sum")
STOP = "<stop />"
_TAG = re.compile(r"<(\w+)>(.*?)</\1>")


def parse_tags(text: str) -> dict[str, str]:
    """`<tag>value</tag>` pairs of one line each (a later tag of the same name wins)."""
    return dict(_TAG.findall(text))


def _float(value: str | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def dialogue(messages: list[dict[str, Any]]) -> str:
    """The conversation as `patient: ...` / `doctor: ...` lines (other roles left out)."""
    who = {"user": "patient", "assistant": "doctor"}
    return "".join(f"{who[m['role']]}: {m['content']}\n" for m in messages if m["role"] in who)


class Learn2AskWorkflow(Workflow):
    def __init__(
        self, train_mode: str = "Ra+Rs", fusion_mode: str = "default", judge: int | str = 0
    ) -> None:
        """`train_mode`: Ra+Rs, Ra or Rs; `fusion_mode`: default (multiplicative) or sum;
        `judge` (ours): the grader's auxiliary model, by position or name."""
        if train_mode not in TRAIN_MODES:
            raise ValueError(
                f"Learn2AskWorkflow: train_mode {train_mode!r}; valid: {', '.join(TRAIN_MODES)}"
            )
        if fusion_mode not in FUSION_MODES:
            raise ValueError(
                f"Learn2AskWorkflow: fusion_mode {fusion_mode!r}; valid: {', '.join(FUSION_MODES)}"
            )
        super().__init__(train_mode=train_mode, fusion_mode=fusion_mode, judge=judge)
        self.train_mode, self.fusion_mode, self.judge_key = train_mode, fusion_mode, judge

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        return built_arg_problems(cls, args)

    @classmethod
    def auxiliary_keys(cls, args: dict[str, Any]) -> list[tuple[str, Any]]:
        return [("judge", args.get("judge", 0))]

    def conversation(self, task: Any) -> list[dict[str, Any]]:
        """The row's conversation (without a system prompt of the taskset's)."""
        return [m for m in task.to_messages() if m["role"] != "system"]

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. the doctor's replies; 2. each scored (grader calls sent together); 3. experiences."""
        # 1.
        system = ROLLOUT_PROMPT_RA if self.train_mode == "Ra" else ROLLOUT_PROMPT
        history = self.conversation(task)
        samples = await model.chat([{"role": "system", "content": system}, *history])
        replies = [model.decode(s.response_ids) for s in samples]
        # 2.
        decision = str(task.raw.get("decision_truth", "continue"))
        info = str(task.raw.get("info_truth", "None"))
        scores = await asyncio.gather(
            *(self.score(model, history, r, decision, info) for r in replies)
        )
        # 3.
        return [
            single_turn_experience(task, run, s, text, self.fuse(sc), sc)
            for run, (s, text, sc) in enumerate(zip(samples, replies, scores, strict=True))
        ]

    async def score(
        self,
        model: ModelHandle,
        history: list[dict[str, Any]],
        reply: str,
        decision: str,
        info: str,
    ) -> dict[str, float]:
        """{action_score, content_score, format_score} of one reply (module doc)."""
        said = "stop" if STOP in reply else "continue"
        if said != decision:
            return {"action_score": 0.0, "content_score": 0.0, "format_score": 0.0}
        if decision != "continue":
            return {"action_score": 1.0, "content_score": 1.0, "format_score": float(reply == STOP)}
        grader = model.auxiliary(self.judge_key)
        messages = [
            {"role": "system", "content": GRADER_PROMPT.format(info)},
            {
                "role": "user",
                "content": dialogue([*history, {"role": "assistant", "content": reply}]),
            },
        ]
        (sample,) = await grader.chat(messages, n=1)
        tags = parse_tags(grader.decode(sample.response_ids))
        return {
            "action_score": 1.0,
            "content_score": _float(tags.get("content_score")),
            "format_score": _float(tags.get("format_score")),
        }

    def fuse(self, s: dict[str, float]) -> float:
        action, content, fmt = s["action_score"], s["content_score"], s["format_score"]
        if self.train_mode == "Ra":
            return 2 * content + fmt
        if self.train_mode == "Rs":
            return 3 * action + fmt
        if self.fusion_mode == "sum":
            return action + content + fmt
        return action * (1 + 2 * content) + fmt
