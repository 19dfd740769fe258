"""`email_search_workflow`: an agent searches a local inbox with tools to answer a question.

Trinity-RFT's name, after OpenPipe's ART-E.

    explorer:
      rollout_model: {enable_openai_api: true, tool_call_parser: hermes}
      auxiliary_models: [{model_path: ...}]            # the answer's judge (auxiliary model 0)
    buffer.explorer_input.taskset:
      format: {prompt_key: question, response_key: answer}
      workflow_args: {max_turns: 10, db_path: enron_emails.db}   # or $DEFAULT_EMAIL_DB_PATH
      reward_fn_args: {llm_as_a_judge: true}
    buffer.explorer_input.default_workflow_type: email_search_workflow

A row is Trinity-RFT's query: `question`, `answer`, `message_ids` (the emails that hold the
answer), `inbox_address`, `query_date`. Per task, `repeat_times` episodes run at once, each a
session of the endpoint driven by a plain OpenAI tool loop: the system prompt (the inbox, the
date, the turn budget), the question, then up to `max_turns` model calls. Tools:
`search_emails(inbox_address, query_date, keywords)` (full-text search of that inbox, emails sent
up to the query date, 10 newest: `[{message_id, snippet}]`), `read_email(message_id)` (the email
as JSON), `generate_response(answer, sources)` (ends the episode with the answer and the message
ids it rests on). Tool results are cut to `tool_obs_char_limit` characters; a tool's error is
answered as its result. The database is SQLite (`email_db.py`, Trinity-RFT's layout).

Reward (ART-E's rubric, as Trinity-RFT computes it; `accuracy` + `format`, both metrics):
- no `generate_response` call: accuracy 0, format -1;
- `llm_as_a_judge: false`: accuracy 1 when the reference answer contains the answer
  (case-insensitive), format 0;
- else partial = 0.1 each for: the first reference email was ever found by a search, ever read,
  and is among the sources. The judge (auxiliary model `judge`) is shown the question, the
  reference answer and the answer and says true or false (its reply holds "true"). A non-empty
  answer judged wrong ("I don't know" too): accuracy -1, format partial; "I don't know" judged
  right: accuracy 0, format partial; a right answer: accuracy 1, format 1 + 0.3 (sources right)
  + 0.1 / number of sources + 0.1 · (1 - model calls / max_turns); an empty answer judged wrong:
  0, 0.
Metrics also: `actual_turns` (model calls), `found_right_email`, `read_right_email`.

Departs from Trinity-RFT: no AgentScope (the loop is a plain OpenAI-client one; the answer is the
`generate_response` call's arguments, which Trinity-RFT forces through AgentScope's structured
output: an episode that never calls it scores as "no answer"); one multi-turn experience per
episode, not one per model call; a judge that fails fails the task (the explorer retries it)
instead of counting as a wrong answer; `tool_obs_char_limit`, read but not applied by
Trinity-RFT, cuts tool results here.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from trinity.common.experience import Experience
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow, built_arg_problems
from trinity.workflows.email_db import read_email, search_emails

DB_ENV = "DEFAULT_EMAIL_DB_PATH"  # Trinity-RFT's variable
SYSTEM_PROMPT = (
    "You are an email search agent. You are given a user query and tools to search the user's "
    "email. Use them to find the answer to the query. You may take up to {max_turns} turns, so "
    "if a search finds nothing useful, try other keywords. Describe what you see and plan your "
    "next step. When you have found the answer, call `generate_response` with the answer and "
    "the message ids of the emails it comes from; call it only then, and give no next steps "
    'in it. If you cannot find the answer, answer "I don\'t know" with no sources.\n\n'
    "User's email address is {inbox}\nToday's date is {today}\n"
)
JUDGE_PROMPT = (
    "You are given a question, the reference answer (**Reference answer**) and an answer written "
    "by an AI assistant (**AI answer**). Decide whether to accept the AI answer: find exactly "
    "what the question asks for, take from the reference answer only the facts needed to answer "
    "that, and accept the AI answer when every one of those facts is in it with the same "
    "meaning (other wording, order or extra consistent details are fine); reject it when one is "
    "missing or contradicted. Do not penalise it for leaving out non-essential facts. Reply "
    "with only true or false."
)
_TOOLS = [
    ("search_emails", "Search the user's inbox for emails that contain all the keywords.", {
        "inbox_address": {"type": "string", "description": "The user's email address."},
        "query_date": {"type": "string", "description": "The query's date, YYYY-MM-DD."},
        "keywords": {"type": "array", "items": {"type": "string"}, "description": "Keywords."},
    }),
    ("read_email", "Read an email of the user's inbox.", {
        "message_id": {"type": "string", "description": "The email's message id."},
    }),
    ("generate_response", "Give the final answer and its sources; ends the search.", {
        "answer": {"type": "string", "description": "The answer, or \"I don't know\"."},
        "sources": {"type": "array", "items": {"type": "string"},
                    "description": "Message ids of the emails the answer comes from."},
    }),
]  # fmt: skip
TOOL_SCHEMAS = [
    {"type": "function", "function": {"name": name, "description": about, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
    for name, about, props in _TOOLS
]  # fmt: skip
_QUERY_FIELDS = ("question", "answer", "message_ids", "inbox_address", "query_date")


@dataclass
class _Episode:
    answer: str | None = None
    sources: list[str] = field(default_factory=list)
    calls: int = 0
    found: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)


@WORKFLOW.register("email_search_workflow")
class EmailSearchWorkflow(Workflow):
    needs_openai_api = True  # pre-flight: explorer.rollout_model.enable_openai_api

    def __init__(
        self,
        max_turns: int = 10,
        tool_obs_char_limit: int = 2000,
        db_path: str | None = None,
        judge: int | str | None = 0,
    ) -> None:
        """`db_path` (ours): the database, else $DEFAULT_EMAIL_DB_PATH; `judge` (ours): the
        judge's auxiliary model, None for none (then `llm_as_a_judge: false`)."""
        for name, value in (("max_turns", max_turns), ("tool_obs_char_limit", tool_obs_char_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"email_search_workflow: {name} must be an integer >= 1: {value!r}"
                )
        super().__init__(max_turns=max_turns, db_path=db_path, judge=judge)
        self.max_turns, self.char_limit = max_turns, tool_obs_char_limit
        self.db_path, self.judge_key = db_path, judge

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        return built_arg_problems(cls, args)

    @classmethod
    def auxiliary_keys(cls, args: dict[str, Any]) -> list[tuple[str, Any]]:
        judge = args.get("judge", 0)
        return [] if judge is None else [("judge", judge)]

    def database(self) -> str:
        path = self.db_path or os.environ.get(DB_ENV)
        if not path:
            raise ValueError(
                f"email_search_workflow: no email database: set workflow_args.db_path or "
                f"${DB_ENV} (explorer.env_vars); Trinity-RFT's prepare_data.py builds one"
            )
        return path

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. the query; 2. the episodes, one session each, at once; 3. rewards; 4. experiences."""
        # 1.
        query = task.raw
        missing = [f for f in _QUERY_FIELDS if f not in query]
        if missing:
            raise ValueError(
                f"email_search_workflow: task {task.index} of {task.taskset_name!r} has no "
                f"{', '.join(missing)}; a query row holds {', '.join(_QUERY_FIELDS)}"
            )
        db = self.database()
        # 2.
        sessions = [model.session() for _ in range(model.defaults.n)]
        episodes = await asyncio.gather(*(self.episode(s, query, db) for s in sessions))
        # 3.
        judge = bool(task.reward_fn_args.get("llm_as_a_judge", True))
        scores = await asyncio.gather(*(self.reward(model, query, ep, judge) for ep in episodes))
        # 4.
        out = []
        for session, ep, comps in zip(sessions, episodes, scores, strict=True):
            right = str(query["message_ids"][0]) if query["message_ids"] else None
            metrics = comps | {
                "actual_turns": float(ep.calls),
                "found_right_email": float(right in ep.found),
                "read_right_email": float(right in ep.read),
            }
            for e in session.extract_experiences(float(sum(comps.values()))):
                e.metrics, e.response_text = dict(metrics), ep.answer
                e.info.update({"task_index": task.index, "sources": ep.sources})
                out.append(e)
        return out

    async def episode(self, session: ModelHandle, query: dict[str, Any], db: str) -> _Episode:
        """The agent's tool loop on one session (module doc)."""
        system = SYSTEM_PROMPT.format(
            max_turns=self.max_turns, inbox=query["inbox_address"], today=query["query_date"]
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": str(query["question"])},
        ]
        ep = _Episode()
        client = session.async_openai_client()
        try:
            while ep.calls < self.max_turns:
                r = await client.chat.completions.create(
                    model=client.model_path, messages=messages, tools=TOOL_SCHEMAS
                )
                ep.calls += 1
                reply = r.choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    return ep  # answered without generate_response: no answer
                for call in reply.tool_calls:
                    result = await asyncio.to_thread(self.call, call.function, db, ep)
                    if ep.answer is not None:
                        return ep
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            return ep  # out of turns: no answer
        finally:
            await client.close()

    def call(self, function: Any, db: str, ep: _Episode) -> str:
        """Run one tool call; its result's text (an error is answered, not raised)."""
        try:
            args = json.loads(function.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("the arguments are not a JSON object")
            if function.name == "generate_response":
                sources = args.get("sources") or []
                if not isinstance(args.get("answer"), str) or not isinstance(sources, list):
                    raise ValueError("answer must be a text and sources a list of message ids")
                ep.answer, ep.sources = args["answer"], [str(s) for s in sources]
                return ""
            if function.name == "search_emails":
                before = date.fromisoformat(args["query_date"]) + timedelta(days=1)
                hits = search_emails(db, args["inbox_address"], args["keywords"], str(before))
                ep.found += [h["message_id"] for h in hits]
                text = json.dumps(hits)
            elif function.name == "read_email":
                ep.read.append(str(args["message_id"]))
                email = read_email(db, str(args["message_id"]))
                text = (
                    json.dumps(email.to_dict())
                    if email is not None
                    else f"Error: Email (message_id = {args['message_id']}) not found."
                )
            else:
                text = f"Error: there is no tool {function.name!r}"
        except (ValueError, KeyError, TypeError) as e:
            text = f"Error: {function.name} failed: {type(e).__name__}: {e}"
        return text[: self.char_limit]

    async def reward(
        self, model: ModelHandle, query: dict[str, Any], ep: _Episode, use_judge: bool
    ) -> dict[str, float]:
        """{accuracy, format} of one episode (module doc)."""
        if ep.answer is None:
            return {"accuracy": 0.0, "format": -1.0}
        truth = str(query["answer"])
        if not use_judge:
            return {"accuracy": float(ep.answer.lower() in truth.lower()), "format": 0.0}
        right = str(query["message_ids"][0]) if query["message_ids"] else None
        found, read = (
            right is not None and right in ep.found,
            right is not None and right in ep.read,
        )
        sources_right = right is not None and right in ep.sources
        partial = 0.1 * found + 0.1 * read + 0.1 * sources_right
        correct = await self.judged_correct(model, query, ep.answer)
        if ep.answer != "" and not correct:
            return {"accuracy": -1.0, "format": partial}
        if ep.answer == "I don't know":
            return {"accuracy": 0.0, "format": partial}
        if correct:
            extra = 0.3 * sources_right + (0.1 / len(ep.sources) if ep.sources else 0.0)
            return {"accuracy": 1.0, "format": 1.0 + extra + 0.1 * (1 - ep.calls / self.max_turns)}
        return {"accuracy": 0.0, "format": 0.0}  # an empty answer the judge rejected

    async def judged_correct(self, model: ModelHandle, query: dict[str, Any], answer: str) -> bool:
        if self.judge_key is None:
            raise ValueError(
                "email_search_workflow: reward_fn_args.llm_as_a_judge is true but workflow_args."
                "judge is null: name the judge's auxiliary model, or set llm_as_a_judge: false"
            )
        judge = model.auxiliary(self.judge_key)
        user = (
            f"Question: {query['question']}\nReference answer: {query['answer']}\n"
            f"AI answer: {answer}"
        )
        messages = [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]
        (sample,) = await judge.chat(messages, n=1)
        return "true" in judge.decode(sample.response_ids).lower()
