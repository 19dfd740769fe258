"""The exactness bar of the ledger + bridged prompting, without Ray.

Generated multi-turn tool conversations run through `TaskModelHandle.chat` against a fake engine
that writes its replies as non-canonical token splits (`tests/fake_engine.py`), over two chat
templates built offline (`tests/chat_templates.py`): a ChatML one that drops earlier `<think>`
blocks when rendering history, and a Llama-3-style one. Drift is injected on purpose (a reply
edited before it is sent back, an earlier tool result or user turn edited). Checked:

- every call: the ids the engine received, the ids it sampled and their logprobs are exactly in
  the trajectory holding the call (100% of calls, counted and printed);
- every trajectory: mask 1 on sampled ids only, logprob 0 elsewhere; its text equals the
  template's rendering of the conversation with every reply as sampled (an oracle template that
  keeps history verbatim): so each delta is right, and nothing earlier was re-rendered;
- counts: every injected drift opens one counted segment (drift, or a fork when the edited
  prompt happens to extend an earlier record exactly), and nothing else does.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests import chat_templates
from tests.fake_engine import FakeEngine
from trinity.common.rollout import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.explorer.template_check import TOOLS

WORDS = chat_templates.WORDS


def render(tok: Any, messages: list[dict], gen: bool = True) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=gen, tokenize=False)


def raw_text(tok: Any, ids: list[int], finish: str) -> str:
    """A completion's text as sampled, without the eos it stopped on."""
    return tok.decode(ids[:-1] if finish == "stop" else ids, skip_special_tokens=False)


@dataclass
class Segment:
    """What one segment's text must be: `open_text` (the template's rendering of the messages
    that opened it) + the oracle's rendering of what followed + the last reply as sampled."""

    open_text: str
    open_oracle: list[dict]
    oracle: list[dict]  # the conversation so far, every reply as sampled
    last: Any = None  # the last sample


@dataclass
class Tally:
    conversations: int = 0
    calls: int = 0
    exact_calls: int = 0
    injected: int = 0
    first_samples: int = 0
    checked_segments: int = 0
    handles: list[TaskModelHandle] = field(default_factory=list)


def words(rng: random.Random, lo: int = 2, hi: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def plan_reply(rng: random.Random, a: int, b: int, last: bool) -> tuple[str, str, dict | None]:
    """(text, finish reason, tool call or None) of the model's next reply."""
    think = f"<think>\n{words(rng)}\n</think>\n\n" if rng.random() < 0.4 else ""
    finish = "length" if rng.random() < 0.1 else "stop"
    if not last and rng.random() < 0.6:
        spaced = rng.random() < 0.5  # odd spacing a template's tojson would rewrite
        args = f'{{"expression":  "{a}+{b}"}}' if spaced else json.dumps({"expression": f"{a}+{b}"})
        call = f'{{"name": "calc", "arguments": {args}}}'
        return (
            f"{think}{words(rng)}\n<tool_call>\n{call}\n</tool_call>",
            finish,
            {"arguments": args},
        )
    return f"{think}{words(rng)} the answer is {a + b}", finish, None


async def conversation(
    handle: TaskModelHandle,
    engine: FakeEngine,
    real: Any,
    oracle_tok: Any,
    rng: random.Random,
    tally: Tally,
    branches: int,
) -> None:
    """One generated conversation (with `branches` samples of its first call, each continued)."""
    tok = handle.tokenizer
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    first: list[dict] = []
    if rng.random() < 0.5:
        first.append({"role": "system", "content": "You are a careful calculator agent."})
    first.append({"role": "user", "content": f"What is {a} + {b}? Use the tool if needed."})
    turns = rng.randint(2, 6)
    plans = [plan_reply(rng, a, b, turns == 1) for _ in range(branches)]
    engine.plan = [(t, f) for t, f, _ in plans]
    samples = await handle.chat([dict(m) for m in first], tools=TOOLS, n=branches)
    tally.calls += 1
    tally.first_samples += branches
    state = []
    for s, p in zip(samples, plans, strict=True):
        seg = Segment(render(real, first), [dict(m) for m in first], [dict(m) for m in first], s)
        state.append(([dict(m) for m in first], seg, p))
    for turn in range(1, turns):
        for i, (messages, seg, (_, _, call)) in enumerate(state):
            s = seg.last
            # drift, on purpose (below): the segment so far is complete, check it first
            drift = rng.random() < 0.12
            if drift:
                check_segment(handle, seg, tok, oracle_tok, tally)
            # the reply goes back as text, or (tool calls, half the time) as parsed tool_calls
            if call is not None and rng.random() < 0.5:
                cid = f"call_{turn}_{i}"
                content = handle.decode(s.response_ids).split("<tool_call>")[0].strip()
                fn = {"name": "calc", "arguments": call["arguments"]}
                reply = {"role": "assistant", "content": content,
                         "tool_calls": [{"id": cid, "type": "function", "function": fn}]}  # fmt: skip
                handle.bind_reply(s.info["call_id"], [cid])
            else:
                reply = {"role": "assistant", "content": handle.decode(s.response_ids)}
            messages.append(reply)
            seg.oracle.append(
                {"role": "assistant", "content": raw_text(tok, s.response_ids, s.finish_reason)}
            )
            new = []
            if call is not None:
                new += [{"role": "tool", "content": f"result {a + b + k}"} for k in range(rng.randint(1, 2))]  # fmt: skip
            if call is None or rng.random() < 0.5:
                new.append({"role": "user", "content": f"Check it again, step {turn}."})
            messages += new
            seg.oracle += new
            if drift:  # the reply edited, or an earlier tool/user turn edited
                tally.injected += 1
                editable = [
                    j for j, m in enumerate(messages[: -1 - len(new)])
                    if m["role"] in ("tool", "user") and j > len(first) - 1
                ]  # fmt: skip
                if editable and rng.random() < 0.5:
                    j = rng.choice(editable)
                else:
                    j = len(messages) - 1 - len(new)  # the reply just sampled
                messages[j] = {**messages[j], "content": (messages[j]["content"] or "") + " edited"}
                seg = Segment(render(real, messages), [dict(m) for m in messages],
                              [dict(m) for m in messages], s)  # fmt: skip
            if rng.random() < 0.05:
                engine.model_version += 1  # weights updated mid-episode
            plan = plan_reply(rng, a, b, turn == turns - 1)
            engine.plan = [plan[:2]]
            (s,) = await handle.chat([dict(m) for m in messages], tools=TOOLS, n=1)
            tally.calls += 1
            seg.last = s
            state[i] = (messages, seg, plan)
    for _, seg, _ in state:
        check_segment(handle, seg, tok, oracle_tok, tally)


def check_segment(handle: TaskModelHandle, seg: Segment, tok: Any, oracle_tok: Any, tally: Tally):
    """The trajectory of the segment's last sample reads as the oracle says (module doc);
    `oracle_tok` None: not checked (a template bridged whole opens segments of its own)."""
    if oracle_tok is None:
        return
    rec = handle.ledger.records[seg.last.info["call_id"]]
    traj = handle.ledger.trajectories[rec.trajectory]
    assert len(traj.tokens) == rec.end  # the last sample is its trajectory's tip
    opened, now = render(oracle_tok, seg.open_oracle), render(oracle_tok, seg.oracle)
    assert now.startswith(opened)
    s = seg.last
    eos = tok.eos_token if s.finish_reason == "stop" else ""
    expected = seg.open_text + now[len(opened) :] + raw_text(tok, s.response_ids, s.finish_reason)
    assert tok.decode(traj.tokens, skip_special_tokens=False) == expected + eos
    tally.checked_segments += 1


def check_calls(handle: TaskModelHandle, calls: list, tally: Tally) -> None:
    """Every sample of every engine call sits exactly in its trajectory (ids and logprobs)."""
    ledger = handle.ledger
    for prompt, samples in calls:
        exact = True
        for s in samples:
            rec = ledger.records[s.info["call_id"]]
            traj = ledger.trajectories[rec.trajectory]
            p, end = len(prompt), rec.end
            exact &= traj.tokens[:p] == prompt and traj.tokens[p:end] == s.response_ids
            exact &= traj.logprobs[p:end] == s.logprobs and all(traj.sampled[p:end])
            exact &= rec.prompt_ids == tuple(prompt) and rec.completion_ids == tuple(s.response_ids)
            exact &= rec.model_version == s.model_version and rec.finish_reason == s.finish_reason
        tally.exact_calls += exact
    # mask 1 exactly on the completions of a trajectory's records; logprob 0 everywhere else
    for traj in ledger.trajectories:
        spans = {k for r in traj.records for k in range(len(r.prompt_ids), r.end)}
        assert {k for k, m in enumerate(traj.sampled) if m} == spans
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.sampled, strict=True) if not m)
    # the experiences are the trained trajectories (fork branches left behind are not), as held
    trained = sorted(t.index for path in ledger.trained_paths() for t in path)
    assert len(ledger.trajectories) - len(trained) == ledger.stats.unchosen
    exps = ledger.extract_experiences(reward=1.0)
    for traj, exp in zip([ledger.trajectories[i] for i in trained], exps, strict=True):
        p = traj.prompt_length
        assert exp.tokens.tolist() == traj.tokens and exp.prompt_length == p
        assert exp.action_mask.tolist() == traj.sampled[p:]
        assert exp.logprobs.tolist() == pytest.approx(traj.logprobs[p:], abs=1e-6)
        assert exp.model_version == min(r.model_version for r in traj.records)


def run_conversations(real: Any, oracle_tok: Any, n: int, seed: int) -> tuple[Tally, FakeEngine]:
    rng = random.Random(seed)
    engine = FakeEngine(real, seed=seed)
    tally = Tally()

    async def main() -> None:
        for c in range(n):
            handle = TaskModelHandle(engine, real, SamplingParams(n=1), name=f"c{c}")
            before = len(engine.calls)
            branches = 2 if rng.random() < 0.2 else 1
            await conversation(handle, engine, real, oracle_tok, rng, tally, branches)
            check_calls(handle, engine.calls[before:], tally)
            tally.handles.append(handle)
            tally.conversations += 1

    asyncio.run(main())
    return tally, engine


@pytest.mark.parametrize("template", ["chatml_drops_think", "llama3"])
def test_stored_tokens_are_the_sampled_ones_and_every_drift_is_a_counted_segment(template):
    if template == "llama3":
        real = oracle = chat_templates.llama3()  # append-only: its own oracle
    else:
        real, oracle = chat_templates.chatml(), chat_templates.chatml(keep_history=True)
    tally, engine = run_conversations(real, oracle, n=120, seed=7 if template == "llama3" else 11)
    stats = [h.ledger.stats for h in tally.handles]
    segments = sum(s.segments for s in stats)
    drift, forks = sum(s.drift for s in stats), sum(s.forks for s in stats)
    print(
        f"\n{template}: {tally.conversations} conversations, {tally.calls} calls, "
        f"{tally.exact_calls} exact ({100 * tally.exact_calls / tally.calls:.1f}%), "
        f"{engine.non_canonical} non-canonical completions, {tally.injected} drifts injected "
        f"-> {drift} drift + {forks} forks, {segments} segments, "
        f"{tally.checked_segments} segment texts checked"
    )
    assert tally.conversations == 120
    assert tally.exact_calls == tally.calls  # 100%
    assert engine.non_canonical > tally.calls // 4  # the splits really are non-canonical
    assert tally.injected > 20
    # every injected drift opened exactly one counted segment; nothing else opened one
    assert segments == tally.first_samples + tally.injected
    assert drift + forks == tally.injected
    assert drift > 0
    # every other continuation was bridged: held tokens + delta, merged
    records = sum(s.samples for s in stats)
    assert sum(s.bridged for s in stats) == records - (segments - forks)
    hows = {r.how for h in tally.handles for r in h.ledger.records.values()}
    assert hows == {"full", "delta"}


def test_a_template_unsafe_to_cut_is_bridged_whole_and_stays_exact():
    # user turns numbered by position: the check picks `full`; every continuation is rendered
    # whole and merges only when its ids happen to extend the held ones (canonical replies)
    real = chat_templates.turn_counter()
    tally, _ = run_conversations(real, None, n=30, seed=3)
    stats = [h.ledger.stats for h in tally.handles]
    assert tally.exact_calls == tally.calls
    segments, forks = sum(s.segments for s in stats), sum(s.forks for s in stats)
    drift = sum(s.drift for s in stats)
    assert segments - forks == tally.first_samples + drift
    assert sum(s.drift_reasons.get("bridging_full", 0) for s in stats) > 0
    assert {r.how for h in tally.handles for r in h.ledger.records.values()} == {"full"}
