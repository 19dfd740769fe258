"""Rewards for served sessions, each landing exactly once, and when a session is ready to train.

An external agent calls the endpoint in a session, then says how it went:

    POST /feedback {"session_id": "ep-7", "reward": 1.0, "key": "ep-7/final"}
    POST /feedback {"session_id": "ep-7", "call_id": "chatcmpl-…", "reward": 0.5, "key": "…"}
    POST /feedback {"session_id": "ep-7", "turn": 2, "reward": 0.5, "key": "…"}
    POST /commit   {"session_id": "ep-7"}

A reward is for the whole session (the episode's), for one call (by the `id` of its response), or
for the call at `turn` (0-based, in the order the session's calls were answered). `key` makes a
post idempotent: the same key with the same content is answered again without counting twice;
the same key with other content is a conflict. Two rewards for the same target are a conflict.
Feedback may come before the calls it names, and after `/commit`.

A committed session is ready when it has its session reward, or a reward for every one of its
calls. It is handed out (`take_ready`) exactly once. A session not ready `window_s` seconds after
its commit (or after its last activity, uncommitted) expires: counted, never trained. Feedback for
a session handed out or expired is refused (`Gone`), so nothing lands twice or in limbo.

Sessions committed with a `group` (and its `group_size`, which every member's commit must
agree on) are handed out together, once all `group_size` of them are committed and ready, so a
GRPO group reaches the buffer whole; a group not whole and ready `window_s` seconds after its
first commit expires whole (`expired_groups`), and a commit past its size is refused (409).

What a long-running endpoint remembers of sessions it is done with (to answer their late
feedback 410, a repeated key as a duplicate) is kept `retention_s` seconds (a day by default),
then let go: feedback that late starts a session of its own, which has no calls and expires.

With a `SessionLog` (serve mode's), everything a post is answered 200 for is on disk first: the
sessions seen, every feedback, every commit with the session's trajectories as they will be
written (`freeze`, taken at the commit: a committed session takes no calls). A serve process
started again takes up the committed sessions and groups not yet written, their feedback and
keys, and goes on as the killed one would have (`restored` counts them); it answers 410 for a
session the process before it held open (its calls were in that process's memory: `lost`), and
for late feedback to sessions that ended before the restart. A session handed out is on disk
as being written in a serve step (`writing`) until the buffer holds it (`written`); the process
started again settles a step the kill interrupted by the buffer's cursor (`endpoint.session_log`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity.endpoint.session_log import Commit, Post

if TYPE_CHECKING:
    from trinity.endpoint.session_log import SessionLog


class FeedbackError(ValueError):
    """A post that cannot be taken: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SessionBook:
    """What is known of one session."""

    calls: list[str] = field(default_factory=list)  # response ids, in answer order
    records: list[list[str]] = field(default_factory=list)  # each call's ledger records
    reward: float | None = None  # the session's own
    call_rewards: dict[str, float] = field(default_factory=dict)  # by response id
    turn_rewards: dict[int, float] = field(default_factory=dict)  # by turn, until the call is seen
    committed_at: float | None = None
    touched_at: float = 0.0
    group: str | None = None
    frozen: Any = None  # what is written of it, taken at its commit (`FeedbackBook.freeze`)

    def rewards_by_call(self) -> list[float | None]:
        """The reward of each call, in order (a turn's reward once its call exists)."""
        return [
            self.call_rewards.get(cid, self.turn_rewards.get(i)) for i, cid in enumerate(self.calls)
        ]

    def ready(self) -> bool:
        if self.committed_at is None or not self.calls:
            return False
        return self.reward is not None or all(r is not None for r in self.rewards_by_call())


@dataclass(frozen=True)
class ReadySession:
    session_id: str
    calls: list[str]
    reward: float | None
    call_rewards: list[float | None]
    records: list[list[str]] = field(default_factory=list)  # each call's ledger record ids
    group: str | None = None  # sessions committed with one group are one GRPO group
    frozen: Any = None  # what is written of it, taken at its commit (`FeedbackBook.freeze`)

    def record_rewards(self) -> dict[str, float]:
        """Each ledger record's reward: its call's, when calls were rewarded one by one."""
        out: dict[str, float] = {}
        for reward, records in zip(self.call_rewards, self.records, strict=False):
            for rid in records:
                out[rid] = 0.0 if reward is None else reward
        return out


@dataclass
class Group:
    """A group's size, its members so far (in commit order) and its first commit's time."""

    size: int
    members: list[str]
    first_commit_at: float


class FeedbackBook:
    """The sessions of one endpoint and their rewards (see the module doc). Not thread-safe:
    the endpoint calls it from its event loop only."""

    def __init__(
        self,
        window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        retention_s: float = 86400.0,
        log: SessionLog | None = None,
        freeze: Callable[[str], Any] | None = None,
        written_through: int = 0,
    ) -> None:
        """`log`: where what the book answered for is kept across restarts (module doc); the
        sessions an earlier process left open are lost, answered 410 from now on (`lost`
        counts them), its committed ones are taken up (`restored`). `freeze(session_id)`: what
        is written of a session (JSON-able), taken when it is committed and handed out with it
        (`ReadySession.frozen`). `written_through`: the last serve step the buffer holds for
        this endpoint (its cursor), which settles a write the kill interrupted."""
        self.window_s, self.clock, self.retention_s = window_s, clock, retention_s
        self.log, self.freeze = log, freeze
        self._log_forgot_at = float("-inf")  # when the log last forgot (the book's clock)
        self.sessions: dict[str, SessionBook] = {}
        self.done: dict[str, str] = {}  # session id -> "trained" | "expired" | "lost"
        self.keys: dict[str, tuple] = {}  # idempotency key -> the post it took
        self._done_at: dict[str, float] = {}  # when each of `done` was (insertion order)
        self._key_at: dict[str, float] = {}  # when each of `keys` was taken (insertion order)
        self.groups: dict[str, Group] = {}  # open groups, by name
        self._again: list[ReadySession] = []  # handed out by a killed process, never written
        self.counts = {
            "feedback": 0, "duplicates": 0, "committed": 0, "ready": 0, "expired": 0,
            "groups_ready": 0, "expired_groups": 0, "lost": 0, "restored": 0,
        }  # fmt: skip
        if log is not None:
            self._restore(log, written_through)

    def _restore(self, log: SessionLog, written_through: int) -> None:
        """Take up what an earlier process of the endpoint left in `log` (module doc)."""
        self.counts["lost"] = log.start(written_through)
        now, wall = self.clock(), time.time()
        for sid, how in log.ended().items():
            self.done[sid], self._done_at[sid] = how, now
        posts: dict[str, list[Post]] = {}
        for p in log.posts():
            self.keys[p.key], self._key_at[p.key] = (p.session_id, p.reward, p.call_id, p.turn), now
            posts.setdefault(p.session_id, []).append(p)
        for c in log.commits():
            at = now - max(0.0, wall - c.at)  # its commit, on this process's clock
            book = SessionBook(list(c.calls), [list(r) for r in c.records], committed_at=at,
                               touched_at=now, group=c.group, frozen=c.frozen)  # fmt: skip
            for p in posts.get(c.session_id, []):
                _set_reward(book, p.reward, p.call_id, p.turn)
            self.counts["restored"] += 1
            if c.step is not None:  # handed out, its write never reached the buffer: again
                self._again.append(_ready(c.session_id, book))
                self.done[c.session_id], self._done_at[c.session_id] = "trained", now
                continue
            self.sessions[c.session_id] = book
            if c.group is not None:
                assert c.group_size is not None
                g = self.groups.setdefault(c.group, Group(c.group_size, [], at))
                g.members.append(c.session_id)

    def _open(self, session_id: str) -> SessionBook:
        if session_id in self.done:
            raise self._gone(session_id)
        book = self.sessions.get(session_id)
        if book is None:
            if self.log is not None:  # on disk first: a failed write leaves no session behind
                self.log.opened(session_id)
            book = self.sessions[session_id] = SessionBook()
        book.touched_at = self.clock()
        return book

    def _gone(self, session_id: str) -> FeedbackError:
        how = self.done[session_id]
        if how == "lost":
            return FeedbackError(
                410,
                f"session {session_id!r} was held by a serve process that ended before the "
                "session was committed (its calls were in that process's memory): nothing of "
                "it is trained; run the episode again in a new session",
            )
        return FeedbackError(410, f"session {session_id!r} was {how} already")

    def called(self, session_id: str, call_id: str, records: list[str] | None = None) -> None:
        """A call of the session was answered with response id `call_id`; `records`: the ids
        of the ledger records its samples made."""
        book = self._open(session_id)
        if book.committed_at is not None:
            raise FeedbackError(409, f"session {session_id!r} is committed: it takes no calls")
        book.calls.append(call_id)
        book.records.append(list(records or []))

    def is_open(self, session_id: str) -> bool:
        """Does the session still take calls (not committed, trained, expired nor lost)?"""
        book = self.sessions.get(session_id)
        return session_id not in self.done and (book is None or book.committed_at is None)

    def check_open(self, session_id: str) -> None:
        """Raise if the session may take no more calls (committed, trained, expired or lost)."""
        if self.done.get(session_id) == "lost":
            raise self._gone(session_id)
        if session_id in self.done or self.sessions.get(session_id, SessionBook()).committed_at:
            raise FeedbackError(409, f"session {session_id!r} is committed: it takes no calls")

    def feedback(
        self,
        session_id: str,
        reward: float,
        key: str,
        call_id: str | None = None,
        turn: int | None = None,
    ) -> bool:
        """Take a reward (on disk first, with a log); False if `key` was taken before with
        the same content."""
        if call_id is not None and turn is not None:
            raise FeedbackError(400, "give call_id or turn, not both")
        post = (session_id, reward, call_id, turn)
        if key in self.keys:
            if self.keys[key] != post:
                raise FeedbackError(409, f"key {key!r} was used for another feedback")
            self.counts["duplicates"] += 1
            return False
        book = self._open(session_id)
        if call_id is not None:
            if call_id not in book.calls:  # its id comes with its answer: it must be known
                raise FeedbackError(404, f"session {session_id!r} has no call {call_id!r}")
            if call_id in book.call_rewards or book.calls.index(call_id) in book.turn_rewards:
                raise FeedbackError(409, f"call {call_id!r} of {session_id!r} has a reward already")
        elif turn is not None:
            if turn < 0:
                raise FeedbackError(400, "turn must be >= 0")
            taken = turn in book.turn_rewards or (
                turn < len(book.calls) and book.calls[turn] in book.call_rewards
            )
            if taken:
                raise FeedbackError(409, f"turn {turn} of {session_id!r} has a reward already")
        elif book.reward is not None:
            raise FeedbackError(409, f"session {session_id!r} has its reward already")
        if self.log is not None:
            self.log.feedback(Post(key, session_id, reward, call_id, turn))
        _set_reward(book, reward, call_id, turn)
        self.keys[key] = post
        self._key_at[key] = self.clock()
        self.counts["feedback"] += 1
        return True

    def commit(
        self, session_id: str, group: str | None = None, group_size: int | None = None
    ) -> None:
        """The session is over (on disk first, with what is written of it: `freeze`); a
        second commit is answered as the first, also once the session was handed out. `group`:
        sessions committed with the same group are trained as one group (GRPO compares them),
        once all `group_size` of them are ready (module doc)."""
        if (group is None) != (group_size is None):
            raise FeedbackError(
                400,
                "give group and group_size together: the group's size says when it is whole "
                "(a GRPO group trained in pieces compares nothing)",
            )
        if self.done.get(session_id) == "trained":
            return  # its commit was answered; the repeat (a client's retry) is too
        book = self._open(session_id)
        if book.committed_at is not None:
            if book.group != group:
                raise FeedbackError(409, f"session {session_id!r} was committed to another group")
            return
        g = self.groups.get(group) if group is not None else None
        if g is not None and g.size != group_size:
            raise FeedbackError(
                409, f"group {group!r} has group_size {g.size}; this commit says {group_size}"
            )
        if g is not None and len(g.members) >= g.size:
            raise FeedbackError(409, f"group {group!r} has its {g.size} sessions already")
        frozen = self.freeze(session_id) if self.freeze is not None else None
        if self.log is not None:
            commit = Commit(session_id, group, group_size, book.calls, book.records, frozen)
            self.log.committed(commit)
        book.committed_at, book.group, book.frozen = self.clock(), group, frozen
        if group is not None:
            assert group_size is not None
            g = self.groups.setdefault(group, Group(group_size, [], book.committed_at))
            g.members.append(session_id)
        self.counts["committed"] += 1

    def take_ready(self) -> list[ReadySession]:
        """Sessions ready to train, each once (a group's all at once, in commit order); expire
        those past the window. First, those an earlier process handed out and never wrote."""
        now, out = self.clock(), self._again
        self._again = []
        self._forget(now - self.retention_s)
        for sid, book in list(self.sessions.items()):
            if book.group is not None or sid not in self.sessions:
                continue  # a group's member: with its group, below
            if book.ready():
                out.append(self._hand_out(sid, book))
            elif now - (book.committed_at or book.touched_at) > self.window_s:
                self._close(sid, "expired", "expired")
        for name, g in list(self.groups.items()):
            books = [self.sessions[s] for s in g.members]
            if len(books) == g.size and all(b.ready() for b in books):
                out += [self._hand_out(s, b) for s, b in zip(g.members, books, strict=True)]
                del self.groups[name]
                self.counts["groups_ready"] += 1
            elif now - g.first_commit_at > self.window_s:
                for s in g.members:
                    self._close(s, "expired", "expired")
                del self.groups[name]
                self.counts["expired_groups"] += 1
        return out

    def _hand_out(self, sid: str, book: SessionBook) -> ReadySession:
        ready = _ready(sid, book)
        self._close(sid, "trained", "ready")
        return ready

    def _close(self, session_id: str, how: str, count: str) -> None:
        del self.sessions[session_id]
        self.done[session_id] = how
        self._done_at[session_id] = self.clock()
        self.counts[count] += 1
        if self.log is not None and how != "trained":  # trained: once written (`written`)
            self.log.closed([session_id], how)

    def writing(self, session_ids: list[str], step: int) -> None:
        """Sessions handed out go to the buffer in serve step `step` (on disk first: a process
        started after a kill knows from the buffer's cursor whether that write landed)."""
        if self.log is not None and session_ids:
            self.log.writing(session_ids, step)

    def written(self, session_ids: list[str]) -> None:
        """Sessions handed out are in the buffer now: on disk as trained."""
        if self.log is not None and session_ids:
            self.log.closed(session_ids, "trained")

    def _forget(self, before: float) -> None:
        """Let go of sessions done and keys taken before `before` (module doc), oldest first."""
        forgot = 0
        for kept, at in ((self.done, self._done_at), (self.keys, self._key_at)):
            while at:  # oldest first (insertion order): stops at the first one to keep
                name, when = next(iter(at.items()))
                if when >= before:
                    break
                del at[name], kept[name]
                forgot += 1
        # the same, on disk (in wall-clock time), at most once a minute: a delete is an fsync
        if forgot and self.log is not None and self.clock() - self._log_forgot_at >= 60:
            self._log_forgot_at = self.clock()
            self.log.forget(time.time() - (self.clock() - before))


def _set_reward(book: SessionBook, reward: float, call_id: str | None, turn: int | None) -> None:
    """A checked feedback's reward, for the session, its call `call_id` or its `turn`."""
    if call_id is not None:
        book.call_rewards[call_id] = reward
    elif turn is not None:
        book.turn_rewards[turn] = reward
    else:
        book.reward = reward


def _ready(sid: str, book: SessionBook) -> ReadySession:
    rewards = book.rewards_by_call()
    return ReadySession(
        sid, list(book.calls), book.reward, rewards, book.records, book.group, book.frozen
    )
