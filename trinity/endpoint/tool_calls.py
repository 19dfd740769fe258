"""Tool-call parsers: the text a model sampled -> OpenAI `tool_calls`, with a parse status.

    explorer.rollout_model.tool_call_parser: hermes   # or qwen, json, or package.module.fn

A parser is a function `(text) -> ParsedCalls`, registered in `TOOL_CALL_PARSER`. The status says
what happened, so a malformed call is never dropped silently: the endpoint returns the raw text
as the message content (finish_reason "stop", no `tool_calls`) and records the status on the
sample (`Sample.info["tool_call_status"]`) and in its session's ledger
(`SessionLedger.note_tool_calls`), whence the experience (`info["tool_calls"]`); the explorer
keeps, masks or penalises a malformed reply as `explorer.malformed_tool_calls` says
(`explorer.tool_call_policy`).

- "none": the text holds no tool call; content is the whole text.
- "ok": every call parsed; content is the text outside the calls (None when empty).
- "malformed": the text tries to call a tool (an opening tag, or an object shaped like a call)
  but at least one call does not parse: bad JSON, no name, arguments not an object, an
  unclosed tag. `error` says which and why.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from trinity.common.registry import Registry

Status = Literal["none", "ok", "malformed"]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON object string."""

    name: str
    arguments: str  # canonical JSON of the arguments object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedCalls:
    status: Status
    content: str | None
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None


ToolCallParser = Callable[[str], ParsedCalls]
TOOL_CALL_PARSER: Registry[ToolCallParser] = Registry("tool_call_parser")


def _call_from_object(obj: Any) -> ToolCall:
    """{"name": str, "arguments": object or JSON-object string} -> ToolCall; ValueError if not."""
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a non-empty string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments of {name!r} are not JSON: {e}") from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))


_TAGGED = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@TOOL_CALL_PARSER.register("hermes")
def hermes(text: str) -> ParsedCalls:
    """Hermes / Qwen2.5 style: each call is `<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`; the text outside the tags is the content."""
    if "<tool_call>" not in text:
        return ParsedCalls("none", text)
    calls: list[ToolCall] = []
    for i, m in enumerate(_TAGGED.finditer(text)):
        try:
            calls.append(_call_from_object(json.loads(m.group(1).strip())))
        except (json.JSONDecodeError, ValueError) as e:
            return ParsedCalls("malformed", text, error=f"tool call {i}: {e}")
    if text.count("<tool_call>") != len(calls):
        return ParsedCalls("malformed", text, error="a <tool_call> tag is never closed")
    rest = _TAGGED.sub("", text).strip()
    return ParsedCalls("ok", rest or None, tuple(calls))


TOOL_CALL_PARSER.register("qwen")(hermes)  # Qwen2.5/3's template writes Hermes' tags


@TOOL_CALL_PARSER.register("json")
def json_calls(text: str) -> ParsedCalls:
    """The whole reply is a JSON call object or a list of them (optionally in a ```json fence):
    the fallback for models without a tool-call format. Text that is not JSON at all is plain
    content; JSON that looks like a call (has "name") but is not a valid one is malformed."""
    none = ParsedCalls("none", text)
    body = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    body = fence.group(1) if fence else body
    if not body.startswith(("{", "[")):
        return none
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        looks = '"name"' in body
        return ParsedCalls("malformed", text, error=f"bad JSON: {e}") if looks else none
    items = obj if isinstance(obj, list) else [obj]
    if not any(isinstance(o, dict) and "name" in o for o in items):
        return none  # JSON content, not a call
    try:
        return ParsedCalls("ok", None, tuple(_call_from_object(o) for o in items))
    except ValueError as e:
        return ParsedCalls("malformed", text, error=str(e))
