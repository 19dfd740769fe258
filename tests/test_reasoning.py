"""Reasoning parsers (`reasoning_parser`): `<think>` reasoning split from the answer, as vLLM's
parsers of the same names, in the endpoint, in workflow handles and in the session's reply
matching; the sampled tokens never change."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests import chat_templates
from tests.fake_engine import FakeEngine
from tests.test_agentscope import ByTurn, assert_exact, call, needs_agentscope
from tests.test_endpoint import ScriptedEngine
from trinity.common.reasoning import REASONING_PARSER, Reasoning, deepseek_r1, qwen3
from trinity.common.registry import RegistryError
from trinity.common.rollout import SamplingParams
from trinity.endpoint.app import build_app
from trinity.endpoint.server import EndpointServer, EngineSessions
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.models import load_tokenizer

# -- the parsers on hand-written replies ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "r1", "q3"),
    [
        # both tags: reasoning before </think>, the answer after it (not stripped)
        ("<think>add 1 and 2</think>\n\nIt is 3", ("add 1 and 2", "\n\nIt is 3"), None),
        # the opening tag in the prompt (R1's template): the reply starts inside the reasoning
        ("add 1 and 2</think>It is 3", ("add 1 and 2", "It is 3"), None),
        # no </think>: R1 was cut while thinking (all reasoning); Qwen3 did not think (all answer)
        ("<think>still adding", ("still adding", None), (None, "still adding")),
        ("It is 3", ("It is 3", None), (None, "It is 3")),
        # an empty answer is None, an empty reasoning ""
        ("<think>done</think>", ("done", None), None),
        ("<think></think>It is 3", ("", "It is 3"), None),
        # only the first </think> ends the reasoning
        ("a</think>b</think>c", ("a", "b</think>c"), None),
    ],
)
def test_the_parsers_split_as_vllm_s(text, r1, q3):
    assert deepseek_r1(text) == Reasoning(*r1)
    assert qwen3(text) == Reasoning(*(q3 or r1))  # with a </think>, the two agree


def test_an_unknown_name_lists_the_parsers():
    with pytest.raises(RegistryError, match=r"deepseek_r1.*qwen3"):
        REASONING_PARSER.get("deepseek")


def test_validate_refuses_an_unknown_parser_naming_the_valid_ones(tmp_path):
    from trinity.config.loader import load_config
    from trinity.config.preflight import preflight

    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {model_path: 'tiny://1m'}\n"
        "buffer: {explorer_input: {taskset: {storage_type: synthetic, path: arithmetic,"
        " format: {prompt_key: question, response_key: answer}}}}\n"
    )
    ok = preflight(load_config(path, ["explorer.rollout_model.reasoning_parser=deepseek_r1"]))
    assert not ok.problems
    bad = preflight(load_config(path, ["explorer.rollout_model.reasoning_parser=r1"])).problems
    (p,) = [p for p in bad if p.path == "explorer.rollout_model.reasoning_parser"]
    assert "unknown reasoning_parser 'r1'; valid: deepseek_r1, qwen3" in p.message


# -- a workflow's handle -------------------------------------------------------------------------


def test_workflow_chat_samples_carry_the_split_and_keep_every_sampled_token():
    tok = chat_templates.chatml()
    engine = FakeEngine(tok, split_rate=0.0)
    handle = TaskModelHandle(engine, tok, SamplingParams(n=2), reasoning_parser="qwen3")
    engine.plan = [("<think>check the sum</think>the answer", "stop"), ("the answer", "stop")]
    first, second = asyncio.run(handle.chat([{"role": "user", "content": "what is the sum"}]))
    assert (first.info["reasoning_content"], first.info["content"]) == (
        "check the sum",
        "the answer",
    )
    assert (second.info["reasoning_content"], second.info["content"]) == (None, "the answer")
    think = tok.convert_tokens_to_ids("<think>")
    assert first.response_ids[0] == think  # token-in/token-out: the think block is sampled


def test_an_auxiliary_model_s_chat_samples_carry_its_own_parser_s_split():
    from trinity.explorer.auxiliary import AuxiliaryHandle, AuxiliaryModel

    tok = chat_templates.chatml()
    engine = FakeEngine(tok, split_rate=0.0)
    model = AuxiliaryModel(
        0, None, "judge", engine, tok, SamplingParams(n=1), {}, None, 0, reasoning=deepseek_r1
    )
    engine.plan = [("check the sum", "length")]  # cut while thinking: all reasoning (R1)
    (s,) = asyncio.run(AuxiliaryHandle(model, None, None).chat([{"role": "user", "content": "q"}]))
    assert (s.info["reasoning_content"], s.info["content"]) == ("check the sum", None)


# -- the endpoint --------------------------------------------------------------------------------


class Served:
    """The endpoint over a scripted engine, on a loop of its own thread, with a parser."""

    def __init__(self, tokenizer, parser: str) -> None:
        self.engine = ScriptedEngine(tokenizer)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        defaults = SamplingParams(n=1, temperature=1.0, max_tokens=64)

        async def start() -> str:
            client = BatchingClient([InProcess(self.engine)])
            self.sessions = EngineSessions(
                client, tokenizer, defaults, "policy", reasoning_parser=parser
            )
            self.server = EndpointServer(build_app(self.sessions, reasoning_parser=parser))
            return await self.server.start()

        self.url = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=120)

    def client(self, session: str) -> openai.OpenAI:
        url = self.url.replace("/v1", f"/sessions/{session}/v1")
        return openai.OpenAI(base_url=url, api_key="-", max_retries=0)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def r1(tiny_model_dir) -> Iterator[Served]:
    served = Served(load_tokenizer(str(tiny_model_dir)), "deepseek_r1")
    yield served
    served.close()


REPLY = "<think>add one and two</think>The answer is 3"
USER = [{"role": "user", "content": "1+2="}]


def test_the_endpoint_message_carries_reasoning_content_and_the_tokens_as_sampled(r1):
    r1.engine.reply = REPLY
    r = r1.client("a").chat.completions.create(
        model="policy", messages=USER, max_tokens=64, logprobs=True
    )
    message = r.choices[0].message
    assert message.reasoning_content == "add one and two"
    assert message.content == "The answer is 3"
    # the logprobs are the sampled tokens': the whole reply, think block included
    assert "".join(t.token for t in r.choices[0].logprobs.content) == REPLY
    ids = r1.engine.tokenizer.encode(REPLY, add_special_tokens=False)
    assert r.usage.completion_tokens == len(ids)


def test_a_streamed_answer_sends_the_reasoning_then_the_content(r1):
    r1.engine.reply = REPLY
    stream = r1.client("b").chat.completions.create(
        model="policy", messages=USER, max_tokens=64, stream=True
    )
    reasoning, content = [], []
    for chunk in stream:
        for c in chunk.choices:
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
            content.append(c.delta.content or "")
    assert "".join(reasoning) == "add one and two" and "".join(content) == "The answer is 3"


def test_tool_calls_are_parsed_from_the_answer_alone(r1):
    r1.engine.reply = (
        '<think>I call add</think><tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    )
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    r = r1.client("c").chat.completions.create(
        model="policy", messages=USER, max_tokens=64, tools=tools
    )
    choice = r.choices[0]
    assert choice.message.reasoning_content == "I call add"
    assert choice.finish_reason == "tool_calls"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"a": 1}


def test_a_next_turn_without_the_reasoning_continues_the_sampled_tokens(r1):
    """A client that sends the answer back without `reasoning_content` (most do) continues the
    held tokens, think block included: one trajectory, no drift."""
    r1.engine.reply = REPLY
    client = r1.client("d")
    first = client.chat.completions.create(model="policy", messages=USER, max_tokens=64)
    back = {"role": "assistant", "content": first.choices[0].message.content}
    r1.engine.reply = "<think>again</think>Still 3"
    client.chat.completions.create(
        model="policy", messages=[*USER, back, {"role": "user", "content": "sure?"}], max_tokens=64
    )
    handle = r1.sessions.sessions["d"]
    assert handle.ledger.stats.drift == 0 and len(handle.ledger.trajectories) == 1
    (exp,) = handle.extract_experiences(reward=1.0)
    tok = r1.engine.tokenizer
    text = tok.decode(exp.tokens.tolist()[exp.prompt_length :])
    assert text.startswith(REPLY) and text.endswith("<think>again</think>Still 3")


def test_raw_body_has_reasoning_content_null_when_the_reply_has_none(tiny_model_dir):
    served = Served(load_tokenizer(str(tiny_model_dir)), "qwen3")
    try:
        served.engine.reply = "3"
        with httpx.Client(base_url=served.url, timeout=60) as http:
            body = http.post(
                "/chat/completions", json={"model": "policy", "messages": USER, "max_tokens": 8}
            ).json()
        assert body["choices"][0]["message"] == {
            "role": "assistant",
            "content": "3",
            "reasoning_content": None,
        }
    finally:
        served.close()


# -- an AgentScope agent on the endpoint -----------------------------------------------------------


@needs_agentscope
def test_an_agentscope_react_episode_under_deepseek_r1_trains_exactly_the_sampled_tokens():
    """The agent gets each reply's reasoning apart (`reasoning_content`, AgentScope's thinking
    block) and the answer with its tool call; what it sends back continues the sampled tokens,
    think blocks included, with no drift (Trinity-RFT's agentscope_react examples set
    `reasoning_parser: deepseek_r1`)."""
    from trinity.endpoint.server import SessionPublisher, WorkflowSessions
    from trinity.tasks.task import Task
    from trinity.workflows import WORKFLOW

    tok = chat_templates.chatml()  # drops history's <think> blocks when it renders a conversation
    replies = [f"<think>17 and 25</think>Adding.{call('17+25')}", "<think>so 42</think>\\boxed{42}"]
    engine = ByTurn(tok, replies, "<|im_start|>assistant")
    workflow = WORKFLOW.get("agentscope_react_workflow")(max_iters=3)
    task = Task(index=0, raw={"question": "What is 17+25?"}, prompt="What is 17+25?", truth="42")

    async def main():
        sessions = WorkflowSessions("policy", len(tok), 64, engine)
        app = build_app(sessions, tool_call_parser="hermes", reasoning_parser="deepseek_r1")
        server = EndpointServer(app)
        publisher = SessionPublisher(sessions, await server.start())
        try:
            params = SamplingParams(n=1, max_tokens=48)
            handle = TaskModelHandle(
                engine, tok, params, key=7, publish=publisher, reasoning_parser="deepseek_r1"
            )
            return handle, await workflow.run(task, handle)
        finally:
            publisher.close()
            await server.stop()

    handle, exps = asyncio.run(main())
    assert_exact(exps, engine.calls)
    (e,) = exps
    assert e.reward == 1.0 and e.response_text == "\\boxed{42}"  # the answer, think block apart
    sampled = tok.decode(e.response_tokens.tolist())
    assert "<think>17 and 25</think>" in sampled and "<think>so 42</think>" in sampled
    stats = handle.ledger_stats()
    assert (stats.calls, stats.segments, stats.drift, stats.bridged) == (2, 1, 0, 1)
