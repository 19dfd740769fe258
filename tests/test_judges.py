"""LLM judges: score parsing on hand-written judge replies, the group judge's self-consistency
and exclusion against deterministic fake judges (expected values derived by hand), the judge
workflows' failure policies, and their pre-flight argument checks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_engine import FakeEngine, FakeJudgeEngine

from trinity.common.rollout import SamplingParams
from trinity.explorer.auxiliary import AuxiliaryModel, AuxiliaryModels
from trinity.explorer.model_client import TaskModelHandle
from trinity.judges import (
    GroupJudge,
    JudgeError,
    in_response_order,
    pairwise_agreement,
    parse_score,
    parse_scores,
)
from trinity.models import load_tokenizer
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW
from trinity.workflows.judge_workflow import GroupJudgeWorkflow, JudgeWorkflow

# --- parsing hand-written judge replies ----------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is right and clear.\nScore: 8", 8.0),
        ("**Score**: 7/10", 7.0),
        ("rating = 6.5", 6.5),
        ('```json\n{"rating": 7}\n```', 7.0),
        ('Thinking... {"note": "draft"} then {"score": 3}', 3.0),
        ("Score: 3. On reflection, the second step is wrong.\nScore: 2", 2.0),  # the last one
        ('{"score": 9} -- ignore the line Score: 1', 9.0),  # a JSON verdict comes first
        ("Score: 0", 0.0),
    ],
)
def test_a_score_is_read_from_json_or_the_last_score_line(reply, expected) -> None:
    parsed = parse_score(reply, 0, 10)
    assert parsed.ok and parsed.value == expected


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("A fine answer, I would give it full marks.", "no score found"),
        ("Score: 11", "score 11 outside [0, 10]"),
        ("Score: -1", "score -1 outside [0, 10]"),
        ('{"rating": "high"}', "is not a number"),
        ('{"score": true}', "is not a number"),
        ("", "no score found"),
    ],
)
def test_a_reply_without_a_valid_score_is_a_failure_not_a_guess(reply, why) -> None:
    parsed = parse_score(reply, 0, 10)
    assert not parsed.ok and parsed.value is None and why in parsed.error


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Solution 2 is best.\n[0.2, 0.9, 0.5]", [0.2, 0.9, 0.5]),
        ("First guess [1, 1, 1]; final: [0, 0.5, 1]", [0.0, 0.5, 1.0]),  # the last list
        ("[.5, 1., 0]", [0.5, 1.0, 0.0]),  # a Python literal, not JSON
        ("Scores: [1,0,1] (see [notes])", [1.0, 0.0, 1.0]),  # "[notes]" is not a list
    ],
)
def test_group_scores_are_the_last_list(reply, expected) -> None:
    parsed = parse_scores(reply, 3, 0, 1)
    assert parsed.ok and parsed.value == expected


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("[0.1, 0.2]", "2 scores for 3 responses"),
        ("[0.1, 0.2, 0.3, 0.4]", "4 scores for 3 responses"),
        ("[0.1, 'good', 0.3]", "not all scores are numbers"),
        ("[0.1, 1.5, 0.3]", "score 1.5 outside [0, 1]"),
        ("All three are equally good.", "no list of scores found"),
        ("[0.1, 0.2, __import__('os')]", "no list of scores found"),  # never evaluated
    ],
)
def test_group_scores_that_do_not_fit_are_a_failure(reply, why) -> None:
    parsed = parse_scores(reply, 3, 0, 1)
    assert not parsed.ok and why in parsed.error


# --- consistency ------------------------------------------------------------------------------


def test_pairwise_agreement_by_hand() -> None:
    assert pairwise_agreement([0.1, 0.5, 0.9], [0.2, 0.6, 1.0]) == 1.0  # same ranking
    assert pairwise_agreement([0.1, 0.5, 0.9], [0.9, 0.5, 0.1]) == 0.0  # every pair reversed
    # 6 pairs, only (0, 1) swapped
    assert pairwise_agreement([1, 2, 3, 4], [2, 1, 3, 4]) == pytest.approx(5 / 6)
    # ties agree only with ties: (0,1) tie vs <, (0,2) < vs <, (1,2) < vs tie
    assert pairwise_agreement([1, 1, 2], [1, 2, 2]) == pytest.approx(1 / 3)
    assert pairwise_agreement([0.3], [0.9]) == 1.0  # no pair to disagree on
    with pytest.raises(ValueError):
        pairwise_agreement([1, 2], [1])


def test_scores_go_back_to_response_order() -> None:
    # shown in order [2, 0, 1]: position 0 holds response 2, and so on
    assert in_response_order([0.9, 0.1, 0.5], [2, 0, 1]) == [0.1, 0.5, 0.9]


# --- the group judge against fake judges ----------------------------------------------------------

RESPONSES = ["a", "bb", "ccc", "dddd"]
CONTENT = {"a": 0.1, "bb": 0.3, "ccc": 0.5, "dddd": 0.6}  # what a content judge thinks of each


def content_judge(shown: list[str]) -> str:
    """Scores what it reads, wherever it reads it."""
    return "Looking at each solution.\n" + str([CONTENT[t] for t in shown])


def position_judge(shown: list[str]) -> str:
    """Scores by position only: the first shown best."""
    return str([1.0, 0.75, 0.5, 0.25][: len(shown)])


def leaning_judge(shown: list[str]) -> str:
    """Content plus a bonus for being shown early (0.3, 0.2, 0.1, 0)."""
    return str([round(CONTENT[t] + 0.1 * (3 - p), 2) for p, t in enumerate(shown)])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def judge_handle(tokenizer, reply, name="judge", max_prompt_tokens=None):
    engine = FakeJudgeEngine(tokenizer, reply)
    model = AuxiliaryModel(
        index=0,
        name=name,
        model_path="judge-model",
        client=engine,
        tokenizer=tokenizer,
        defaults=SamplingParams(n=1, max_tokens=64),
        template_kwargs={},
        max_prompt_tokens=max_prompt_tokens,
        seed=0,
    )
    models = AuxiliaryModels([model], [model])
    return models, engine


def score_group(tokenizer, reply, order, min_agreement=0.75):
    models, engine = judge_handle(tokenizer, reply)
    judge = models.handles(7, None)[0]
    group = GroupJudge(min_agreement=min_agreement)
    fields = {"question": "Say something.", "truth": None, "rubric": "", "row": {}}
    verdict = asyncio.run(group.score(judge, fields, RESPONSES, order))
    return verdict, engine


def test_a_content_judge_agrees_with_itself(tokenizer) -> None:
    verdict, engine = score_group(tokenizer, content_judge, [2, 0, 3, 1])
    # it was shown [2, 0, 3, 1], then the reverse
    assert [shown for shown, _ in engine.calls] == [
        ["ccc", "a", "dddd", "bb"],
        ["bb", "dddd", "a", "ccc"],
    ]
    assert verdict.first == pytest.approx([0.1, 0.3, 0.5, 0.6])
    assert verdict.second == pytest.approx([0.1, 0.3, 0.5, 0.6])
    assert verdict.scores == pytest.approx([0.1, 0.3, 0.5, 0.6])
    assert verdict.agreement == 1.0 and verdict.consistent and verdict.error is None


def test_a_position_judge_contradicts_itself_completely(tokenizer) -> None:
    verdict, _ = score_group(tokenizer, position_judge, [2, 0, 3, 1])
    # first order: response 2 at position 0 (1.0), 0 at 1 (0.75), 3 at 2 (0.5), 1 at 3 (0.25)
    assert verdict.first == [0.75, 0.25, 1.0, 0.5]
    # reversed [1, 3, 0, 2]: 1 -> 1.0, 3 -> 0.75, 0 -> 0.5, 2 -> 0.25
    assert verdict.second == [0.5, 1.0, 0.25, 0.75]
    assert verdict.agreement == 0.0 and not verdict.consistent
    assert verdict.scores == [0.625] * 4  # its averaged scores say nothing either


def test_a_leaning_judge_is_excluded_below_the_threshold_only(tokenizer) -> None:
    # first [2, 0, 3, 1]: ccc 0.5+0.3, a 0.1+0.2, dddd 0.6+0.1, bb 0.3+0
    # second [1, 3, 0, 2]: bb 0.3+0.3, dddd 0.6+0.2, a 0.1+0.1, ccc 0.5+0
    # pairs: (a,bb) tie vs < no; (a,ccc) yes; (a,dddd) yes; (bb,ccc) < vs > no; (bb,dddd) yes;
    # (ccc,dddd) > vs < no: 3 of 6
    verdict, _ = score_group(tokenizer, leaning_judge, [2, 0, 3, 1])
    assert verdict.first == pytest.approx([0.3, 0.3, 0.8, 0.7])
    assert verdict.second == pytest.approx([0.2, 0.6, 0.5, 0.8])
    assert verdict.agreement == pytest.approx(0.5) and not verdict.consistent
    assert verdict.scores == pytest.approx([0.25, 0.45, 0.65, 0.75])
    lenient, _ = score_group(tokenizer, leaning_judge, [2, 0, 3, 1], min_agreement=0.5)
    assert lenient.consistent


def test_a_prompt_over_the_judge_s_limit_is_a_failed_verdict_not_a_crash(tokenizer) -> None:
    models, engine = judge_handle(tokenizer, content_judge, max_prompt_tokens=8)
    judge = models.handles(7, None)[0]
    fields = {"question": "Say something.", "truth": None, "rubric": "", "row": {}}
    verdict = asyncio.run(GroupJudge().score(judge, fields, RESPONSES, [0, 1, 2, 3]))
    assert verdict.scores is None and "prompt is too long" in verdict.error
    assert engine.calls == []  # refused before sampling


def test_a_reply_without_scores_is_a_failed_group_verdict(tokenizer) -> None:
    verdict, _ = score_group(tokenizer, lambda shown: "They are all fine.", [0, 1, 2, 3])
    assert verdict.scores is None and verdict.agreement is None and not verdict.consistent
    assert "first order: no list of scores" in verdict.error
    assert "second order: no list of scores" in verdict.error


# --- the workflows ----------------------------------------------------------------------------


def task(**kw):
    return Task(index=3, raw={"question": "Say something."}, prompt="Say something.", **kw)


def run_workflow(tokenizer, workflow, reply, texts=RESPONSES):
    policy = FakeEngine(tokenizer, seed=0)
    policy.plan = [(t, "stop") for t in texts]
    models, judge = judge_handle(tokenizer, reply)
    handle = TaskModelHandle(
        policy,
        tokenizer,
        SamplingParams(n=len(texts), max_tokens=16),
        key=11,
        auxiliary=(models, models.handles(11, None)),
    )
    exps = asyncio.run(workflow.run(task(truth="ccc", reward_fn_type="exact_match"), handle))
    return exps, judge, handle


def test_group_judge_workflow_trains_on_a_consistent_judge(tokenizer) -> None:
    exps, judge, handle = run_workflow(tokenizer, GroupJudgeWorkflow(), content_judge)
    assert [e.reward for e in exps] == pytest.approx([0.1, 0.3, 0.5, 0.6])
    assert all(e.action_mask.sum() == e.response_length for e in exps)  # trained
    assert all("excluded" not in e.info for e in exps)
    assert [e.metrics["judge_agreement"] for e in exps] == [1.0] * 4
    assert [e.metrics["judge_inconsistent"] for e in exps] == [0.0] * 4
    # the gold reward (exact_match against "ccc") is a metric, not the reward
    assert [e.metrics["accuracy"] for e in exps] == [0.0, 0.0, 1.0, 0.0]
    assert [e.metrics["gold_reward"] for e in exps] == [0.0, 0.0, 1.0, 0.0]
    # the judge's two calls are not in what the policy recorded
    assert len(judge.calls) == 2 and handle.ledger_stats().calls == 1
    assert [e.response_text for e in exps] == RESPONSES


def test_group_judge_workflow_excludes_a_self_contradicting_judge(tokenizer) -> None:
    exps, _, _ = run_workflow(tokenizer, GroupJudgeWorkflow(), position_judge)
    assert all(e.info["excluded"] == "judge_inconsistent" for e in exps)
    assert all(int(e.action_mask.sum()) == 0 for e in exps)  # trained on nothing
    assert [e.metrics["judge_agreement"] for e in exps] == [0.0] * 4
    assert [e.metrics["judge_inconsistent"] for e in exps] == [1.0] * 4
    assert [e.reward for e in exps] == [0.625] * 4


@pytest.mark.parametrize("policy", ["exclude", "score", "fail"])
def test_group_judge_parse_failure_policies(tokenizer, policy) -> None:
    workflow = GroupJudgeWorkflow(on_parse_failure=policy, failure_score=-1.0)
    garbled = lambda shown: "I cannot decide."  # noqa: E731
    if policy == "fail":
        with pytest.raises(JudgeError, match="hold no scores"):
            run_workflow(tokenizer, workflow, garbled)
        return
    exps, _, _ = run_workflow(tokenizer, workflow, garbled)
    assert [e.reward for e in exps] == [-1.0] * 4
    assert [e.metrics["judge_parsed"] for e in exps] == [0.0] * 4
    assert all("judge_agreement" not in e.metrics for e in exps)  # nothing to agree on
    assert all("no list of scores" in e.info["judge_error"] for e in exps)
    masked = [int(e.action_mask.sum()) == 0 for e in exps]
    assert masked == [policy == "exclude"] * 4


def pointwise_reply(shown: list[str]) -> str:
    """Scores a response by its length (2 per letter), refuses to score 'dddd'."""
    [text] = shown
    return "No opinion." if text == "dddd" else f"Reasonable.\nScore: {2 * len(text)}"


@pytest.mark.parametrize("policy", ["exclude", "score", "fail"])
def test_pointwise_judge_workflow_and_its_failure_policies(tokenizer, policy) -> None:
    workflow = JudgeWorkflow(judge="judge", on_parse_failure=policy)
    if policy == "fail":
        with pytest.raises(JudgeError, match="response 3"):
            run_workflow(tokenizer, workflow, pointwise_reply)
        return
    exps, judge, _ = run_workflow(tokenizer, workflow, pointwise_reply)
    assert sorted(shown[0] for shown, _ in judge.calls) == RESPONSES  # one call each
    # scores 2, 4, 6 of 10; 'dddd' failed: the mean of the judged (0.4) when excluded, else 0
    stand_in = 0.4 if policy == "exclude" else 0.0
    assert [e.reward for e in exps] == pytest.approx([0.2, 0.4, 0.6, stand_in])
    assert [e.metrics["judge_parsed"] for e in exps] == [1.0, 1.0, 1.0, 0.0]
    assert [int(e.action_mask.sum()) == 0 for e in exps] == [False] * 3 + [policy == "exclude"]
    assert exps[3].info.get("excluded") == ("judge_parse_failure" if policy == "exclude" else None)


def test_upstream_workflow_names_are_registered() -> None:
    assert WORKFLOW.get("math_ruler_workflow").default_reward_fn_type == "math_reward"
    assert WORKFLOW.get("async_math_ruler_workflow") is WORKFLOW.get("math_ruler_workflow")
    assert issubclass(WORKFLOW.get("rubric_judge_workflow"), JudgeWorkflow)
    for name in ("math_ruler_workflow", "rubric_judge_workflow"):
        assert WORKFLOW.get(name).arg_problems({}) == []


def test_rubric_judge_shows_the_rubric_and_reads_a_json_rating(tokenizer) -> None:
    rubric = [{"description": "States the sum", "weight": 2}, {"description": "Is brief"}]
    policy = FakeEngine(tokenizer, seed=0)
    policy.plan = [("3", "stop")]
    models, judge = judge_handle(tokenizer, lambda shown: 'Fine.\n```json\n{"rating": 7}\n```')
    handle = TaskModelHandle(
        policy, tokenizer, SamplingParams(n=1), auxiliary=(models, models.handles(None, None))
    )
    workflow = WORKFLOW.get("rubric_judge_workflow")()
    [exp] = asyncio.run(workflow.run(Task(index=0, raw={"rubric": rubric}, prompt="1+2="), handle))
    assert exp.reward == pytest.approx((7 - 1) / 9)  # 1..10 scaled to [0, 1]
    [prompt] = judge.prompts
    assert "1. (weight 2) States the sum\n2. Is brief" in prompt
    assert "<response>\n3\n</response>" in prompt


@pytest.mark.parametrize(
    ("workflow", "args", "problem"),
    [
        ("group_judge_workflow", {"on_parse_failure": "skip"}, "on_parse_failure: 'skip'"),
        ("group_judge_workflow", {"min_agreement": 1.5}, "min_agreement"),
        ("group_judge_workflow", {"prompt": "Rate {question}"}, "no {responses}"),
        ("judge_workflow", {"prompt": "{question} {response} {answer}"}, "unknown field(s) answer"),
        ("judge_workflow", {"prompt": "{response} {"}, "literal brace"),
        ("judge_workflow", {"score_range": [10, 0]}, "score_range"),
        ("judge_workflow", {"score_range": [5]}, "score_range"),
        ("judge_workflow", {"failure_score": "low"}, "failure_score"),
        ("judge_workflow", {"judge_sampling": [0.5]}, "judge_sampling: a mapping"),
        ("judge_workflow", {"judge": True}, "judge:"),
        ("judge_workflow", {"judge_sampling": {"n": 4}}, "judge_sampling: unknown key(s) ['n']"),
    ],
)
def test_bad_judge_arguments_are_refused_before_the_run(workflow, args, problem) -> None:
    problems = WORKFLOW.get(workflow).arg_problems(args)
    assert len(problems) == 1 and problem in problems[0]


def test_a_judge_prompt_with_truth_needs_a_reference_answer(tokenizer) -> None:
    workflow = JudgeWorkflow(prompt="{question} -> {response}; expected {truth}")
    policy = FakeEngine(tokenizer, seed=0)
    models, _ = judge_handle(tokenizer, pointwise_reply)
    handle = TaskModelHandle(
        policy, tokenizer, SamplingParams(n=1), auxiliary=(models, models.handles(None, None))
    )
    with pytest.raises(ValueError, match="no reference answer"):
        asyncio.run(workflow.run(task(), handle))


def test_the_example_validates(monkeypatch) -> None:
    import ray
    from typer.testing import CliRunner

    from trinity.cli import app

    def refuse(*args, **kwargs):
        raise AssertionError("validate started Ray")

    monkeypatch.setattr(ray, "init", refuse)
    example = Path(__file__).resolve().parents[1] / "examples" / "judge" / "group_judge.yaml"
    result = CliRunner().invoke(app, ["validate", "--config", str(example)])
    assert result.exit_code == 0, result.output
