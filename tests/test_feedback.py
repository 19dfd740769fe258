"""Serve mode's rewards (`trinity.endpoint.feedback`): each lands exactly once, whatever order,
repetition or lateness it comes in; a session is handed out once, when it is ready."""

from __future__ import annotations

import asyncio
import json
import random

import openai
import pytest
from test_endpoint import USER, ScriptedEngine, Served, post

from trinity.common.rollout import PromptTooLong, SamplingParams
from trinity.endpoint.feedback import FeedbackBook, FeedbackError
from trinity.endpoint.server import EngineSessions
from trinity.endpoint.session_log import SessionLog
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient
from trinity.models import load_tokenizer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_session_is_ready_with_its_reward_or_one_for_every_call_and_handed_out_once():
    book = FeedbackBook(window_s=10)
    book.called("a", "c0")
    book.called("a", "c1")
    book.feedback("a", 0.5, key="k1", call_id="c0")
    book.commit("a")
    assert book.take_ready() == []  # c1 has no reward yet
    book.feedback("a", 0.25, key="k2", turn=1)
    [ready] = book.take_ready()
    assert (ready.session_id, ready.calls, ready.reward, ready.call_rewards) == (
        "a", ["c0", "c1"], None, [0.5, 0.25],
    )  # fmt: skip
    assert book.take_ready() == []
    # a session reward alone makes a session ready, given before any call
    book.feedback("b", 1.0, key="k3")
    book.called("b", "d0")
    book.commit("b")
    assert [r.reward for r in book.take_ready()] == [1.0]


def test_duplicates_are_answered_and_conflicts_refused():
    book = FeedbackBook()
    book.called("a", "c0")
    assert book.feedback("a", 1.0, key="k") is True
    assert book.feedback("a", 1.0, key="k") is False  # the same post again: taken once
    with pytest.raises(FeedbackError, match="another feedback") as e:
        book.feedback("a", 2.0, key="k")  # the same key, another reward
    assert e.value.status == 409
    with pytest.raises(FeedbackError, match="has its reward already"):
        book.feedback("a", 2.0, key="k2")  # a second session reward
    book.feedback("a", 0.1, key="k3", turn=0)
    with pytest.raises(FeedbackError, match="has a reward already"):
        book.feedback("a", 0.2, key="k4", call_id="c0")  # turn 0 is call c0
    with pytest.raises(FeedbackError, match="has no call") as e:
        book.feedback("a", 0.2, key="k5", call_id="nope")
    assert e.value.status == 404
    with pytest.raises(FeedbackError, match="not both"):
        book.feedback("a", 0.2, key="k6", call_id="c0", turn=0)
    assert book.counts["feedback"] == 2 and book.counts["duplicates"] == 1


def test_late_feedback_within_the_window_lands_after_it_the_session_expires():
    clock = Clock()
    book = FeedbackBook(window_s=10, clock=clock)
    for s in ("late", "never"):
        book.called(s, f"{s}-0")
        book.commit(s)
    with pytest.raises(FeedbackError, match="committed"):
        book.called("late", "late-1")  # a committed session takes no more calls
    clock.now = 9.0
    book.feedback("late", 1.0, key="late")
    assert [r.session_id for r in book.take_ready()] == ["late"]
    clock.now = 10.5
    assert book.take_ready() == [] and book.counts["expired"] == 1
    for s, how in (("late", "trained"), ("never", "expired")):
        with pytest.raises(FeedbackError, match=f"was {how} already") as e:
            book.feedback(s, 1.0, key=f"{s}-again")
        assert e.value.status == 410


def test_100_sessions_of_10_calls_shuffled_duplicated_late_feedback_lands_exactly_once(
    tiny_model_dir,
):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    book = FeedbackBook(window_s=3600)
    served = Served(ScriptedEngine(tokenizer), tokenizer, book=book)
    try:
        root = served.url.removesuffix("/v1")
        calls: dict[str, list[str]] = {}
        c = openai.OpenAI(base_url=served.url, api_key="-", max_retries=0)
        for s in range(100):
            sid, head = f"ep-{s}", {"X-Session-Id": f"ep-{s}"}
            calls[sid] = [
                c.chat.completions.create(
                    model="policy", messages=USER, max_tokens=2, extra_headers=head
                ).id
                for _ in range(10)
            ]
        # even sessions: a reward per call (by id or by turn); odd ones: the session's reward
        posts, expected = [], {}
        for s, (sid, ids) in enumerate(calls.items()):
            if s % 2:
                posts.append({"session_id": sid, "reward": float(s), "key": f"{sid}"})
                expected[sid] = (float(s), [None] * 10)
                continue
            rewards = [s + t / 10 for t in range(10)]
            for t, cid in enumerate(ids):
                target = {"call_id": cid} if t % 2 else {"turn": t}
                posts.append({"session_id": sid, "reward": rewards[t], "key": cid, **target})
            expected[sid] = (None, rewards)
        rng = random.Random(0)
        dups = rng.sample(posts, 300)
        commits = [{"commit": sid} for sid in calls]
        stream = posts + dups + commits
        rng.shuffle(stream)  # so about half the feedback comes after its session's commit
        answers = []
        for p in stream:
            if "commit" in p:
                status, _ = post(f"{root}/commit", json.dumps({"session_id": p["commit"]}).encode())
            else:
                status, body = post(f"{root}/feedback", json.dumps(p).encode())
                answers.append(body["duplicate"])
            assert status == 200
        ready = served.run(_take(book))
        assert sorted(r.session_id for r in ready) == sorted(calls)  # each session once
        for r in ready:
            assert r.calls == calls[r.session_id]
            assert (r.reward, r.call_rewards) == expected[r.session_id]
        assert answers.count(True) == 300 and book.counts["feedback"] == len(posts)
        assert served.run(_take(book)) == []
        status, body = post(f"{root}/feedback", json.dumps(posts[0]).encode())
        assert status == 200 and body["duplicate"]  # a repeat of a taken post is still no error
        status, body = post(f"{root}/feedback", json.dumps({**posts[0], "key": "new"}).encode())
        assert status == 410, body  # but new feedback for a trained session is gone
    finally:
        served.close()


async def _take(book: FeedbackBook) -> list:
    return book.take_ready()  # on the server's loop, as the serve loop calls it


def _rewarded(book: FeedbackBook, sid: str, reward: float = 1.0) -> None:
    book.called(sid, f"{sid}-c0")
    book.feedback(sid, reward, key=f"{sid}-r")


def test_a_group_is_handed_out_whole_once_all_its_sessions_are_ready():
    book = FeedbackBook(window_s=10)
    for sid in ("g1", "g2", "g3", "solo"):
        _rewarded(book, sid)
    book.commit("g2", "q7", 3)
    book.commit("g1", "q7", 3)
    book.commit("solo")
    # the solo session goes; the group waits for its third member, however many polls pass
    assert [r.session_id for r in book.take_ready()] == ["solo"]
    assert book.take_ready() == []
    book.commit("g3", "q7", 3)
    book.commit("g3", "q7", 3)  # a repeated commit is answered as the first
    got = book.take_ready()
    assert [(r.session_id, r.group) for r in got] == [("g2", "q7"), ("g1", "q7"), ("g3", "q7")]
    assert book.counts["groups_ready"] == 1 and book.take_ready() == []
    # a member not yet rewarded holds the whole group back
    for sid in ("h1", "h2"):
        book.called(sid, f"{sid}-c0")
        book.commit(sid, "q8", 2)
    book.feedback("h1", 0.0, key="h1-r")
    assert book.take_ready() == []
    book.feedback("h2", 1.0, key="h2-r")
    assert [r.session_id for r in book.take_ready()] == ["h1", "h2"]


def test_a_group_needs_its_size_and_refuses_what_would_break_it():
    book = FeedbackBook(window_s=10)
    for sid in ("a", "b", "c", "d"):
        _rewarded(book, sid)
    with pytest.raises(FeedbackError, match="group and group_size together") as e:
        book.commit("a", "q1")
    assert e.value.status == 400
    with pytest.raises(FeedbackError, match="group and group_size together"):
        book.commit("a", None, 2)
    book.commit("a", "q1", 2)
    with pytest.raises(FeedbackError, match="has group_size 2; this commit says 3") as e:
        book.commit("b", "q1", 3)
    assert e.value.status == 409
    book.commit("b", "q1", 2)
    with pytest.raises(FeedbackError, match="has its 2 sessions already"):
        book.commit("c", "q1", 2)
    with pytest.raises(FeedbackError, match="committed to another group"):
        book.commit("a", "q2", 2)
    assert [r.session_id for r in book.take_ready()] == ["a", "b"]
    book.commit("c", "q1", 2)  # the name again: a new group, after the first went whole
    book.commit("d", "q1", 2)
    assert [r.session_id for r in book.take_ready()] == ["c", "d"]


def test_a_group_not_whole_within_the_window_expires_whole():
    clock = Clock()
    book = FeedbackBook(window_s=10, clock=clock)
    for sid in ("a", "b"):
        _rewarded(book, sid)
    book.commit("a", "q", 3)
    clock.now = 5
    book.commit("b", "q", 3)
    clock.now = 10.5  # past the window from the group's first commit
    assert book.take_ready() == []
    assert book.counts["expired_groups"] == 1 and book.counts["expired"] == 2
    with pytest.raises(FeedbackError) as e:
        book.feedback("b", 1.0, key="late")
    assert e.value.status == 410


def test_what_is_remembered_of_finished_sessions_is_let_go_after_the_retention():
    """A long-running endpoint's memory of done sessions and used keys does not grow forever:
    within the retention a late post is still a 410 or a duplicate; after it, it is forgotten."""
    clock = Clock()
    book = FeedbackBook(window_s=10, clock=clock, retention_s=100)
    for i in range(50):
        _rewarded(book, f"s{i}")
        book.commit(f"s{i}")
    assert len(book.take_ready()) == 50 and len(book.done) == len(book.keys) == 50
    clock.now = 99
    assert book.feedback("s0", 1.0, key="s0-r") is False  # a duplicate, still remembered
    with pytest.raises(FeedbackError):
        book.feedback("s0", 1.0, key="other")
    clock.now = 101
    book.take_ready()
    assert book.done == {} and book.keys == {}


def test_sessions_whose_every_call_failed_are_let_go_once_idle(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    sessions = EngineSessions(
        BatchingClient([InProcess(ScriptedEngine(tokenizer))]), tokenizer,
        SamplingParams(max_tokens=4), "policy", max_prompt_tokens=3,
    )  # fmt: skip

    async def main() -> None:
        with pytest.raises(PromptTooLong):
            await sessions.handle("failed").chat(USER * 5, refuse_over_long=True)
        await sessions.handle("ok").generate([1, 2])

    asyncio.run(main())
    assert sessions.drop_unused(idle_s=3600) == []  # not idle long enough
    sessions.used_at["failed"] -= 7200
    sessions.used_at["ok"] -= 7200
    assert sessions.drop_unused(idle_s=3600) == ["failed"]  # "ok" recorded a call: the book's
    assert set(sessions.sessions) == {"ok"}


def _reopened(path, written_through: int) -> FeedbackBook:
    """The book of a serve process started again over the log at `path` (the one before it was
    killed: its log is dropped, never closed), the buffer holding its steps to `written_through`."""
    return FeedbackBook(
        window_s=10, log=SessionLog(path), freeze=_frozen, written_through=written_through
    )


def _frozen(sid: str) -> dict:
    return {"rows": [sid]}  # what ServeMode freezes: the session's trajectories at its commit


def test_what_was_acknowledged_survives_a_kill_and_is_written_exactly_once(tmp_path):
    """Everything a post was answered 200 for is on disk first. A process started again over
    the log takes up committed sessions (their calls, frozen rows and rewards), partial groups
    and feedback keys; it answers 410 only for sessions its predecessor held open (their calls
    were in its memory). A serve step the kill interrupted is settled by the buffer's cursor:
    handed out again when the buffer does not hold it, never when it does."""
    path = tmp_path / "serve.db"
    book = FeedbackBook(window_s=10, log=SessionLog(path), freeze=_frozen)
    book.called("open", "open-c0")
    book.feedback("open", 1.0, key="open-r")  # taken, but the session is never committed
    for sid in ("written", "w2", "fb", "g1", "g2"):
        book.called(sid, f"{sid}-c0")
    book.called("fb", "fb-c1")
    book.feedback("written", 1.0, key="written-r")
    book.commit("written")
    assert [r.session_id for r in book.take_ready()] == ["written"]
    book.writing(["written"], 1)
    book.written(["written"])  # serve step 1: in the buffer, on disk as trained
    book.feedback("w2", 0.5, key="w2-r")
    book.commit("w2")
    assert [r.session_id for r in book.take_ready()] == ["w2"]
    book.writing(["w2"], 2)  # killed here: the buffer never gets step 2
    book.feedback("fb", 0.25, key="fb-c0", call_id="fb-c0")
    book.commit("fb")  # ready once its second call has a reward
    book.feedback("g1", 0.0, key="g1-r")
    book.commit("g1", "q", 3)
    book.commit("g2", "q", 3)  # rewarded after the restart

    again = _reopened(path, written_through=1)
    assert again.counts["lost"] == 1 and again.counts["restored"] == 4
    with pytest.raises(FeedbackError, match="held by a serve process that ended") as e:
        again.commit("open")
    assert e.value.status == 410
    with pytest.raises(FeedbackError, match="held by a serve process that ended"):
        again.feedback("open", 1.0, key="open-r")  # its feedback went with it
    with pytest.raises(FeedbackError, match="was trained already"):
        again.feedback("written", 1.0, key="written-late")
    assert again.feedback("written", 1.0, key="written-r") is False  # a retry: a duplicate
    assert again.feedback("fb", 0.25, key="fb-c0", call_id="fb-c0") is False
    with pytest.raises(FeedbackError, match="another feedback"):
        again.feedback("fb", 0.5, key="fb-c0", call_id="fb-c0")
    with pytest.raises(FeedbackError, match="has group_size 3"):
        again.commit("late", "q", 2)
    again.commit("g1", "q", 3)  # a retried commit is answered as the first
    # the step the buffer never got is handed out again, first, frozen rows and rewards intact
    [w2] = again.take_ready()
    assert (w2.session_id, w2.reward, w2.frozen) == ("w2", 0.5, {"rows": ["w2"]})
    again.feedback("fb", 0.75, key="fb-t1", turn=1)
    again.feedback("g2", 1.0, key="g2-r")
    again.called("g3", "g3-c0")
    again.feedback("g3", 1.0, key="g3-r")
    again.commit("g3", "q", 3)
    got = again.take_ready()
    assert [(r.session_id, r.group) for r in got] == [
        ("fb", None), ("g1", "q"), ("g2", "q"), ("g3", "q"),
    ]  # fmt: skip
    assert got[0].call_rewards == [0.25, 0.75] and got[0].frozen == {"rows": ["fb"]}
    again.writing(["w2"], 2)  # killed again, after the buffer took step 2 this time

    third = _reopened(path, written_through=2)
    assert third.counts["restored"] == 4  # fb and q, handed out but never written
    assert [r.session_id for r in third.take_ready()] == ["fb", "g1", "g2", "g3"]
    third.writing(["fb", "g1", "g2", "g3"], 3)
    third.written(["fb", "g1", "g2", "g3"])
    third.commit("w2")  # trained: a repeated commit is still answered as the first
    with pytest.raises(FeedbackError, match="was trained already"):
        third.feedback("w2", 1.0, key="w2-late")
    assert third.take_ready() == []
    assert _reopened(path, written_through=3).take_ready() == []  # each written exactly once
