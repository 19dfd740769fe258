"""A chat session: message lists in, prompt ids out, sampled tokens into the ledger.

`ChatSession` is what `TaskModelHandle.chat` (and, later, an OpenAI-server session) goes through:

    prepared = session.prepare(messages, tools)      # ids to send, and what they continue
    try:
        samples = await engine(prepared.prompt_ids)
        records = session.commit(prepared, messages, tools, samples)
    finally:
        session.release(prepared)                    # its claim on the record it continues

Which earlier call a message list continues is decided on messages: the longest earlier call
whose messages are a prefix of the new list, followed by an assistant message that is one of
that call's sampled replies and by no other assistant message. The reply is matched by text
(whitespace and `<think>` tags aside) or by tool-call ids a server registered with
`bind_reply`; equal replies go to a record still at its trajectory's tip and not continued by a
call in flight, in sample order. With a reasoning parser (`common/reasoning.py`) a reply's answer
alone (its reasoning dropped by the client) matches it too; a reply forced to start with a
prefix (`bridging.split_reply_prefix`) matches with or without that prefix. The new prompt is then that reply's held tokens plus the delta
of the messages after it (`bridging.Bridge`); a first call, or a fresh prompt, is rendered whole
exactly as `apply_chat_template` does (single-turn workflows see no change).

A call that means to continue but cannot be bridged (the reply was edited, the template's
bridging is `full`, a delta is unsafe) and a call that edits an earlier turn of a conversation
(same first non-system message, different later history) are drift: rendered whole and counted
by the ledger with their reason when their prompt does not extend held tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trinity.common.reasoning import ReasoningParser, note_split
from trinity.common.rollout import Sample
from trinity.explorer.bridging import (
    BRIDGE,
    Bridge,
    BridgeError,
    encode,
    render_ids,
    split_reply_prefix,
)
from trinity.explorer.ledger import NOT_SAMPLED, CallRecord, Intent, SessionLedger, fingerprint

_THINK_TAGS = re.compile(r"</?think>")
_SPACE = re.compile(r"\s+")


def _reply_key(text: str) -> str:
    """A reply's text for matching: `<think>` tags and all whitespace removed."""
    return _SPACE.sub("", _THINK_TAGS.sub("", text))


def _content_text(content: Any) -> str:
    """An OpenAI message content (a string, or a list of text parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return str(content)


def message_key(message: Mapping[str, Any]) -> str:
    """An assistant message's text for matching (its reasoning_content, then its content)."""
    reasoning = message.get("reasoning_content") or ""
    return _reply_key(str(reasoning) + _content_text(message.get("content")))


def reply_keys(tokenizer: Any, record: CallRecord) -> set[str]:
    """The texts an assistant message repeating `record`'s reply may have, as `_reply_key`s:
    the completion decoded without special tokens (as `TaskModelHandle.decode` gives it), and
    decoded with them but without the stop token it ended on."""
    ids = list(record.completion_ids)
    plain = tokenizer.decode(ids, skip_special_tokens=True)
    if record.finish_reason == "stop" and ids:
        ids = ids[:-1]
    return {_reply_key(plain), _reply_key(tokenizer.decode(ids, skip_special_tokens=False))}


def _returned_keys(tokenizer: Any, sample: Sample) -> set[str]:
    """The reply text a caller was given when it differs from the decoded completion: a reply
    ended by a stop string (`SamplingParams.stop`) is returned without it."""
    stop = sample.info.get("stop")
    if not stop:
        return set()
    text = tokenizer.decode(sample.response_ids, skip_special_tokens=True)
    return {_reply_key(text[: text.find(stop)])} if stop in text else set()


@dataclass
class _Call:
    """One chat call of the session: the messages it was given and the records it made."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    records: list[CallRecord]
    keys: list[set[str]]  # each record's reply keys (`reply_keys`)


@dataclass(frozen=True)
class Prepared:
    """A call's prompt ids, how they were built ("full", "delta", "tokens") and its intent."""

    prompt_ids: list[int]
    how: str
    intent: Intent = field(default_factory=Intent)
    claim: str | None = None  # the record it continues, held until `release`
    prefix: str | None = None  # a reply prefix whose ids end `prompt_ids` (`split_reply_prefix`)


class ChatSession:
    """One session's chat state over a `SessionLedger` (module doc).

    `bridging`: a `BRIDGE` name, or None to use `template_check.choose_bridging`'s verdict for
    the tokenizer's template (probed once per process and template, on the first continuation).
    `reasoning`: a reasoning parser (`common/reasoning.py`): each sample's reply is split into
    `info["reasoning_content"]` and `info["content"]`, and a later assistant message holding
    the answer alone is that reply too.
    """

    def __init__(
        self,
        tokenizer: Any,
        ledger: SessionLedger,
        template_kwargs: Mapping[str, Any] | None = None,
        bridging: str | None = None,
        reasoning: ReasoningParser | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning = reasoning
        self.ledger = ledger
        self.template_kwargs = dict(template_kwargs or {})
        self._bridging = bridging
        self._bridge: Bridge | None = None
        self._fingerprint: str | None = None
        self._calls: list[_Call] = []
        self._bound: dict[str, CallRecord] = {}  # tool-call id -> the record that made it
        # records that prepared calls continue and have not committed yet: concurrent
        # continuations of equal replies take different ones
        self._claimed: dict[str, int] = {}

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.tokenizer, self.template_kwargs)
        return self._fingerprint

    @property
    def bridge(self) -> Bridge:
        """The bridge continuations use (chosen on first use)."""
        if self._bridge is None:
            name = self._bridging
            if name is None:
                from trinity.explorer.template_check import choose_bridging

                name = choose_bridging(self.tokenizer, self.template_kwargs)
            self._bridge = BRIDGE.get(name)()
        return self._bridge

    # -- building prompts ----------------------------------------------------------------------

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Prepared:
        """The prompt ids for `messages` (module doc).

        1. the longest earlier call whose messages (and tools) prefix these, followed by an
           assistant message and then no other (a later assistant message would be rendered
           again: not a continuation of that call): its reply is matched to one of its records
        2. a matched reply: the bridge's ids (held tokens + delta); a bridge that refuses, or no
           matching reply: the whole list rendered, as drift
        3. no continuation: the whole list rendered; an edit of an earlier conversation (same
           first non-system message) is drift, anything else a fresh prompt

        A list ending with a reply prefix (`bridging.split_reply_prefix`) is prepared without
        it, and the prefix's ids end the prompt.
        """
        rest, prefix = split_reply_prefix(messages)
        prepared = self._prepare([dict(m) for m in rest], tools)
        if prefix is None:
            return prepared
        ids = prepared.prompt_ids + encode(self.tokenizer, prefix)
        return dataclasses.replace(prepared, prompt_ids=ids, prefix=prefix)

    def _prepare(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Prepared:
        # 1.
        calls = self._continued_calls(msgs, tools)
        if calls:
            k = len(calls[0].messages)
            record = self._match_reply(calls, msgs[k])
            if record is None:
                return self._whole(msgs, tools, Intent(calls[-1].records[0], "reply_mismatch"))
            # 2.
            bridge = self.bridge
            try:
                ids = bridge.continue_ids(
                    self.tokenizer,
                    record.held_tokens(),
                    record.completion_ids,
                    record.finish_reason == "stop",
                    msgs[k + 1 :],
                    msgs,
                    tools=tools,
                    template_kwargs=self.template_kwargs,
                )
            except BridgeError:
                return self._whole(msgs, tools, Intent(record, "unsafe_delta"))
            reason = "" if bridge.name == "delta" else f"bridging_{bridge.name}"
            self._claimed[record.call_id] = self._claimed.get(record.call_id, 0) + 1
            return Prepared(ids, bridge.name, Intent(record, reason), claim=record.call_id)
        # 3.
        edited = self._edited_call(msgs)
        intent = Intent(edited.records[0], "history_edit") if edited is not None else Intent()
        return self._whole(msgs, tools, intent)

    def _whole(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, intent: Intent
    ) -> Prepared:
        ids = render_ids(self.tokenizer, msgs, tools=tools, template_kwargs=self.template_kwargs)
        return Prepared(ids, "full", intent)

    def _continued_calls(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[_Call]:
        """Every earlier call that `msgs` may continue, all with the longest such messages: two
        calls can hold equal messages (episodes that went the same way), and the reply is then
        matched among all of their records, in call order."""
        best: list[_Call] = []
        for call in self._calls:
            k = len(call.messages)
            if (
                call.records
                and len(msgs) > k
                and call.tools == tools
                and msgs[k].get("role") == "assistant"
                and all(m.get("role") != "assistant" for m in msgs[k + 1 :])
                and msgs[:k] == call.messages
            ):
                if best and k > len(best[0].messages):
                    best = []
                if not best or k == len(best[0].messages):
                    best.append(call)
        return best

    def _match_reply(self, calls: list[_Call], message: Mapping[str, Any]) -> CallRecord | None:
        """The record of one of `calls` whose sampled reply `message` is: by a bound tool-call id
        whose record's text contains the message's text (the parser moved the calls out of it;
        an edited text is another reply), else by text; among equal texts, one still at its
        trajectory's tip and not claimed by a call in flight first, in call and sample order."""
        key = message_key(message)
        for tc in message.get("tool_calls") or []:
            bound = self._bound.get(str(tc.get("id")))
            call = next((c for c in calls if bound is not None and bound in c.records), None)
            if call is None:
                continue
            keys = call.keys[call.records.index(bound)]
            return bound if any(key in k for k in keys) else None
        found = [
            r
            for call in calls
            for r, keys in zip(call.records, call.keys, strict=True)
            if key in keys
        ]
        if not found:
            return None
        tips = [r for r in found if len(self.ledger.trajectories[r.trajectory].tokens) == r.end]
        free = [r for r in tips if not self._claimed.get(r.call_id)]
        return (free or tips or found)[0]

    def _edited_call(self, msgs: list[dict[str, Any]]) -> _Call | None:
        """An earlier call with the same first non-system message and other messages after it
        (history edited), the longest shared prefix first; None when there is none."""
        first = next((i for i, m in enumerate(msgs) if m.get("role") != "system"), None)
        if first is None:
            return None
        best, shared = None, 0
        for call in self._calls:
            if not call.records or call.messages == msgs or len(call.messages) <= first:
                continue
            if call.messages[: first + 1] != msgs[: first + 1]:
                continue
            n = 0
            for a, b in zip(call.messages, msgs, strict=False):
                if a != b:
                    break
                n += 1
            if n < len(msgs) and n >= shared:
                best, shared = call, n
        return best

    # -- recording -----------------------------------------------------------------------------

    def commit(
        self,
        prepared: Prepared,
        messages: Sequence[Mapping[str, Any]] | None,
        tools: list[dict[str, Any]] | None,
        samples: Sequence[Sample],
    ) -> list[CallRecord]:
        """Record `samples` (answers to `prepared`) in the ledger and remember the call's
        messages (None for a token-level `generate` call, which no message list continues).
        Each sample's `info["call_id"]` names its record."""
        records = self.ledger.record(
            samples, fingerprint=self.fingerprint, how=prepared.how, intent=prepared.intent
        )
        for s, r in zip(samples, records, strict=True):
            s.info["call_id"] = r.call_id
        answers = [self._split(s) for s in samples]
        if messages is not None and records:
            keys = [
                reply_keys(self.tokenizer, r) | _returned_keys(self.tokenizer, s) | answer
                for s, r, answer in zip(samples, records, answers, strict=True)
            ]
            if prepared.prefix is not None:  # a next turn's reply may repeat it with its prefix
                messages = split_reply_prefix(messages)[0]
                keys = [ks | {_reply_key(prepared.prefix) + k for k in ks} for ks in keys]
            self._calls.append(_Call(*self._kept(messages, tools), records, keys))
        return records

    def _split(self, sample: Sample) -> set[str]:
        """With a reasoning parser: `sample`'s returned reply split into its info's
        `reasoning_content` and `content`, and the answer's key (empty without one)."""
        if self.reasoning is None or sample.finish_reason in NOT_SAMPLED:
            return set()
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True)
        stop = sample.info.get("stop")
        if stop and stop in text:  # returned without the stop string that ended it
            text = text[: text.find(stop)]
        split = note_split(self.reasoning, text, sample.info)
        return {_reply_key(split.content)} if split.content and split.content.strip() else set()

    def _kept(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """Copies of a call's messages and tools to keep (the caller may change its own later),
        sharing every message equal to the previous call's at the same place: an agent's calls
        grow one history, and a copy of the whole of it per call would be quadratic."""
        prev = self._calls[-1] if self._calls else None
        before = prev.messages if prev is not None else []
        kept = [
            before[i] if i < len(before) and before[i] == m else copy.deepcopy(dict(m))
            for i, m in enumerate(messages)
        ]
        same_tools = prev is not None and prev.tools == tools
        return kept, (prev.tools if same_tools and prev is not None else copy.deepcopy(tools))

    def release(self, prepared: Prepared) -> None:
        """Drop `prepared`'s claim on the record it continues (after `commit`, or when its
        call failed)."""
        if prepared.claim is not None:
            left = self._claimed.get(prepared.claim, 0) - 1
            if left > 0:
                self._claimed[prepared.claim] = left
            else:
                self._claimed.pop(prepared.claim, None)

    def bind_reply(self, call_id: str, tool_call_ids: Sequence[str]) -> None:
        """Name the tool calls a parser made of record `call_id`'s reply, so an assistant message
        carrying them (content rewritten into `tool_calls`) is matched to that record."""
        record = self.ledger.records[call_id]
        for tc in tool_call_ids:
            self._bound[str(tc)] = record
