"""Multi-turn math with feedback: answer; when wrong, told so, and try again (up to `max_turns`).

    buffer.explorer_input.default_workflow_type: math_self_correction_workflow
    buffer.explorer_input.default_reward_fn_type: arithmetic_reward
    buffer.explorer_input.taskset.workflow_args: {max_turns: 2}

Each task runs `repeat_times` episodes: the first turn is one `chat` call with n samples, each
sample then continued by its own calls, which the handle bridges (the sampled tokens + the
feedback turn's delta, `explorer/bridging.py`). Every episode becomes one MULTI_TURN experience
(`extract_experiences`): all its answers trained (mask 1), the feedback turns masked out. The
reward is the reward fn's score of the episode's last answer; `turns` (answers given) and the
first answer's accuracy are kept as metrics (`first_accuracy`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from trinity.common.experience import Experience
from trinity.rewards.guard import score_responses
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow

DEFAULT_FEEDBACK = "That is not right. Try again."


@WORKFLOW.register("math_self_correction_workflow")
class SelfCorrectionWorkflow(Workflow):
    default_reward_fn_type = "math_reward"

    def __init__(self, max_turns: int = 2, feedback: str = DEFAULT_FEEDBACK) -> None:
        """`max_turns`: answers per episode at most (1 = single-turn math as a MULTI_TURN row);
        `feedback`: the user's reply to a wrong answer."""
        if max_turns < 1:
            raise ValueError(
                f"math_self_correction_workflow: max_turns must be >= 1, got {max_turns}"
            )
        super().__init__(max_turns=max_turns, feedback=feedback)
        self.max_turns = max_turns
        self.feedback = feedback

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. first answers: one call, n samples (the task's repeat_times)
        2. per turn: score every open episode (off the event loop), then continue the wrong ones,
           concurrently, in sample order (their sampling keys follow the call order)
        3. one MULTI_TURN experience per episode, rewarded by its last answer's score
        """
        reward_name = task.reward_fn_type or self.default_reward_fn_type

        async def score(texts: list[str]) -> list[dict[str, float]]:
            return await score_responses(task, reward_name, texts)  # bounded (rewards/guard.py)

        # 1.
        first = task.to_messages()
        samples = await model.chat(first)
        episodes = [
            {"messages": [*first, self._reply(model, s)], "last": s, "turns": 1} for s in samples
        ]
        scores = await score([model.decode(s.response_ids) for s in samples])
        first_accuracy = [float(sc.get("accuracy", 0.0)) for sc in scores]
        # 2.
        for _ in range(1, self.max_turns):
            wrong = [i for i, sc in enumerate(scores) if sc.get("accuracy", 0.0) < 1.0]
            if not wrong:
                break
            for i in wrong:
                episodes[i]["messages"].append({"role": "user", "content": self.feedback})
            answers = await asyncio.gather(
                *(model.chat(episodes[i]["messages"], n=1) for i in wrong)
            )
            for i, (s,) in zip(wrong, answers, strict=True):
                episodes[i]["messages"].append(self._reply(model, s))
                episodes[i]["last"] = s
                episodes[i]["turns"] += 1
            rescored = await score([model.decode(episodes[i]["last"].response_ids) for i in wrong])
            for i, sc in zip(wrong, rescored, strict=True):
                scores[i] = sc
        # 3.
        out: list[Experience] = []
        by_episode = {model.episode_of(s): j for j, s in enumerate(samples)}
        rewards = {ep: float(sum(scores[j].values())) for ep, j in by_episode.items()}
        for e in model.extract_experiences(reward=rewards):
            j = by_episode[e.eid.run]
            e.metrics = {
                **{k: float(v) for k, v in scores[j].items()},
                "turns": float(episodes[j]["turns"]),
                "first_accuracy": first_accuracy[j],
            }
            e.response_text = model.decode(episodes[j]["last"].response_ids)
            e.info.update({"task_index": task.index, "truth": task.truth})
            out.append(e)
        return out

    @staticmethod
    def _reply(model: ModelHandle, sample: Any) -> dict[str, str]:
        return {"role": "assistant", "content": model.decode(sample.response_ids)}
