"""Single-turn workflows rewarded by an LLM judge (an auxiliary model) instead of a reward fn.

    explorer:
      auxiliary_models: [{name: judge, model_path: Qwen/Qwen2.5-7B-Instruct}]
    buffer:
      explorer_input:
        default_workflow_type: group_judge_workflow        # or judge_workflow
        taskset:
          workflow_args: {judge: judge, min_agreement: 0.75, on_parse_failure: exclude}

Per task, `repeat_times` answers are sampled from the policy (one chat call), then judged:

- `judge_workflow`: each answer on its own (`judges.PointwiseJudge`, default prompt: a score
  from 0 to 10 ending "Score: N"); reward = the score scaled to [0, 1].
- `group_judge_workflow`: the whole group at once, RULER-style (`judges.GroupJudge`, default
  prompt: a list of scores in [0, 1]), twice: shuffled, then reversed. Reward = the mean of the
  two scorings. Metrics: `judge_agreement` (pairwise order agreement of the two scorings, for
  groups the judge scored), `judge_inconsistent`. A group whose agreement is below
  `min_agreement` is EXCLUDED from training (`exclude_from_training`: masked, counted by the
  explorer as `rollout/excluded_groups`): its ranking depends on the order the judge read it in,
  so it is noise, not signal.
- Trinity-RFT's names: `math_ruler_workflow` (and `async_math_ruler_workflow`) is the group judge
  with `math_reward` as its gold reward; `rubric_judge_workflow` the pointwise judge with a rubric
  prompt (the row's `rubric`, a rating 1-10 as JSON `{"rating": N}`).

A judge reply without a verdict in the asked form is a parse failure (metric `judge_parsed` = 0),
as is a judge prompt over the judge's `max_prompt_tokens`; `on_parse_failure` decides:
- `exclude` (default): not trained on. Pointwise: the sample is excluded and given the mean
  score of its group's judged samples (so it does not move the group's baseline; its std
  shrinks slightly), or `failure_score` when none was judged. Group: the group is excluded
  (rewards `failure_score`).
- `score`: the sample (pointwise) or every sample of the group gets `failure_score` and is
  trained on (Trinity-RFT's behaviour, with 0).
- `fail`: the task fails (`JudgeError`): the explorer tries it again (`explorer.max_retry_times`)
  and then drops and replaces it, counted in `rollout/failed_tasks`.

The gold reward: when the taskset names a reward fn (or the workflow has a default, as
`math_ruler_workflow`), its components (e.g. `accuracy`) are computed against the reference
answer and kept as metrics only, with their sum as `gold_reward`; evaluation reports that
`accuracy`. Judge calls are not recorded: only the policy's answers are experiences.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
from typing import Any, ClassVar

from trinity.common.experience import Experience
from trinity.judges.consistency import shuffled_order
from trinity.judges.judge import (
    RUBRIC_PROMPT,
    RUBRIC_SYSTEM,
    GroupJudge,
    JudgeError,
    PointwiseJudge,
    format_rubric,
    sampling_problems,
    template_fields,
    template_problems,
)
from trinity.rewards.guard import score_responses
from trinity.workflows.base import (
    WORKFLOW,
    ModelHandle,
    Workflow,
    built_arg_problems,
    exclude_from_training,
)
from trinity.workflows.math_workflow import single_turn_experience

POLICIES = ("exclude", "score", "fail")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


class _JudgeWorkflow(Workflow):
    """What both judge workflows share: the arguments, the policy's samples, the gold reward."""

    default_reward_fn_type: ClassVar[str | None] = None  # gold reward (metrics only)
    required_field: ClassVar[str] = "response"
    takes_reply_prefix: ClassVar[bool] = True  # the policy samples `task.prompt_messages()`

    def __init__(
        self,
        judge: int | str = 0,
        prompt: str | None = None,
        system_prompt: str | None = None,
        score_range: list[float] | None = None,
        judge_sampling: dict[str, Any] | None = None,
        on_parse_failure: str = "exclude",
        failure_score: float = 0.0,
    ) -> None:
        super().__init__(judge=judge, on_parse_failure=on_parse_failure)
        problems = []
        if isinstance(judge, bool) or not isinstance(judge, int | str):
            problems.append(
                f"judge: an auxiliary model's position (int) or name (str), got {judge!r}"
            )
        if on_parse_failure not in POLICIES:
            problems.append(f"on_parse_failure: {on_parse_failure!r}; valid: {', '.join(POLICIES)}")
        base = self._judge_class()
        bounds = score_range if score_range is not None else base.score_range
        if not (
            isinstance(bounds, list | tuple)
            and len(bounds) == 2
            and all(_is_number(x) for x in bounds)
            and bounds[0] < bounds[1]
        ):
            problems.append(f"score_range: [low, high] with low < high, got {score_range!r}")
            bounds = base.score_range
        if not _is_number(failure_score):
            problems.append(f"failure_score: a number, got {failure_score!r}")
        template = prompt if prompt is not None else base.prompt
        problems += template_problems(template, self.required_field, "prompt")
        if not isinstance(system_prompt, str | None):
            problems.append(f"system_prompt: a text, got {system_prompt!r}")
        if not isinstance(judge_sampling, dict | None):
            problems.append(f"judge_sampling: a mapping, got {judge_sampling!r}")
            judge_sampling = None
        sampling = {"temperature": 0.0, **(judge_sampling or {})}
        problems += sampling_problems(sampling)
        if problems:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(problems))
        self.judge_key = judge
        self.on_parse_failure = on_parse_failure
        self.failure_score = float(failure_score)
        self.needs_truth = "truth" in template_fields(template)
        self.judge = self._make(
            prompt=template,
            system_prompt=system_prompt if system_prompt is not None else base.system_prompt,
            score_range=(float(bounds[0]), float(bounds[1])),
            sampling=sampling,
        )

    def _judge_class(self) -> Any:
        raise NotImplementedError

    def _make(self, **kwargs: Any) -> Any:
        return self._judge_class()(**kwargs)

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        """What is wrong with `workflow_args` (pre-flight): building the workflow checks them."""
        return built_arg_problems(cls, args)

    @classmethod
    def auxiliary_keys(cls, args: dict[str, Any]) -> list[tuple[str, Any]]:
        """The auxiliary models the arguments name (pre-flight checks they are served)."""
        return [("judge", args.get("judge", 0))]

    def fields(self, task: Any) -> dict[str, Any]:
        """The template fields of `task` (judges.TEMPLATE_FIELDS)."""
        if self.needs_truth and task.truth is None:
            raise ValueError(
                f"the judge prompt shows {{truth}}, but task {task.index} of "
                f"{task.taskset_name!r} has no reference answer (format.response_key)"
            )
        messages = task.to_messages()
        question = task.prompt
        if question is None:
            question = next(
                (m.get("content") for m in reversed(messages) if m.get("role") == "user"), ""
            )
        return {
            "question": question,
            "truth": task.truth,
            "rubric": format_rubric(task.raw.get("rubric")),
            "row": task.raw,
        }

    async def gold(self, task: Any, responses: list[str]) -> list[dict[str, float]]:
        """The gold reward fn's components per response (bounded: rewards/guard.py); [] without
        one."""
        name = task.reward_fn_type or self.default_reward_fn_type
        if name is None:
            return [{} for _ in responses]
        return await score_responses(task, name, responses)

    def _experiences(
        self,
        task: Any,
        samples: list[Any],
        responses: list[str],
        rewards: list[float],
        metrics: list[dict[str, float]],
        gold: list[dict[str, float]],
    ) -> list[Experience]:
        out = []
        for run, (s, text, reward, m, g) in enumerate(
            zip(samples, responses, rewards, metrics, gold, strict=True)
        ):
            extra = {k: float(v) for k, v in g.items()}
            if g:
                extra["gold_reward"] = float(sum(g.values()))
            out.append(single_turn_experience(task, run, s, text, reward, {**m, **extra}))
        return out


@WORKFLOW.register("judge_workflow")
class JudgeWorkflow(_JudgeWorkflow):
    """Each answer judged on its own (module doc)."""

    def _judge_class(self) -> Any:
        return PointwiseJudge

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. sample the answers; 2. judge each (calls sent together) and score the gold reward
        meanwhile; 3. apply the parse-failure policy; 4. build the experiences."""
        # 1.
        fields = self.fields(task)
        judge = model.auxiliary(self.judge_key)
        samples = await model.chat(task.prompt_messages())
        responses = [model.decode(s.response_ids) for s in samples]
        # 2.
        verdicts, gold = await asyncio.gather(
            asyncio.gather(
                *(self.judge.score(judge, {**fields, "response": r}) for r in responses)
            ),
            self.gold(task, responses),
        )
        # 3.
        judged = [v.score for v in verdicts if v.score is not None]
        failed = [i for i, v in enumerate(verdicts) if v.score is None]
        if failed and self.on_parse_failure == "fail":
            raise JudgeError(
                f"the judge's reply to response {failed[0]} of task {task.index} holds no "
                f"score: {verdicts[failed[0]].error}; reply: {verdicts[failed[0]].text[-300:]!r}"
            )
        stand_in = self.failure_score
        if self.on_parse_failure == "exclude" and judged:
            stand_in = statistics.fmean(judged)
        rewards = [v.score if v.score is not None else stand_in for v in verdicts]
        metrics = [
            {"judge_score": r, "judge_parsed": float(v.score is not None)}
            for r, v in zip(rewards, verdicts, strict=True)
        ]
        # 4.
        exps = self._experiences(task, samples, responses, rewards, metrics, gold)
        for i in failed:
            exps[i].info["judge_error"] = verdicts[i].error
        if self.on_parse_failure == "exclude":
            exclude_from_training([exps[i] for i in failed], "judge_parse_failure")
        return exps


@WORKFLOW.register("group_judge_workflow")
class GroupJudgeWorkflow(_JudgeWorkflow):
    """The group judged at once, twice, and excluded when the judge contradicts itself."""

    required_field: ClassVar[str] = "responses"

    def __init__(self, min_agreement: float = 0.75, **kwargs: Any) -> None:
        if not _is_number(min_agreement) or not 0 <= min_agreement <= 1:
            raise ValueError(f"min_agreement: a number in [0, 1], got {min_agreement!r}")
        self.min_agreement = float(min_agreement)
        super().__init__(**kwargs)

    def _judge_class(self) -> Any:
        return GroupJudge

    def _make(self, **kwargs: Any) -> Any:
        return GroupJudge(min_agreement=self.min_agreement, **kwargs)

    @staticmethod
    def order_for(task: Any, responses: list[str]) -> list[int]:
        """The first order shown to the judge: a shuffle seeded by the task and the responses
        (reproducible, different for every group)."""
        digest = hashlib.sha256(repr((task.taskset_name, task.index, responses)).encode())
        return shuffled_order(len(responses), int.from_bytes(digest.digest()[:8], "little"))

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. sample the group; 2. judge it in two orders and score the gold reward meanwhile;
        3. rewards, metrics and the exclusion of groups the judge contradicts itself on."""
        # 1.
        fields = self.fields(task)
        judge = model.auxiliary(self.judge_key)
        samples = await model.chat(task.prompt_messages())
        responses = [model.decode(s.response_ids) for s in samples]
        # 2.
        order = self.order_for(task, responses)
        verdict, gold = await asyncio.gather(
            self.judge.score(judge, fields, responses, order), self.gold(task, responses)
        )
        # 3.
        n = len(responses)
        if verdict.error is not None and self.on_parse_failure == "fail":
            raise JudgeError(
                f"the judge's replies for task {task.index} hold no scores: {verdict.error}"
            )
        parsed = verdict.scores is not None
        rewards = verdict.scores if verdict.scores is not None else [self.failure_score] * n
        group: dict[str, float] = {"judge_parsed": float(parsed)}
        if parsed:  # only groups the judge scored have an agreement to report
            group["judge_agreement"] = float(verdict.agreement or 0.0)
            group["judge_inconsistent"] = float(not verdict.consistent)
        metrics = [{"judge_score": r, **group} for r in rewards]
        exps = self._experiences(task, samples, responses, rewards, metrics, gold)
        for e in exps:
            e.info["judge_orders"] = [list(o) for o in verdict.orders]
            if verdict.error is not None:
                e.info["judge_error"] = verdict.error
        if parsed and not verdict.consistent:
            exclude_from_training(exps, "judge_inconsistent")
        elif not parsed and self.on_parse_failure == "exclude":
            exclude_from_training(exps, "judge_parse_failure")
        return exps


@WORKFLOW.register("math_ruler_workflow")
class MathRULERWorkflow(GroupJudgeWorkflow):
    """Trinity-RFT's RULER workflow: the group judge, `math_reward` as the gold reward."""

    default_reward_fn_type: ClassVar[str | None] = "math_reward"


WORKFLOW.register("async_math_ruler_workflow")(MathRULERWorkflow)


@WORKFLOW.register("rubric_judge_workflow")
class RubricJudgeWorkflow(JudgeWorkflow):
    """Trinity-RFT's rubric judge: the pointwise judge with the row's `rubric`, rated 1-10."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("prompt", RUBRIC_PROMPT)
        kwargs.setdefault("system_prompt", RUBRIC_SYSTEM)
        kwargs.setdefault("score_range", [1, 10])
        super().__init__(**kwargs)
