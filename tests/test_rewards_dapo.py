"""`math_dapo_reward`, `math_boxed_reward_naive_dapo` and `rm_gallery_reward` on hand-built
responses; the math workflow passes DAPO's reward each response's token count."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from trinity.rewards import REWARD_FN
from trinity.rewards import rm_gallery as rmg
from trinity.rewards.dapo import naive_dapo_score, overlong_penalty


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("Some work. \\boxed{7}", "7", 1.0),
        ("\\boxed{7}", "8", 0.0),
        # math-verify: 1/2 = 0.5
        ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        # only the text after the last </think> counts: a box inside the thinking does not
        ("<think>maybe \\boxed{5}</think> so five", "5", 0.0),
        ("<think>maybe \\boxed{4}</think> then \\boxed{5}", "5", 1.0),
        # the last box wins; \fbox counts as a box
        ("\\boxed{3} no wait \\boxed{5}", "5", 1.0),
        ("\\fbox{5}", "5", 1.0),
        # no box: the whole text must be the answer, prose is not one
        ("42", "42", 1.0),
        ("The answer is 42", "42", 0.0),
        # text answers compare as normalised strings
        ("\\boxed{\\text{Evelyn}}", "Evelyn", 1.0),
        ("\\boxed{\\text{Evelyn}}", "Maria", 0.0),
        # nested braces inside the box
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ],
)
def test_naive_dapo_score(response: str, truth: str, score: float) -> None:
    assert naive_dapo_score(response, truth) == score
    out = REWARD_FN.get("math_boxed_reward_naive_dapo")(response, truth, {}, with_think=True)
    assert out == {"accuracy": score, "format_score": 0.0}


def test_overlong_penalty_by_hand() -> None:
    # L = 20, C = 4, F = 1: free up to 16 tokens, then -(len - 16)/4, then -1 past 20
    assert [overlong_penalty(n, 20, 4, 1.0) for n in (10, 16, 18, 20, 21)] == [
        0.0, 0.0, -0.5, -1.0, -1.0,
    ]  # fmt: skip
    assert overlong_penalty(19, 20, 4, 2.0) == pytest.approx(-1.5)  # -(3/4)·2


def test_math_dapo_reward_components() -> None:
    fn = REWARD_FN.get("math_dapo_reward")
    args = dict(
        enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=4
    )
    assert fn("\\boxed{7}", "7", {}, response_length=18, **args) == {
        "accuracy": 1.0,
        "format_score": -0.5,
    }
    # the penalty off (Trinity-RFT's default): no length needed
    assert fn("\\boxed{6}", "7", {}) == {"accuracy": 0.0, "format_score": 0.0}
    with pytest.raises(ValueError, match="length in tokens"):
        fn("\\boxed{7}", "7", {}, **args)
    with pytest.raises(ValueError, match="cache_length"):
        fn("\\boxed{7}", "7", {}, enable_overlong_penalty=True, penalty_factor=1.0)
    assert fn.arg_problems({"enable_overlong_penalty": True, "penalty_factor": 1.0,
                            "max_response_length": 4, "cache_length": 4})  # fmt: skip
    assert fn.arg_problems({"response_length": 3})
    assert fn.arg_problems(args) == []


def test_math_workflow_passes_the_response_length() -> None:
    from trinity.common.rollout import Sample
    from trinity.workflows import WORKFLOW

    class Model:
        async def chat(self, messages, tools=None):
            return [Sample([1, 2], [5] * n, [0.0] * n, "stop", 0) for n in (10, 18)]

        def decode(self, ids):
            return "\\boxed{7}"

    task = types.SimpleNamespace(
        index=0, truth="7", raw={}, tools=None, reward_fn_type="math_dapo_reward",
        reward_fn_args={"enable_overlong_penalty": True, "penalty_factor": 1.0,
                        "max_response_length": 20, "cache_length": 4},
        to_messages=lambda: [{"role": "user", "content": "q"}],
        prompt_messages=lambda: [{"role": "user", "content": "q"}],
    )  # fmt: skip
    exps = asyncio.run(WORKFLOW.get("math_workflow")().run(task, Model()))
    # 10 tokens: no penalty; 18 tokens: -(18 - 16)/4 = -0.5
    assert [e.reward for e in exps] == [1.0, 0.5]
    assert [e.metrics["format_score"] for e in exps] == [0.0, -0.5]


# -- rm_gallery_reward ----------------------------------------------------------------------------


def test_rm_gallery_reward_is_refused_by_name_without_the_package(monkeypatch) -> None:
    monkeypatch.setattr(rmg, "installed", lambda: False)
    fn = REWARD_FN.get("rm_gallery_reward")  # a known name, not an unknown one
    problems = fn.arg_problems({"reward_name": "math_verify_reward"})
    assert len(problems) == 1 and "needs the rm-gallery package" in problems[0]
    with pytest.raises(ImportError, match="rm-gallery"):
        fn("\\boxed{1}", "1", {}, reward_name="math_verify_reward")


def test_rm_gallery_reward_builds_the_sample_and_reads_the_dimensions(monkeypatch) -> None:
    """RM-Gallery's classes replaced by minimal stand-ins: the response is the answer, the truth
    its label's reference, each scored dimension a component."""

    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class Dim(Obj):
        pass

    built = {}

    class Rule:
        def __init__(self, **kw):
            built["args"] = kw

        def evaluate(self, sample):
            answer = sample.output[0].answer
            ok = float(answer.content == answer.label["reference"])
            answer.reward = Obj(details=[Dim(name="exact", score=ok)], score=ok)
            return sample

    tree = {
        "rm_gallery": {},
        "rm_gallery.core": {},
        "rm_gallery.core.data": {},
        "rm_gallery.core.data.schema": {"DataOutput": Obj, "DataSample": Obj, "Step": Obj},
        "rm_gallery.core.reward": {},
        "rm_gallery.core.reward.registry": {
            "RewardRegistry": Obj(get=lambda name: {"exact_rule": Rule}[name])
        },
        "rm_gallery.core.reward.schema": {"RewardDimensionWithScore": Dim},
    }
    for name, attrs in tree.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    monkeypatch.setattr(rmg, "installed", lambda: True)
    monkeypatch.setattr(rmg, "_MODELS", {})
    fn = REWARD_FN.get("rm_gallery_reward")
    assert fn("12", "12", {}, reward_name="exact_rule", strict=True) == {"exact": 1.0}
    assert fn("13", "12", {}, reward_name="exact_rule", strict=True) == {"exact": 0.0}
    assert built["args"] == {"strict": True}
    assert fn.arg_problems({}) and "reward_name" in fn.arg_problems({})[0]


def test_rm_gallery_math_verify_reward_for_real() -> None:
    pytest.importorskip("rm_gallery")
    fn = REWARD_FN.get("rm_gallery_reward")
    assert fn("so \\boxed{\\frac{1}{2}}", "0.5", {}, reward_name="math_verify_reward") == {
        "math_verify": 1.0
    }
