"""Reasoning parsers: a reply's `<think>...</think>` reasoning split from its answer, as vLLM's
parsers of the same names split them (`--reasoning-parser`).

    explorer.rollout_model.reasoning_parser: deepseek_r1     # or qwen3, or package.module.fn

A parser is a function `(text) -> Reasoning`, registered in `REASONING_PARSER`. It only reads
text: the tokens a model sampled are never changed (token-in/token-out; the ledger keeps them
whole, the think block included). Where the split shows:

- the OpenAI-compatible endpoint answers a chat call with the message's `content` (the answer,
  which the tool-call parser then reads) and `reasoning_content` (the reasoning, None without
  one), as vLLM does; a streamed answer sends `reasoning_content` deltas before `content` ones;
- a workflow's `model.chat(...)` samples carry `info["reasoning_content"]` and
  `info["content"]`;
- the session's reply matching (`explorer/session.py`): an assistant message that repeats a
  reply's answer without its reasoning (a client that drops `reasoning_content`, a template
  that strips history's think blocks) is still that reply, continued from the sampled tokens.

The names and their difference, as vLLM's parsers:
- `deepseek_r1`: an opening `<think>` is optional (DeepSeek-R1's template puts it in the
  prompt); the reasoning is the text before `</think>`, the answer after it; a reply with no
  `</think>` is all reasoning (cut before it closed its thinking), with no answer.
- `qwen3`: the same split, but a reply with no `</think>` is all answer (Qwen3 with thinking
  off writes none), an opening `<think>` dropped all the same.
An empty answer is None (as vLLM returns it); the text is not stripped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trinity.common.registry import Registry

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class Reasoning:
    """A reply split: its reasoning (None: none) and its answer (None: none)."""

    reasoning: str | None
    content: str | None


ReasoningParser = Callable[[str], Reasoning]
REASONING_PARSER: Registry[ReasoningParser] = Registry("reasoning_parser")


def _after_start(text: str) -> str:
    """`text` after its first `<think>`, or all of it when it has none."""
    before, found, after = text.partition(THINK_START)
    return after if found else before


@REASONING_PARSER.register("deepseek_r1")
def deepseek_r1(text: str) -> Reasoning:
    """Reasoning up to `</think>` (an opening `<think>` dropped); no `</think>`: all reasoning."""
    body = _after_start(text)
    if THINK_END not in body:
        return Reasoning(body, None)
    reasoning, _, content = body.partition(THINK_END)
    return Reasoning(reasoning, content or None)


@REASONING_PARSER.register("qwen3")
def qwen3(text: str) -> Reasoning:
    """Reasoning up to `</think>` (an opening `<think>` dropped); no `</think>`: all answer."""
    body = _after_start(text)
    if THINK_END not in body:
        return Reasoning(None, body)
    reasoning, _, content = body.partition(THINK_END)
    return Reasoning(reasoning, content or None)


def note_split(parser: ReasoningParser, text: str, info: dict) -> Reasoning:
    """`text` (a returned reply) split by `parser`, kept in a sample's `info` as
    `reasoning_content` and `content`."""
    split = parser(text)
    info["reasoning_content"], info["content"] = split.reasoning, split.content
    return split


def reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The parser `name` names (None: no parser); a registry error listing the names on a miss."""
    return None if name is None else REASONING_PARSER.get(name)
