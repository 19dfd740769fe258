"""`sciworld_workflow`: ScienceWorld as a text environment, run by `env_workflow`. A fake
simulator checks the protocol (prompts, actions, best-score rewards, closing); where the
`scienceworld` package is installed, the real simulator plays a task's gold path."""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import sys
import types
from typing import Any, ClassVar

import pytest

from tests.fake_engine import FakeEngine
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW

SCORES = {"focus on water": 50, "heat water": 30, "boil": 100}  # the score after each command


class FakeSim:
    """ScienceWorld's Python API, scripted: `SCORES` gives the score a command leads to."""

    made: ClassVar[list[FakeSim]] = []

    def __init__(self, task_name: str, jar: Any, envStepLimit: int) -> None:
        self.actions: list[str] = []
        self.closed = False
        FakeSim.made.append(self)

    def load(self, name: str, variation: int, simplification: str, generateGoldPath: bool):
        self.task = (name, variation, simplification)

    def reset(self):
        return "You are in the kitchen.", {}

    def get_task_description(self):
        return f"Your task is to {self.task[0]} water."

    def get_gold_action_sequence(self):
        return ["focus on water", "boil"]

    def step(self, action: str):
        self.actions.append(action)
        score = SCORES.get(action, 0)
        return f"did {action!r}", 0, score == 100, {"score": score}

    def close(self):
        self.closed = True


@pytest.fixture
def fake_scienceworld(monkeypatch):
    module = types.ModuleType("scienceworld")
    module.__spec__ = importlib.machinery.ModuleSpec("scienceworld", None)
    module.ScienceWorldEnv = FakeSim
    monkeypatch.setitem(sys.modules, "scienceworld", module)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/java")
    FakeSim.made = []


def run(replies: list[str], row: dict, n: int = 1, **args):
    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.0)
    engine.plans = [[(r, "stop")] * (n if i == 0 else 1) for i, r in enumerate(replies)]
    handle = TaskModelHandle(engine, tok, SamplingParams(n=n, max_tokens=64))
    workflow = WORKFLOW.get("sciworld_workflow")(**args)
    exps = asyncio.run(workflow.run(Task(index=0, raw=row), handle))
    return exps, [tok.decode(c[0]) for c in engine.calls]


ROW = {"task_desc": json.dumps({"task_name": "boil", "var_num": 2, "jar_path": "/nowhere.jar"})}


def test_the_best_score_is_the_reward(fake_scienceworld):
    replies = ["<think>a</think><action>focus on water</action>", "<action>heat water</action>",
               "<action>boil</action>"]  # fmt: skip
    (e,), prompts = run(replies, ROW)
    # best score 50 -> 50 -> 100: step rewards 0.5, 0, 0.5; the episode's 1.0 = 100 / 100
    assert e.reward == pytest.approx(1.0) and e.metrics["score"] == pytest.approx(1.0)
    assert (e.metrics["success"], e.metrics["turns"]) == (1.0, 3.0)
    assert (
        "Observation: \nTask Description: Your task is to boil water.\nYou are in the kitchen."
        in (prompts[0])
    )
    assert "<action> </action>" in prompts[0]  # the system prompt's format
    assert "Observation: \ndid 'focus on water'" in prompts[1]
    sims = FakeSim.made  # the probe and the episode's: both loaded the row's task, both closed
    assert [s.task for s in sims] == [("boil", 2, "easy")] * 2 and all(s.closed for s in sims)
    assert sims[1].actions == ["focus on water", "heat water", "boil"]


def test_a_reply_without_an_action_sends_nothing_and_a_fall_keeps_the_best(fake_scienceworld):
    (e,), _ = run(["I think.", "<action>focus on water", "<action>heat water</action>"], ROW,
                  max_turns=3)  # fmt: skip
    # scores 0, 50, 30: the best 50 -> reward 0.5; out of turns, not a success
    assert FakeSim.made[1].actions == ["", "focus on water", "heat water"]
    assert e.reward == pytest.approx(0.5)
    assert (e.metrics["success"], e.metrics["truncated"]) == (0.0, 1.0)


def test_rows_and_the_package_are_checked(fake_scienceworld, monkeypatch):
    with pytest.raises(ValueError, match=r"task_desc \(JSON with task_name and var_num\)"):
        run(["<action>boil</action>"], {"question": "boil"})
    monkeypatch.delitem(sys.modules, "scienceworld")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    (problem,) = WORKFLOW.get("sciworld_workflow").arg_problems({})
    assert "pip install scienceworld" in problem


def test_the_real_simulator_plays_a_gold_path():
    pytest.importorskip("scienceworld")
    gold = [
        "open door to kitchen",
        "go to kitchen",
        "look around",
        "focus on counter",
        "move counter to red box",
    ]  # find-non-living-thing, variation 0 ("easy")
    row = {"task_desc": json.dumps({"task_name": "find-non-living-thing", "var_num": 0})}
    (e,), prompts = run([f"<action>{a}</action>" for a in gold], row)
    assert "Task Description: Your task is to find a(n) non-living thing." in prompts[0]
    assert e.reward == pytest.approx(1.0) and e.metrics["success"] == 1.0
