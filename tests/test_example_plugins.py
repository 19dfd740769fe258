"""Trinity-RFT's example code named by dotted path in its example configs resolves from our
repository root (examples/), and behaves as described: Learn2Ask's rewards, the frozen-lake agent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.fake_engine import FakeEngine
from trinity.common.rollout import Sample, SamplingParams
from trinity.explorer.auxiliary import AuxiliaryModel, AuxiliaryModels
from trinity.explorer.model_client import TaskModelHandle
from trinity.models.tiny import build_tokenizer
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW

LEARN2ASK = "examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow"


class Grader:
    """Grades the doctor's last line: 1.0/1.0 when it asks about fever, else 0.5/0.5."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.model_version, self.prompts = tok, 0, []

    async def generate(self, prompt_ids: list[int], params: SamplingParams, key: Any = None):
        prompt = self.tok.decode(prompt_ids, skip_special_tokens=True)
        self.prompts.append(prompt)
        last = [line for line in prompt.splitlines() if line.startswith("doctor: ")][-1]
        s = "1.0" if "fever" in last else "0.5"
        text = f"<think>ok</think>\n<format_score>{s}</format_score>\n<content_score>{s}</content_score>"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
        return [
            Sample(list(prompt_ids), ids, [-0.1] * len(ids), "stop", 0) for _ in range(params.n)
        ]


def run_learn2ask(row: dict, replies: list[str], **args):
    tok = build_tokenizer()
    policy = FakeEngine(tok, split_rate=0.0)
    policy.plan = [(r, "stop") for r in replies]
    grader = Grader(tok)
    aux = AuxiliaryModel(
        index=0, name=None, model_path="grader", client=grader, tokenizer=tok,
        defaults=SamplingParams(n=1, max_tokens=64), template_kwargs={}, max_prompt_tokens=None,
        seed=0,
    )  # fmt: skip
    models = AuxiliaryModels([aux], [aux])
    handle = TaskModelHandle(
        policy, tok, SamplingParams(n=len(replies), max_tokens=32), key=1,
        auxiliary=(models, models.handles(1, None)),
    )  # fmt: skip
    task = Task(index=0, raw=row, messages=row["messages"])
    exps = asyncio.run(WORKFLOW.get(LEARN2ASK)(**args).run(task, handle))
    return exps, grader, tok.decode(policy.calls[0][0])


ROW = {
    "messages": [{"role": "user", "content": "I have a headache."}],
    "decision_truth": "continue",
    "info_truth": "fever; duration",
}
REPLIES = ["Do you have a fever, yes or no?", "<stop />", "How long? And where?"]


@pytest.mark.parametrize(
    "args, rewards",
    [
        # fever: action 1, content 1, format 1 -> 1*(1+2*1)+1 = 4; stop: wrong decision -> 0;
        # other question: 1*(1+2*0.5)+0.5 = 2.5
        ({}, [4.0, 0.0, 2.5]),
        ({"fusion_mode": "sum"}, [3.0, 0.0, 2.0]),  # 1+1+1; 1+0.5+0.5
        ({"train_mode": "Rs"}, [4.0, 0.0, 3.5]),  # 3*1+1; 3*1+0.5
        ({"train_mode": "Ra"}, [3.0, 0.0, 1.5]),  # 2*1+1; 2*0.5+0.5
    ],
)
def test_learn2ask_rewards(args, rewards):
    exps, grader, prompt = run_learn2ask(ROW, REPLIES, **args)
    assert [e.reward for e in exps] == rewards
    assert exps[2].metrics == {"action_score": 1.0, "content_score": 0.5, "format_score": 0.5}
    assert len(grader.prompts) == 2  # the wrong decision is not graded
    assert "fever; duration" in grader.prompts[0]
    assert (
        "patient: I have a headache.\ndoctor: Do you have a fever, yes or no?" in grader.prompts[0]
    )
    assert ("<stop />" in prompt) == (args.get("train_mode") != "Ra")  # Ra asks for no stop


def test_learn2ask_stop_rows_need_no_grader():
    row = dict(ROW, decision_truth="stop")
    exps, grader, _ = run_learn2ask(row, ["<stop />", "<stop /> now", "Any fever?"])
    assert [e.reward for e in exps] == [4.0, 3.0, 0.0]  # 1*(1+2)+1; format 0: 3; wrong: 0
    assert grader.prompts == []


def test_learn2ask_checks_its_arguments():
    cls = WORKFLOW.get(LEARN2ASK)
    assert "train_mode 'RaRs'" in cls.arg_problems({"train_mode": "RaRs"})[0]
    assert cls.auxiliary_keys({}) == [("judge", 0)]


def test_the_frozen_lake_agent_is_frozen_lake_workflow_with_trinity_args():
    cls = WORKFLOW.get("examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow")
    assert issubclass(cls, WORKFLOW.get("frozen_lake_workflow"))
    w = cls(env_max_steps=8, agent_max_steps=10, is_slippery=False)
    assert w.env_args == {"max_steps": 8, "p": 0.8} and w.max_turns == 10


def test_dotted_paths_resolve_from_the_launch_directory_without_it_on_the_path(tmp_path):
    """The `trinity` console script's sys.path holds its bin folder, not the directory it runs
    in: a dotted path is looked for there too (Ray's workers of a local run have it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "trinity").symlink_to(root / "trinity")  # trinity, not the repo root
    script = tmp_path / "bin.py"
    script.write_text(
        "import sys\n"
        "assert all(not p or 'examples' not in __import__('os').listdir(p) for p in sys.path "
        "if __import__('os').path.isdir(p))\n"
        "from trinity.workflows import WORKFLOW\n"
        f"print(WORKFLOW.get({LEARN2ASK!r}).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib")}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=root, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Learn2AskWorkflow"
