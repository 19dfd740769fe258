"""`math_trainable_ruler_workflow` (Trinity-RFT's name): the policy judges its own answers.

The policy is its own RULER judge, and learns to judge.

    buffer.explorer_input.default_workflow_type: math_trainable_ruler_workflow
    buffer.explorer_input.taskset.workflow_args: {gold_probability: 0.2}   # ours; Trinity's 0.2

Per task: 1. the policy samples `repeat_times` answers; each gets its gold reward (the taskset's
reward fn, default `math_reward`; components and `gold_reward` as metrics). 2. A draw decides
whether the ground truth is "available" (probability `gold_probability`):
- available: the answers are rewarded with their gold reward, and the policy judges the group
  `repeat_times` times (one chat call, n samples): each judgement is an experience too, in a
  group of its own (`info.subgroup: ruler`), rewarded `1 - mean |score_i - gold_i'|` where
  `gold_i' = (gold_i + 0.1) / 1.2` (the gold reward mapped from [-0.1, 1.1] to [0, 1]), or 0.0
  when its score list cannot be read or has the wrong length;
- not available: the policy judges the group once; each answer's reward is its mean score over
  the judgements that parsed (0.0 when none did); only the answers are returned.
A judgement's scores are the last `[...]` of its reply, read as a Python list, each clipped to
[0, 1]. Metrics: `judge_success` (the fraction of judgements that parsed) on every experience,
`reward_for_judge` on the judgements.

Departs from Trinity-RFT: the draw is seeded by the task and its answers (reproducible) instead
of numpy's global generator, and its probability is an argument. When a task has no system
prompt and is scored by `math_reward`, Trinity-RFT's `<think>`/`<answer>` system prompt is added,
as Trinity-RFT's math workflow does.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import random
from typing import Any

from trinity.common.experience import Experience
from trinity.rewards import REWARD_FN
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow, built_arg_problems
from trinity.workflows.math_workflow import single_turn_experience

MATH_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e.,\n"
    "<think> reasoning process here </think>\n<answer> answer here </answer>.\n"
)
FORMAT_NOTE = (
    "Solution format requirement: first think about the reasoning process in the mind and then "
    "provides the final answer. The reasoning process and answer are enclosed within <think> "
    "</think> and <answer> </answer> tags, respectively, i.e.,\n"
    "<think> reasoning process here </think>\n<answer> answer here </answer>."
)


def ruler_messages(question: str, responses: list[str]) -> list[dict[str, str]]:
    """The judge's chat: a system prompt and the question with every candidate, numbered."""
    n = len(responses)
    system = (
        f"You are a fair judge. The user will provide a question and {n} candidate solutions "
        "to it. Your task is to compare the solutions, see how well they resolve the question, "
        "and assign a score within the range [0, 1] for each solution."
    )
    solutions = "\n\n".join(f"Candidate solution {i + 1}: {r}" for i, r in enumerate(responses))
    user = (
        "\nBelow is a question and several candidate solutions.\n"
        f"Question: {question}\n\n{FORMAT_NOTE}\n{solutions}\n"
        "Please assign a score within the range [0, 1] for each of them, reflecting how well "
        "they solve the question.\nYou may compare them against each other and think step by "
        "step before returning your final scores, but keep your reasoning process brief and "
        "concise when possible.\nConclude your response with a list of scores, in the following "
        f"format: [score for solution 1, score for solution 2, ..., score for solution {n}]\n"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_scores(text: str, n: int) -> list[float] | None:
    """The last `[...]` of `text` as `n` scores clipped to [0, 1]; None if it is not that."""
    start, end = text.rfind("["), text.rfind("]")
    if start == -1 or end == -1 or start > end:
        return None
    try:
        values = ast.literal_eval(text[start : end + 1])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(values, list | tuple) or len(values) != n:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    return [max(0.0, min(1.0, float(v))) for v in values]


@WORKFLOW.register("math_trainable_ruler_workflow")
class MathTrainableRULERWorkflow(Workflow):
    default_reward_fn_type = "math_reward"  # the gold reward

    def __init__(self, gold_probability: float = 0.2) -> None:
        """`gold_probability`: how often the ground truth is taken as available (module doc)."""
        ok = isinstance(gold_probability, int | float) and not isinstance(gold_probability, bool)
        if not ok or not 0 <= gold_probability <= 1:
            raise ValueError(
                f"math_trainable_ruler_workflow: gold_probability must be a number in [0, 1], "
                f"got {gold_probability!r}"
            )
        super().__init__(gold_probability=gold_probability)
        self.gold_probability = float(gold_probability)

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        return built_arg_problems(cls, args)

    def messages(self, task: Any, reward_name: str) -> list[dict[str, Any]]:
        messages = task.to_messages()
        if reward_name == "math_reward" and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": MATH_SYSTEM_PROMPT})
        return messages

    def gold_available(self, task: Any, responses: list[str]) -> bool:
        """The draw, seeded by the task and its answers."""
        digest = hashlib.sha256(repr((task.taskset_name, task.index, responses)).encode())
        rng = random.Random(int.from_bytes(digest.digest()[:8], "little"))
        return rng.random() < self.gold_probability

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. sample and score the answers; 2. draw; 3. the policy judges; 4. rewards."""
        # 1.
        reward_name = task.reward_fn_type or self.default_reward_fn_type
        fn = REWARD_FN.get(reward_name)
        samples = await model.chat(self.messages(task, reward_name))
        responses = [model.decode(s.response_ids) for s in samples]
        gold = await asyncio.to_thread(
            lambda: [fn(r, task.truth, task.raw, **task.reward_fn_args) for r in responses]
        )
        gold_rewards = [float(sum(g.values())) for g in gold]
        scaled = [(g + 0.1) / 1.2 for g in gold_rewards]  # [-0.1, 1.1] -> [0, 1]
        # 2., 3.
        available = self.gold_available(task, responses)
        n = len(responses)
        question = task.prompt if task.prompt is not None else task.to_messages()[-1]["content"]
        judged = await model.chat(
            ruler_messages(question, responses), **({} if available else {"n": 1})
        )
        texts = [model.decode(s.response_ids) for s in judged]
        scores = [parse_scores(t, n) for t in texts]
        parsed = [s for s in scores if s is not None]
        success = len(parsed) / len(texts) if texts else 0.0
        # 4.
        if available:
            rewards = gold_rewards
        elif parsed:
            rewards = [sum(s[i] for s in parsed) / len(parsed) for i in range(n)]
        else:
            rewards = [0.0] * n
        exps = []
        for run, (s, text, r, g, gr) in enumerate(
            zip(samples, responses, rewards, gold, gold_rewards, strict=True)
        ):
            metrics = {k: float(v) for k, v in g.items()}
            metrics |= {"gold_reward": gr, "judge_success": success}
            exps.append(single_turn_experience(task, run, s, text, r, metrics))
        if not available:
            return exps
        for run, (s, text, sc) in enumerate(zip(judged, texts, scores, strict=True)):
            r = (
                0.0
                if sc is None
                else 1.0 - sum(abs(a - b) for a, b in zip(sc, scaled, strict=True)) / n
            )
            e = single_turn_experience(
                task, run, s, text, r, {"judge_success": success, "reward_for_judge": r}
            )
            e.info["subgroup"] = "ruler"
            exps.append(e)
        return exps
