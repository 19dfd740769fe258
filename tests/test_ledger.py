"""The exact-token ledger and chat bridging on small cases checked by hand."""

from __future__ import annotations

import asyncio

import pytest

from tests import chat_templates
from tests.fake_engine import FakeEngine
from trinity.common.experience import ExperienceKind
from trinity.common.rollout import Sample, SamplingParams
from trinity.explorer.bridging import delta_ids
from trinity.explorer.ledger import Intent, SessionLedger, fingerprint
from trinity.explorer.model_client import TaskModelHandle, mask_prompt_truncated
from trinity.explorer.tool_call_policy import apply_malformed_policy
from trinity.trainer.batch import collate


def sample(prompt, completion, lps, finish="stop", version=0):
    return Sample(list(prompt), list(completion), list(lps), finish, version)


# -- the ledger on raw ids ---------------------------------------------------------------------


def test_a_call_extending_held_tokens_merges_with_the_delta_masked():
    led = SessionLedger("s")
    (r1,) = led.record([sample([1, 2, 3], [4, 5], [-0.1, -0.2])], fingerprint="f")
    # prompt = held [1..5] + delta [6, 7]
    (r2,) = led.record([sample([1, 2, 3, 4, 5, 6, 7], [8], [-0.3])], fingerprint="f")
    assert len(led.trajectories) == 1 and r1.trajectory == r2.trajectory == 0
    (e,) = led.extract_experiences(reward=2.0)
    assert e.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and e.prompt_length == 3
    # response positions 4 5 | 6 7 | 8: sampled, delta, sampled
    assert e.action_mask.tolist() == [True, True, False, False, True]
    assert e.logprobs.tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3])
    assert e.kind is ExperienceKind.MULTI_TURN and e.reward == 2.0
    assert e.info["turns"] == [[0, 2, "s/0/0"], [4, 5, "s/1/0"]]
    assert led.stats.segments == 1 and led.stats.bridged == 1 and led.stats.drift == 0


def test_a_prompt_that_does_not_extend_opens_a_counted_segment_never_realigned():
    led = SessionLedger("s")
    (r1,) = led.record([sample([1, 2, 3], [4, 5], [-0.1, -0.2])], fingerprint="f")
    # the same conversation re-tokenised: [4, 5] came back as [45]: not an extension
    led.record(
        [sample([1, 2, 3, 45, 6], [7], [-0.5])],
        fingerprint="f",
        intent=Intent(r1, "reply_mismatch"),
    )
    assert led.stats.segments == 2 and led.stats.drift == 1
    assert led.stats.drift_reasons == {"reply_mismatch": 1}
    first, second = led.extract_experiences(reward=1.0)
    assert second.tokens.tolist() == [1, 2, 3, 45, 6, 7] and second.prompt_length == 5
    assert second.action_mask.tolist() == [True]
    # one episode in two parts: step-wise advantages see it whole
    assert (first.eid.run, first.eid.step) == (0, 0) and (second.eid.run, second.eid.step) == (0, 1)
    assert second.info["opened_by"] == "drift:reply_mismatch"
    # a fresh prompt (no intent to continue) is a segment but no drift
    led.record([sample([9], [10], [-1.0])], fingerprint="f")
    assert led.stats.segments == 3 and led.stats.drift == 1


def test_going_back_to_an_earlier_turn_trains_the_branch_the_agent_continued_only():
    led = SessionLedger("s")
    led.record([sample([1], [2], [-0.2])], fingerprint="f")
    led.record([sample([1, 2, 3], [4], [-0.4])], fingerprint="f")  # extends: tokens 1 2 3 4
    led.record([sample([1, 2, 5], [6], [-0.6])], fingerprint="f")  # goes back to [1, 2]
    assert led.stats.forks == 1 and led.stats.segments == 2 and led.stats.drift == 0
    # the fork holds the shared history (token 2, sampled: mask 1) and is where the episode
    # went on: it alone is trained; the abandoned branch [3, 4] is not, and is counted
    (e,) = led.extract_experiences(reward=1.0)
    assert e.tokens.tolist() == [1, 2, 5, 6] and e.action_mask.tolist() == [True, False, True]
    assert e.logprobs.tolist() == pytest.approx([-0.2, 0.0, -0.6])
    assert (e.eid.run, e.eid.step, e.reward, e.info["opened_by"]) == (0, 0, 1.0, "fork")
    assert led.stats.unchosen == 1 and led.stats.metrics()["ledger_unchosen"] == 1.0


def test_a_mid_session_fork_the_agent_did_not_continue_is_not_trained():
    # turn 0; turn 1 sampled n=3 (the first sample extends the trajectory, the others fork
    # its history); turn 2 continues the third sample: the episode is that path, trained once
    led = SessionLedger("s")
    led.record([sample([1, 2, 3], [4, 5], [-0.1, -0.2])], fingerprint="f")
    turn1 = [1, 2, 3, 4, 5, 6]
    led.record(
        [sample(turn1, [7], [-0.7]), sample(turn1, [8], [-0.8]), sample(turn1, [9], [-0.9])],
        fingerprint="f",
    )
    led.record([sample([*turn1, 9, 10], [11], [-1.1])], fingerprint="f")
    assert (led.stats.forks, led.stats.unchosen) == (2, 2)
    # every branch is the one episode: a mapping keyed by it rewards the path
    (e,) = led.extract_experiences(reward={0: 0.5})
    assert e.tokens.tolist() == [1, 2, 3, 4, 5, 6, 9, 10, 11]
    # response positions 4 5 | 6 | 9 | 10 | 11: turn 0, delta, turn 1's third sample, turn 2
    assert e.action_mask.tolist() == [True, True, False, True, False, True]
    assert (e.eid.run, e.eid.step, e.reward) == (0, 0, 0.5)
    assert [t[2] for t in e.info["turns"]] == ["s/0/0", "s/1/2", "s/2/0"]
    assert {t.episode for t in led.trajectories} == {0}


def test_a_fork_at_the_last_call_trains_its_first_sample():
    # nothing continued any of the n samples: the first is the path (OpenAI's choices[0])
    led = SessionLedger("s")
    led.record([sample([1], [2], [-0.2])], fingerprint="f")
    led.record([sample([1, 2, 3], [4], [-0.4]), sample([1, 2, 3], [5], [-0.5])], fingerprint="f")
    (e,) = led.extract_experiences(reward=1.0)
    assert e.tokens.tolist() == [1, 2, 3, 4] and led.stats.unchosen == 1


def test_a_fork_of_a_drift_part_keeps_the_episode_s_earlier_parts():
    # part 0 [1 -> 2]; drift opens part 1 [7 -> 8], continued [7 8 9 -> 10]; then the agent
    # goes back into part 1 ([7 8 11 -> 12], a fork of it): trained are part 0 and the fork,
    # as parts 0 and 1 of one episode; the abandoned part [7 8 9 10] is left out
    led = SessionLedger("s")
    (r0,) = led.record([sample([1], [2], [-0.2])], fingerprint="f")
    led.record([sample([7], [8], [-0.8])], fingerprint="f", intent=Intent(r0, "history_edit"))
    led.record([sample([7, 8, 9], [10], [-1.0])], fingerprint="f")
    led.record([sample([7, 8, 11], [12], [-1.2])], fingerprint="f")
    assert (led.stats.drift, led.stats.forks, led.stats.unchosen) == (1, 1, 1)
    first, second = led.extract_experiences(reward=1.0)
    assert first.tokens.tolist() == [1, 2] and second.tokens.tolist() == [7, 8, 11, 12]
    assert [(e.eid.run, e.eid.step) for e in (first, second)] == [(0, 0), (0, 1)]


def test_samples_of_one_call_are_episodes_and_versions_and_truncation_are_kept():
    led = SessionLedger("s")
    led.record(
        [sample([1], [2], [-0.2], version=3), sample([1], [7], [-0.7], "length", version=3)],
        fingerprint="f",
    )
    led.record([sample([1, 2, 9], [4], [-0.4], version=4)], fingerprint="f")
    a, b = led.extract_experiences(reward={0: 1.0, 1: 0.0})
    assert (a.reward, b.reward) == (1.0, 0.0) and (a.eid.run, b.eid.run) == (0, 1)
    assert a.model_version == 3 and a.info["model_versions"] == [3, 4]  # the oldest counts
    assert b.truncated and not a.truncated
    with pytest.raises(KeyError, match="no reward given for episode 1"):
        led.extract_experiences(reward={0: 1.0})


def test_a_truncated_prompt_s_stand_in_token_is_not_trained():
    led = SessionLedger("s")
    led.record([sample([1, 2], [3], [0.0], "prompt_truncated")], fingerprint="f")
    (e,) = led.extract_experiences()
    assert e.action_mask.tolist() == [False]
    assert mask_prompt_truncated([e], [[1, 2]]) == 1  # the explorer's masking finds it too


def _two_turns() -> SessionLedger:
    """Turn 0 [4, 5] parses as a call, turn 1 [8] is malformed."""
    led = SessionLedger("s")
    led.record([sample([1, 2, 3], [4, 5], [-0.1, -0.2])], fingerprint="f")
    led.record([sample([1, 2, 3, 4, 5, 6, 7], [8], [-0.3])], fingerprint="f")
    led.note_tool_calls("s/0/0", "ok")
    led.note_tool_calls("s/1/0", "malformed", "tool call 0: bad JSON")
    return led


def test_tool_call_parses_are_kept_per_turn_and_counted():
    led = _two_turns()
    (a,) = led.extract_experiences(reward=1.0)
    assert a.info["turns"] == [[0, 2, "s/0/0"], [4, 5, "s/1/0"]]
    assert a.info["tool_calls"] == ["ok", "malformed"]
    assert a.info["tool_call_errors"] == {"1": "tool call 0: bad JSON"}
    # turn 1 again, continued from turn 0 as a fork holding turn 0's record (and its parse)
    led.record([sample([1, 2, 3, 4, 5, 6, 7], [9, 9], [-0.4, -0.4])], fingerprint="f")
    (b,) = led.extract_experiences(reward=1.0)  # the branch the session went on with
    assert b.info["tool_calls"] == ["ok", None]  # the fork's own turn was not parsed
    assert (led.stats.tool_calls_ok, led.stats.tool_calls_malformed) == (1, 1)
    assert led.stats.merged(led.stats).metrics()["ledger_tool_calls_malformed"] == 2.0
    with pytest.raises(ValueError, match="already parsed"):
        led.note_tool_calls("s/0/0", "ok")
    with pytest.raises(KeyError, match="no record 's/7/0'"):
        led.note_tool_calls("s/7/0", "ok")
    # a ledger no parser read carries no tool-call keys
    plain = SessionLedger("p")
    plain.record([sample([1], [2], [-0.2])], fingerprint="f")
    assert "tool_calls" not in plain.extract_experiences()[0].info


def test_malformed_policy_masks_or_penalizes_exactly_the_malformed_turns():
    # response positions: 4 5 (turn 0, ok) | 6 7 (delta) | 8 (turn 1, malformed)
    led = _two_turns()
    kept = led.extract_experiences(reward=1.0)
    assert apply_malformed_policy(kept, "keep", -1.0) == 0
    assert kept[0].action_mask.tolist() == [True, True, False, False, True]
    masked = led.extract_experiences(reward=1.0)
    assert apply_malformed_policy(masked, "mask", -1.0) == 1
    assert masked[0].action_mask.tolist() == [True, True, False, False, False]
    assert masked[0].reward == 1.0 and masked[0].info["malformed_masked"] == 1
    penalized = led.extract_experiences(reward=1.0)
    assert apply_malformed_policy(penalized, "penalize", -0.25) == 1
    assert [e.reward for e in penalized] == [0.75]
    assert penalized[0].action_mask.tolist() == [True, True, False, False, True]
    with pytest.raises(ValueError, match="gave it no reward"):
        apply_malformed_policy(led.extract_experiences(), "penalize", -1.0)


def test_a_malformed_reply_penalizes_its_whole_episode_once():
    # part 0 holds a malformed reply; drift opens part 1 of the same episode: both rows carry
    # the episode's reward minus the one penalty, so the episode's reward is r - 0.25 whether
    # a baseline reads part 0 or part 1 (not r - 0.25 on one part and r on the other)
    led = _two_turns()
    (r1,) = [r for r in led.records.values() if r.call == 1]
    led.record([sample([1, 2, 3, 9], [10], [-1.0])], fingerprint="f", intent=Intent(r1, "x"))
    rows = led.extract_experiences(reward=1.0)
    assert [(e.eid.run, e.eid.step) for e in rows] == [(0, 0), (0, 1)]
    assert apply_malformed_policy(rows, "penalize", -0.25) == 1
    assert [e.reward for e in rows] == [0.75, 0.75]
    assert [e.info["malformed_penalty"] for e in rows] == [-0.25, -0.25]


def test_logprobs_must_match_the_completion():
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        SessionLedger("s").record([sample([1], [2, 3], [-0.1])], fingerprint="f")


def test_multi_turn_rows_collate_with_their_holes():
    led = SessionLedger("s")
    led.record([sample([1, 2, 3], [4, 5], [-0.1, -0.2])], fingerprint="f")
    led.record([sample([1, 2, 3, 4, 5, 6, 7], [8], [-0.3])], fingerprint="f")
    (e,) = led.extract_experiences(reward=1.0)
    batch = collate([e], pad_id=0)
    # response positions predict tokens 4 5 6 7 8 from positions 2..6
    assert batch.response_pos.tolist() == [[2, 3, 4, 5, 6]]
    assert batch.response_ids.tolist() == [[4, 5, 6, 7, 8]]
    assert batch.response_mask.tolist() == [[True, True, False, False, True]]
    assert batch.rollout_logprobs.tolist()[0] == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3])


# -- chat sessions on a real template ----------------------------------------------------------


def chatml_handle(engine=None, **kw):
    tok = chat_templates.chatml()
    engine = engine or FakeEngine(tok, split_rate=0.0)
    return TaskModelHandle(engine, tok, SamplingParams(n=1), **kw), engine, tok


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_two_turns_by_hand_sampled_ids_kept_and_the_tool_turn_masked():
    handle, engine, tok = chatml_handle()
    eos = tok.eos_token_id
    user = [{"role": "user", "content": "What is 2 + 3?"}]
    engine.plan = [("<think>\nadd them\n</think>\n\ncall calc", "stop")]
    (s1,) = asyncio.run(handle.chat(user))
    p1 = enc(tok, "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert s1.prompt_ids == p1  # the first call is apply_chat_template's, unchanged
    a1 = [*enc(tok, "<think>\nadd them\n</think>\n\ncall calc"), eos]
    assert s1.response_ids == a1
    messages = [*user, {"role": "assistant", "content": handle.decode(s1.response_ids)}]
    messages += [{"role": "tool", "content": "5"}, {"role": "user", "content": "Sure?"}]
    engine.plan = [("the answer is 5", "stop")]
    (s2,) = asyncio.run(handle.chat(messages))
    # the template drops the earlier <think> when rendering history; the prompt keeps what was
    # sampled and appends only the delta (the turn end after the sampled eos, then the new turns)
    delta = enc(
        tok,
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n",
    )
    assert s2.prompt_ids == p1 + a1 + delta
    assert "add them" not in tok.apply_chat_template(messages, tokenize=False)
    a2 = [*enc(tok, "the answer is 5"), eos]
    (e,) = handle.extract_experiences(reward=1.0)
    assert e.tokens.tolist() == p1 + a1 + delta + a2 and e.prompt_length == len(p1)
    assert e.action_mask.tolist() == [1] * len(a1) + [0] * len(delta) + [1] * len(a2)
    assert handle.ledger.stats.bridged == 1 and handle.ledger.stats.segments == 1


def test_a_reply_cut_by_its_budget_gets_the_turn_end_rendered_masked():
    handle, engine, tok = chatml_handle()
    user = [{"role": "user", "content": "q"}]
    engine.plan = [("the answer", "length")]  # no eos sampled
    (s1,) = asyncio.run(handle.chat(user))
    engine.plan = [("5", "stop")]
    messages = [*user, {"role": "assistant", "content": "the answer"}]
    (s2,) = asyncio.run(handle.chat([*messages, {"role": "user", "content": "go on"}]))
    delta = enc(tok, "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")
    assert s2.prompt_ids == s1.prompt_ids + s1.response_ids + delta


def test_a_turn_end_before_the_eos_is_skipped_when_the_eos_was_sampled():
    # Llama-2 style: an assistant turn is rendered `content + ' <|im_end|>'`: a reply that
    # sampled <|im_end|> right after its text continues after the eos, not after a second one
    template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' %}"
        "{{- '[A] ' + m.content + ' <|im_end|>' }}{%- else %}{{- '[U] ' + m.content }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '[A] ' }}{%- endif %}"
    )
    tok = chat_templates.chatml()
    tok.chat_template = template
    eos = tok.eos_token_id
    stopped, _ = delta_ids(tok, [7, eos], True, [{"role": "user", "content": "ok"}])
    assert stopped == enc(tok, "[U] ok[A] ")
    cut, _ = delta_ids(tok, [7], False, [{"role": "user", "content": "ok"}])
    assert cut == enc(tok, " <|im_end|>[U] ok[A] ")


def test_an_edited_reply_is_counted_drift_and_rendered_whole():
    handle, engine, tok = chatml_handle(FakeEngine(chat_templates.chatml(), split_rate=1.0))
    user = [{"role": "user", "content": "What is 2 + 3?"}]
    engine.plan = [("the sum is 5", "stop")]
    asyncio.run(handle.chat(user))
    edited = [*user, {"role": "assistant", "content": "the sum is 6"}]
    engine.plan = [("ok", "stop")]
    (s2,) = asyncio.run(handle.chat([*edited, {"role": "user", "content": "Sure?"}]))
    whole = tok.apply_chat_template(
        [*edited, {"role": "user", "content": "Sure?"}], add_generation_prompt=True, tokenize=False
    )
    assert s2.prompt_ids == enc(tok, whole)
    assert handle.ledger.stats.drift_reasons == {"reply_mismatch": 1}
    assert handle.ledger.stats.segments == 2


def test_a_bound_tool_call_matches_and_an_edited_text_does_not():
    handle, engine, _ = chatml_handle()
    user = [{"role": "user", "content": "q"}]
    engine.plan = [('look\n<tool_call>\n{"name": "calc", "arguments": {"e": 1}}\n</tool_call>', "stop")]  # fmt: skip
    (s1,) = asyncio.run(handle.chat(user))
    handle.bind_reply(s1.info["call_id"], ["call_9"])
    fn = {"name": "calc", "arguments": '{"e": 1}'}
    reply = {"role": "assistant", "content": "look", "tool_calls": [{"id": "call_9", "function": fn}]}  # fmt: skip
    engine.plan = [("fine", "stop")]
    (s2,) = asyncio.run(handle.chat([*user, reply, {"role": "tool", "content": "1"}]))
    assert s2.prompt_ids[: len(s1.prompt_ids) + len(s1.response_ids)] == (
        s1.prompt_ids + s1.response_ids
    )
    assert handle.ledger.stats.bridged == 1
    engine.plan = [("fine", "stop")]
    edited = {**reply, "content": "look again"}
    asyncio.run(handle.chat([*user, edited, {"role": "tool", "content": "1"}]))
    assert handle.ledger.stats.drift_reasons == {"reply_mismatch": 1}


def test_concurrent_continuations_of_equal_replies_take_one_sample_each():
    handle, engine, _ = chatml_handle()
    user = [{"role": "user", "content": "q"}]
    engine.plan = [("same", "stop"), ("same", "stop")]
    first = asyncio.run(handle.chat(user, n=2))
    again = [*user, {"role": "assistant", "content": "same"}, {"role": "user", "content": "u"}]
    engine.plans = [[("next 0", "stop")], [("next 1", "stop")]]

    async def both():  # both calls are prepared before either is answered
        return await asyncio.gather(handle.chat(again), handle.chat(again))

    asyncio.run(both())
    led = handle.ledger
    assert led.stats.segments == 2 and led.stats.forks == 0 and led.stats.bridged == 2
    assert [len(t.records) for t in led.trajectories] == [2, 2]
    assert [handle.episode_of(s) for s in first] == [0, 1]


def test_sessions_keep_their_own_conversations_and_episode_numbers():
    handle, engine, _ = chatml_handle(key=123)
    a, b = handle.session(), handle.session()
    user = [{"role": "user", "content": "q"}]
    for s in (a, b):
        engine.plan = [("same reply", "stop")]
        asyncio.run(s.chat(user))
    assert a.ledger.trajectories[0].episode != b.ledger.trajectories[0].episode
    assert a._key != b._key and a._key is not None
    engine.plan = [("x", "stop")]
    asyncio.run(a.chat([*user, {"role": "assistant", "content": "same reply"},
                        {"role": "user", "content": "again"}]))  # fmt: skip
    assert len(a.ledger.trajectories) == 1 and len(b.ledger.trajectories[0].records) == 1
    assert handle.ledger_stats().calls == 3 and handle.ledger_stats().bridged == 1


def test_generate_with_ids_that_extend_a_trajectory_merges_into_it():
    handle, engine, tok = chatml_handle()
    engine.plan = [("hi", "stop")]
    (s1,) = asyncio.run(handle.chat([{"role": "user", "content": "q"}]))
    engine.plan = [("more", "stop")]
    asyncio.run(handle.generate([*s1.prompt_ids, *s1.response_ids, *enc(tok, "\nnext")]))
    assert len(handle.ledger.trajectories) == 1
    assert [r.how for r in handle.ledger.trajectories[0].records] == ["full", "tokens"]


def test_the_fingerprint_names_tokenizer_template_and_kwargs():
    tok = chat_templates.chatml()
    base = fingerprint(tok)
    assert base == fingerprint(chat_templates.chatml())  # stable across objects
    assert fingerprint(tok, {"enable_thinking": False}) != base
    assert fingerprint(chat_templates.chatml(keep_history=True)) != base
    assert fingerprint(chat_templates.llama3()) != base
    assert len(base) == 16
