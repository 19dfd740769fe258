"""Agent frameworks trained through the endpoint: AgentScope's ReAct agent
(`agentscope_react_workflow`) and a plain `openai`-client agent (examples/agents), each run on
an in-process endpoint against a scripted engine (replies chosen by the test, sampled as
non-canonical token splits) and against the tiny random model, then end to end by `trinity run`.

What is checked everywhere: the experiences hold exactly what the engine sampled (every turn
span is one engine call's completion, after exactly the prompt that call was given, with its
logprobs; nothing else is trained), the agent's tool calls run through its own toolkit, and the
tool results land in the trajectory as masked tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import ray
from test_e2e import run_trinity
from typer.testing import CliRunner

from tests.chat_templates import chatml
from tests.fake_engine import FakeEngine
from trinity.cli import app
from trinity.common.experience import Experience, ExperienceKind
from trinity.common.plugins import load_plugin_dirs
from trinity.common.rollout import PromptTooLong, SamplingParams
from trinity.config import load_config
from trinity.config.preflight import preflight
from trinity.endpoint.app import build_app
from trinity.endpoint.server import EndpointServer, SessionPublisher, WorkflowSessions
from trinity.explorer.engine import HFRolloutEngine
from trinity.explorer.explorer import Explorer
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.models import load_tokenizer
from trinity.tasks.task import Task
from trinity.workflows import WORKFLOW

# the `agents` extra (in `dev` and `test`, so `make setup` installs it)
needs_agentscope = pytest.mark.skipif(
    find_spec("agentscope") is None, reason="agentscope is not installed: pip install '.[agents]'"
)

ROOT = Path(__file__).resolve().parents[1]
REACT_EXAMPLE = ROOT / "examples" / "agentscope" / "react_arithmetic.yaml"
AGENT_EXAMPLE = ROOT / "examples" / "agents" / "openai_tool_agent.yaml"
PLUGINS = ROOT / "examples" / "agents"


def call(expression: str) -> str:
    """A hermes-style calculator call, as a model writes it."""
    args = json.dumps({"expression": expression})
    return f'<tool_call>{{"name": "calculator", "arguments": {args}}}</tool_call>'


class ByTurn(FakeEngine):
    """A scripted engine whose reply depends on the turn: the k-th reply of a conversation (k =
    assistant turns already in the prompt) is `script[k]`, whatever order concurrent episodes
    call in."""

    def __init__(self, tokenizer: Any, script: list[str], header: str) -> None:
        super().__init__(tokenizer, seed=0, split_rate=0.5)
        self.script, self.header = script, header
        # one lock per event loop: a test runs its episodes under several `asyncio.run`s, and a
        # lock that once had waiters is bound to the loop it had them on
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, key: int | None = None
    ) -> list:
        lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:  # one call at a time: `plan` is this call's
            turn = self.tokenizer.decode(prompt_ids).count(self.header) - 1
            self.plan = [(self.script[turn], "stop")] * params.n
            return await super().generate(prompt_ids, params, key)


class Recording:
    """An engine that keeps every (prompt, sample) it answered, as `FakeEngine.calls`."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []

    def generate(self, prompts, params, keys=None):
        out = self.engine.generate(prompts, params, keys)
        self.calls += [
            (list(p), s) for p, samples in zip(prompts, out, strict=True) for s in samples
        ]
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def serve_and_run(workflow: Any, task: Task, client: Any, tok: Any, n: int, **defaults: Any):
    """Run `workflow` on `task` as the explorer does with `enable_openai_api`: an endpoint on
    this loop, the task's handle and every session it opens published on it."""

    async def main() -> tuple[TaskModelHandle, list]:
        sessions = WorkflowSessions("policy", len(tok), 64, client)
        server = EndpointServer(build_app(sessions, tool_call_parser="hermes"))
        publisher = SessionPublisher(sessions, await server.start())
        try:
            params = SamplingParams(**{"n": n, "max_tokens": 48, **defaults})
            handle = TaskModelHandle(client, tok, params, key=7, publish=publisher)
            return handle, await workflow.run(task, handle)
        finally:
            publisher.close()
            await server.stop()
            assert not sessions.sessions  # every session withdrawn with the run

    return asyncio.run(main())


def assert_exact(exps: list, calls: list) -> None:
    """Every turn span of every experience is the completion of one engine call, after exactly
    the prompt that call was given, with its logprobs; only those tokens are trained; every
    engine call is in exactly one experience. `calls`: (prompt, sample or samples) pairs."""
    calls = [(q, x) for q, s in calls for x in (s if isinstance(s, list) else [s])]
    spans = 0
    for e in exps:
        assert e.kind == ExperienceKind.MULTI_TURN
        tokens, p = e.tokens.tolist(), e.prompt_length
        mask, lps = e.action_mask.tolist(), e.logprobs.tolist()
        trained = [False] * len(mask)
        for start, end, _ in e.info["turns"]:
            prompt, completion = tokens[: p + start], tokens[p + start : p + end]
            found = [s for q, s in calls if q == prompt and list(s.response_ids) == completion]
            assert len(found) == 1, "a turn that no engine call sampled"
            assert lps[start:end] == pytest.approx(found[0].logprobs, abs=1e-6)
            trained[start:end] = [True] * (end - start)
            spans += 1
        assert mask == trained  # sampled tokens only
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
    assert spans == len(calls)


def masked_text(tok: Any, e: Any) -> str:
    return tok.decode(e.response_tokens[~e.action_mask].tolist())


# -- AgentScope --------------------------------------------------------------------------------


@needs_agentscope
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_agentscope_react_calls_its_tool_and_trains_exactly_the_sampled_tokens(stream):
    tok = chatml()  # a Qwen-like template: renders the tools, drops earlier <think> blocks
    engine = ByTurn(tok, [f"<think>17 and 25</think>Adding.{call('17+25')}", "\\boxed{42}"],
                    "<|im_start|>assistant")  # fmt: skip
    workflow = WORKFLOW.get("agentscope_react_workflow")(max_iters=3, stream=stream)
    task = Task(index=3, raw={"question": "What is 17+25?"}, prompt="What is 17+25?", truth="42")
    handle, exps = serve_and_run(workflow, task, engine, tok, n=2)
    assert engine.non_canonical > 0  # the engine's splits are not the tokenizer's
    assert_exact(exps, engine.calls)
    assert len(exps) == 2 and len(engine.calls) == 4  # 2 episodes x (tool call, answer)
    assert sorted(e.eid.run for e in exps) == [0, 1]  # one experience per episode
    for e in exps:
        # the reply \boxed{42} is right (17 + 25 = 42): math_reward's accuracy 1
        assert e.reward == 1.0 and e.response_text == "\\boxed{42}"
        assert (e.metrics["tool_calls"], e.metrics["model_calls"]) == (1.0, 2.0)
        assert (e.metrics["tool_errors"], e.metrics["exceeded_max_iters"]) == (0.0, 0.0)
        prompt = tok.decode(e.tokens[: e.prompt_length].tolist())
        assert '"name": "calculator"' in prompt and "What is 17+25?" in prompt  # tools sent
        # the calculator ran (AgentScope's toolkit) and its result is a masked tool turn
        assert "<tool_response>\n42\n</tool_response>" in masked_text(tok, e)
        assert "<think>17 and 25</think>" in tok.decode(e.response_tokens.tolist())  # as sampled
    stats = handle.ledger_stats()
    assert (stats.calls, stats.segments, stats.drift, stats.bridged) == (4, 2, 0, 2)


@needs_agentscope
def test_agentscope_react_s_last_turn_without_tools_continues_the_trajectory():
    """max_iters used up: AgentScope adds a hint and calls once more with `tool_choice: none`.
    The tools stay in the prompt (as vLLM renders them), so that call continues the episode's
    tokens; a tool call it writes is text, not run."""
    tok = chatml()
    script = [call("6*7"), f"Again.{call('6*7')}"]
    engine = ByTurn(tok, script, "<|im_start|>assistant")
    workflow = WORKFLOW.get("agentscope_react_workflow")(max_iters=1, system_prompt="Calculate.")
    task = Task(index=0, raw={}, prompt="6*7=", truth="42")
    handle, [e] = serve_and_run(workflow, task, engine, tok, n=1)
    assert_exact([e], engine.calls)
    assert len(engine.calls) == 2
    stats = handle.ledger_stats()
    assert (stats.segments, stats.drift, stats.bridged) == (1, 0, 1)
    assert e.metrics["tool_calls"] == 1.0  # the first reply's call ran; the last one's did not
    assert e.metrics["exceeded_max_iters"] == 1.0
    assert e.response_text == f"Again.{call('6*7')}"  # returned as text: no tool_calls allowed
    assert "maximum of 1 reasoning-acting iterations" in masked_text(tok, e)  # the hint, masked
    assert e.reward == 0.0  # no \\boxed{} answer: math_reward's accuracy 0


class Overflows(ByTurn):
    """Its second turn's prompt is over the context: the engine refuses it (`PromptTooLong`)."""

    async def generate(self, prompt_ids, params, key=None):
        if "<tool_response>" in self.tokenizer.decode(prompt_ids):
            raise PromptTooLong(f"prompt of {len(prompt_ids)} tokens leaves no room")
        return await super().generate(prompt_ids, params, key)


@needs_agentscope
@pytest.mark.parametrize("case", ["malformed_call", "context_exceeded"])
def test_agentscope_react_episodes_that_end_early_keep_what_was_sampled(case):
    """A malformed tool call comes back as text, the agent's final answer (nothing dropped); a
    prompt that outgrows the model ends the episode unanswered. Either way the sampled reply
    is trained, exactly."""
    tok = chatml()
    if case == "malformed_call":
        engine = ByTurn(tok, ["<tool_call>{calculator(2+2)}</tool_call>"], "<|im_start|>assistant")
    else:
        engine = Overflows(tok, [call("2+2")], "<|im_start|>assistant")
    workflow = WORKFLOW.get("agentscope_react_workflow")(max_iters=3)
    task = Task(index=0, raw={}, prompt="2+2=", truth="4")
    handle, [e] = serve_and_run(workflow, task, engine, tok, n=1)
    assert_exact([e], engine.calls)
    assert e.reward == 0.0 and e.metrics["model_calls"] == 1.0
    if case == "malformed_call":
        assert e.response_text == "<tool_call>{calculator(2+2)}</tool_call>"
        assert (e.metrics["tool_calls"], e.metrics["context_exceeded"]) == (0.0, 0.0)
        assert e.info["tool_calls"] == [
            "malformed"
        ]  # kept for training (explorer.malformed_tool_calls)
        assert handle.ledger_stats().tool_calls_malformed == 1
    else:
        assert e.response_text == ""  # unanswered
        assert (e.metrics["tool_calls"], e.metrics["context_exceeded"]) == (1.0, 1.0)
    assert handle.ledger_stats().drift == 0


@needs_agentscope
def test_agentscope_react_on_the_tiny_random_model_records_what_was_sampled(tiny_model_dir):
    """A random model writes no valid tool call: every episode is one reply, scored, trained
    exactly as sampled (streamed, with the task's temperature)."""
    tok = load_tokenizer(str(tiny_model_dir))
    engine = Recording(HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1))
    workflow = WORKFLOW.get("as_react_workflow")(type="gsm8k", stream=True)
    task = Task(index=1, raw={}, prompt="12+30=", truth="42")
    handle, exps = serve_and_run(
        workflow, task, BatchingClient([InProcess(engine)]), tok, n=3, temperature=1.0
    )
    assert len(exps) == 3 and len(engine.calls) >= 3
    assert_exact(exps, engine.calls)
    assert all(e.reward in (0.0, 1.0) and e.metrics["context_exceeded"] == 0.0 for e in exps)
    assert handle.ledger_stats().drift == 0


@needs_agentscope
def test_agentscope_react_arguments_are_checked():
    wf = WORKFLOW.get("agentscope_react_workflow")
    assert WORKFLOW.get("as_react_workflow") is wf
    assert wf.arg_problems({"tools": ["calculator"], "max_iters": 2}) == []
    assert "unknown type 'alfworld'" in wf.arg_problems({"type": "alfworld"})[0]
    assert wf.arg_problems({"type": "alfworld", "system_prompt": "Act."}) == []
    assert "max_iters must be an integer >= 1" in wf.arg_problems({"max_iters": 0})[0]
    assert "unknown agent_tool 'calculater'" in wf.arg_problems({"tools": ["calculater"]})[0]
    assert "not an AgentTool" in wf.arg_problems({"tools": ["json.dumps"]})[0]


def test_agentscope_react_without_agentscope_2_says_what_to_install(monkeypatch):
    import importlib.metadata

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    wf = WORKFLOW.get("agentscope_react_workflow")
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert "pip install 'trinity[agents]'" in wf.arg_problems({})[0]
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.0.9")
    assert "agentscope 1.0.9 is installed" in wf.arg_problems({})[0]


@needs_agentscope
def test_agentscope_example_validates_and_needs_the_endpoint(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("validate must not start Ray")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, ["validate", "--config", str(REACT_EXAMPLE)])
    assert result.exit_code == 0, result.output
    cfg = load_config(REACT_EXAMPLE, ["explorer.rollout_model.enable_openai_api=false"])
    problems = [p for p in preflight(cfg).problems if "enable_openai_api" in p.path]
    assert problems and "talks to the model through OpenAI clients" in problems[0].message


# -- a plain openai-client agent (examples/agents, a plugin) ---------------------------------------


def test_openai_client_agent_runs_its_tools_and_trains_exactly_the_sampled_tokens():
    load_plugin_dirs([PLUGINS])
    tok = chatml()
    engine = ByTurn(tok, [call("9*9"), "81"], "<|im_start|>assistant")
    workflow = WORKFLOW.get("openai_tool_agent")(max_turns=3)
    task = Task(index=2, raw={}, prompt="9*9=", truth="81")
    handle, exps = serve_and_run(workflow, task, engine, tok, n=2)
    assert_exact(exps, engine.calls)
    assert len(exps) == 2 and len(engine.calls) == 4
    for e in exps:
        assert e.reward == 1.0 and e.metrics["tool_calls"] == 1.0  # 9*9 = 81
        assert "<tool_response>\n81\n</tool_response>" in masked_text(tok, e)
    stats = handle.ledger_stats()
    assert (stats.segments, stats.drift, stats.bridged) == (2, 0, 2)


@pytest.mark.parametrize("policy", ["keep", "mask", "penalize"])
def test_the_explorer_keeps_masks_or_penalizes_a_malformed_call_as_configured(policy):
    """explorer.malformed_tool_calls, acted on where the explorer runs a task (`_run_with_retry`,
    with the endpoint `prepare` starts): each episode's only reply tries to call the calculator
    with bad JSON. It comes back to the agent as text (its final answer, reward 0), is counted,
    kept on the experience, and trained as the policy says; an evaluation is never changed."""
    load_plugin_dirs([PLUGINS])
    tok = chatml()
    bad = "<tool_call>{calculator(9*9)}</tool_call>"
    engine = ByTurn(tok, [bad], "<|im_start|>assistant")
    overrides = [f"explorer.malformed_tool_calls.policy={policy}"]
    if policy == "penalize":
        overrides.append("explorer.malformed_tool_calls.penalty=-0.5")
    cfg = load_config(AGENT_EXAMPLE, overrides)
    task = Task(index=2, raw={}, prompt="9*9=", truth="81", workflow_args={"max_turns": 3})

    async def run(train: bool) -> tuple[list, dict]:
        sessions = WorkflowSessions("policy", len(tok), 64, engine)
        server = EndpointServer(build_app(sessions, tool_call_parser="hermes"))
        await server.start()
        explorer = Explorer.__new__(Explorer)  # what `prepare` gives `_run_with_retry`
        explorer.cfg, explorer.client, explorer.tokenizer = cfg, engine, tok
        explorer.endpoint, explorer.sessions, explorer.auxiliary = server, sessions, None
        counts: dict = Counter()
        try:
            params = SamplingParams(n=2, max_tokens=48)
            return await explorer._run_with_retry(task, params, counts, 7, train), counts
        finally:
            await server.stop()

    exps, counts = asyncio.run(run(train=True))
    assert len(exps) == 2 and counts["ledger_tool_calls_malformed"] == 2
    for e in exps:
        assert e.response_text == bad and e.info["tool_calls"] == ["malformed"]
        assert e.info["tool_call_errors"]["0"].startswith("tool call 0: ")
        [(start, end, _)] = e.info["turns"]
        trained = e.action_mask[start:end].tolist()
        assert trained == [policy != "mask"] * (end - start)
        assert e.reward == (-0.5 if policy == "penalize" else 0.0)
    evaluated, _ = asyncio.run(run(train=False))
    assert all(e.reward == 0.0 and e.action_mask.all() for e in evaluated)


def test_openai_client_agent_example_validates(monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["validate", "--config", str(AGENT_EXAMPLE), "--plugin-dir", str(PLUGINS)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "example", [pytest.param("agentscope", marks=needs_agentscope), "openai_tool_agent"]
)
def test_debug_workflow_serves_the_endpoint_to_an_agent(
    example, tiny_model_dir, tmp_path, monkeypatch
):
    """`trinity debug workflow` on an agent example: the endpoint runs in the process, each
    episode's session is published, and the task's episodes come back as experiences."""
    monkeypatch.delenv("TRINITY_PLUGIN_DIRS", raising=False)  # restored after the CLI sets it
    monkeypatch.chdir(ROOT)
    cfg = REACT_EXAMPLE if example == "agentscope" else AGENT_EXAMPLE
    out = tmp_path / "exps.jsonl"
    args = ["debug", "workflow", "--config", str(cfg), "--task", "2", "--out", str(out)]
    args += ["--set", f"model.model_path={tiny_model_dir}", "--plugin-dir", str(PLUGINS)]
    args += ["--set", "model.max_response_tokens=6", "--set", "algorithm.repeat_times=2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    exps = [Experience.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(exps) == 2  # repeat_times episodes, one session (and trajectory) each
    assert {e.kind for e in exps} == {ExperienceKind.MULTI_TURN}
    assert all(e.reward is not None and e.metrics["tool_calls"] >= 0 for e in exps)
    # every reply went through the endpoint's parser: its status per turn is shown and saved
    assert "tool calls per turn" in r.output and all(e.info["tool_calls"] for e in exps)


# -- end to end ----------------------------------------------------------------------------------


def _steps(run_dir: Path) -> tuple[list[dict], list[dict]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return (
        [r for r in records if "rollout/tasks" in r],
        [r for r in records if "train/loss" in r],
    )


@pytest.mark.long  # ~1 minute each on 2 shared cores
@pytest.mark.parametrize(
    "example",
    [
        pytest.param("agentscope", marks=needs_agentscope),
        pytest.param("openai_tool_agent", marks=pytest.mark.long),  # fast tests run its agent
    ],
)
def test_agent_example_trains_a_few_steps_end_to_end(example, tmp_path):
    """The example config for 3 GRPO steps through `trinity run`: each step's episodes all
    recorded through the endpoint (one trajectory each, no drift) and trained."""
    if example == "agentscope":
        cfg, run_dir, extra = REACT_EXAMPLE, tmp_path / "ckpt" / "agents" / "react_arithmetic", {}
    else:
        cfg, run_dir = AGENT_EXAMPLE, tmp_path / "ckpt" / "agents" / "openai_tool_agent"
        extra = {"TRINITY_PLUGIN_DIRS": str(PLUGINS)}
    overrides = [
        f"checkpoint_root_dir={tmp_path / 'ckpt'}",
        "cluster.ray_address=local",
        "buffer.total_steps=3",
        "explorer.eval_interval=0",
        "explorer.eval_on_startup=false",
    ]
    r = run_trinity(
        cfg, env_extra=extra, overrides=overrides, cache=tmp_path / "cache", timeout=600
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps, trained = _steps(run_dir)
    assert len(steps) == 3 and len(trained) == 3
    for rec in steps:
        episodes = rec["rollout/tasks"] * 4  # repeat_times: 4
        assert rec["rollout/ledger_segments"] == episodes  # one trajectory per episode
        assert (rec["rollout/ledger_drift"], rec["rollout/failed_tasks"]) == (0.0, 0.0)
        assert rec["rollout/ledger_calls"] >= episodes
    for rec in trained:
        assert rec["train/experiences"] > 0
