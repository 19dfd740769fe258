"""`email_search_workflow`: the local email database, and the agent's tool loop on the in-process
endpoint against a scripted engine, rewarded by ART-E's rubric (hand-derived below)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from test_agentscope import ByTurn, masked_text

from tests.chat_templates import chatml
from trinity.common.rollout import Sample, SamplingParams
from trinity.endpoint.app import build_app
from trinity.endpoint.server import EndpointServer, SessionPublisher, WorkflowSessions
from trinity.explorer.auxiliary import AuxiliaryModel, AuxiliaryModels
from trinity.explorer.model_client import TaskModelHandle
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW
from trinity.workflows.email_db import Email, create_email_db, read_email, search_emails

QUERY = {
    "id": 1,
    "question": "When does the merger close?",
    "answer": "June 5",
    "message_ids": ["<1@x>"],
    "how_realistic": 0.9,
    "inbox_address": "jeff@x",
    "query_date": "2001-05-20",
}
EMAILS = [
    Email("<1@x>", "2001-05-03 10:00:00", "Merger date", "alice@x", to_addresses=["jeff@x"],
          body="The merger closes on June 5."),
    Email("<2@x>", "2001-06-10 09:00:00", "Merger update", "alice@x", to_addresses=["jeff@x"],
          body="The merger moved."),  # after the query date
    Email("<3@x>", "2001-05-01 08:00:00", "Merger", "bob@y", to_addresses=["carol@y"],
          body="merger talk"),  # another inbox
    Email("<4@x>", "2001-05-02 08:00:00", "Lunch", "jeff@x", cc_addresses=["dan@x"],
          body="lunch at noon"),
]  # fmt: skip


@pytest.fixture
def db(tmp_path):
    return str(create_email_db(tmp_path / "emails.db", EMAILS))


def test_search_finds_the_inboxs_emails_before_the_date(db):
    hits = search_emails(db, "jeff@x", ["merger"], sent_before="2001-05-21")
    assert [h["message_id"] for h in hits] == ["<1@x>"]  # not <2> (later), not <3> (not jeff's)
    assert "<b>" in hits[0]["snippet"]
    assert [h["message_id"] for h in search_emails(db, "jeff@x", ["merger"])] == ["<2@x>", "<1@x>"]
    assert search_emails(db, "jeff@x", ["merger", "lunch"]) == []  # every keyword
    assert [h["message_id"] for h in search_emails(db, "dan@x", ["lunch"])] == ["<4@x>"]  # cc
    with pytest.raises(ValueError, match="keywords"):
        search_emails(db, "jeff@x", [])
    email = read_email(db, "<4@x>")
    assert (email.from_address, email.cc_addresses, email.to_addresses) == ("jeff@x", ["dan@x"], [])
    assert read_email(db, "<9@x>") is None


def call(name: str, **args: Any) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


class Judge:
    """Accepts an answer that mentions June 5."""

    def __init__(self, tok: Any) -> None:
        self.tok, self.model_version, self.prompts = tok, 0, []

    async def generate(self, prompt_ids: list[int], params: SamplingParams, key: Any = None):
        prompt = self.tok.decode(prompt_ids, skip_special_tokens=True)
        self.prompts.append(prompt)
        answer = prompt.split("AI answer:")[-1]
        ids = self.tok.encode("true" if "June 5" in answer else "false", add_special_tokens=False)
        ids.append(self.tok.eos_token_id)
        return [
            Sample(list(prompt_ids), ids, [-0.1] * len(ids), "stop", 0) for _ in range(params.n)
        ]


def run(script: list[str], db: str, n: int = 1, reward_fn_args: dict | None = None, **args):
    tok = chatml()
    engine = ByTurn(tok, script, "<|im_start|>assistant")
    judge = Judge(tok)
    aux = AuxiliaryModel(
        index=0, name=None, model_path="judge", client=judge, tokenizer=tok,
        defaults=SamplingParams(n=1, max_tokens=8), template_kwargs={}, max_prompt_tokens=None,
        seed=0,
    )  # fmt: skip
    models = AuxiliaryModels([aux], [aux])
    workflow = WORKFLOW.get("email_search_workflow")(db_path=db, **args)
    task = Task(index=0, raw=QUERY, prompt=QUERY["question"], truth="June 5",
                reward_fn_args=reward_fn_args or {})  # fmt: skip

    async def main():
        sessions = WorkflowSessions("policy", len(tok), 64, engine)
        server = EndpointServer(build_app(sessions, tool_call_parser="hermes"))
        publisher = SessionPublisher(sessions, await server.start())
        try:
            handle = TaskModelHandle(
                engine, tok, SamplingParams(n=n, max_tokens=64), key=7, publish=publisher,
                auxiliary=(models, models.handles(7, None)),
            )  # fmt: skip
            return await workflow.run(task, handle)
        finally:
            publisher.close()
            await server.stop()

    return asyncio.run(main()), tok, judge


SEARCH = call("search_emails", inbox_address="jeff@x", query_date="2001-05-20", keywords=["merger"])
READ = call("read_email", message_id="<1@x>")


def test_a_right_answer_with_its_source(db):
    script = [SEARCH, READ, call("generate_response", answer="June 5", sources=["<1@x>"])]
    exps, tok, judge = run(script, db, n=2)
    assert len(exps) == 2
    for e in exps:
        # accuracy 1; format 1 + 0.3 (source right) + 0.1/1 (one source) + 0.1 * (1 - 3/10)
        assert e.metrics["accuracy"] == 1.0
        assert e.metrics["format"] == pytest.approx(1.47)
        assert e.reward == pytest.approx(2.47)
        assert (e.metrics["actual_turns"], e.metrics["found_right_email"]) == (3.0, 1.0)
        assert e.metrics["read_right_email"] == 1.0 and e.info["sources"] == ["<1@x>"]
        tool_text = masked_text(tok, e)  # the tools' results are masked turns
        assert "<1@x>" in tool_text and "<2@x>" not in tool_text
        assert "The merger closes on June 5." in tool_text
        prompt = tok.decode(e.tokens[: e.prompt_length].tolist())
        assert "User's email address is jeff@x" in prompt and "2001-05-20" in prompt
    assert "Reference answer: June 5\nAI answer: June 5" in judge.prompts[0]


def test_a_wrong_answer_keeps_partial_credit(db):
    exps, _, _ = run([SEARCH, call("generate_response", answer="July", sources=[])], db)
    # found the right email (0.1), never read it, not a source: accuracy -1, format 0.1
    assert exps[0].metrics["accuracy"] == -1.0 and exps[0].reward == pytest.approx(-0.9)


def test_no_answer_and_the_rule_without_a_judge(db):
    exps, _, judge = run(["I give up."], db)
    assert (exps[0].metrics["accuracy"], exps[0].metrics["format"]) == (0.0, -1.0)
    script = [call("generate_response", answer="june 5", sources=[])]
    exps, _, judge = run(script, db, reward_fn_args={"llm_as_a_judge": False}, judge=None)
    assert exps[0].reward == 1.0 and judge.prompts == []  # "june 5" in "June 5", no judge


def test_out_of_turns_and_tool_errors(db):
    script = [call("read_email", message_id="<9@x>"), call("nope"), SEARCH]
    exps, tok, _ = run(script, db, max_turns=2)
    assert exps[0].metrics["actual_turns"] == 2.0 and exps[0].reward == -1.0  # no answer
    text = masked_text(tok, exps[0])
    assert "Error: Email (message_id = <9@x>) not found." in text


def test_arguments_and_database_are_checked(monkeypatch):
    cls = WORKFLOW.get("email_search_workflow")
    assert "max_turns must be an integer >= 1" in cls.arg_problems({"max_turns": 0})[0]
    assert cls.auxiliary_keys({}) == [("judge", 0)] and cls.auxiliary_keys({"judge": None}) == []
    monkeypatch.delenv("DEFAULT_EMAIL_DB_PATH", raising=False)
    with pytest.raises(ValueError, match="no email database"):
        cls().database()
    monkeypatch.setenv("DEFAULT_EMAIL_DB_PATH", "/data/emails.db")
    assert cls().database() == "/data/emails.db"
