"""Bridged prompting: continue a conversation from the tokens that were sampled.

When a chat call's messages are the previous call's messages + the assistant reply that was
sampled + new messages (tool results, the environment's or the user's turn), the prompt sent to
the engine is

    held tokens (previous prompt ids + the sampled completion ids) + delta ids

where the delta is the chat template's rendering of the new messages alone (and the next
generation prompt). Earlier turns are never rendered again, so a template that rewrites history
(drops earlier `<think>` blocks, re-serialises tool arguments) cannot change what the model saw.

`Bridge` is the contract and `BRIDGE` its registry; `template_check.choose_bridging` decides which
one a tokenizer's template gets (`trinity model check-template` reports it):

- `delta`: render [a fixed dummy user turn, a dummy assistant turn, *new messages] with the
  generation prompt and cut right after the dummy assistant's content. What follows the cut is
  the template's end of an assistant turn (e.g. `<|im_end|>\\n`), the new messages and the next
  assistant header. The cut must be a clean token boundary (the text before it tokenises to a
  prefix of the whole text's ids), checked on every call. A completion that stopped on a token
  of the turn end (the eos the engine stopped on: `<|im_end|>`, `<|eot_id|>`) continues after
  that token; one cut by its length budget gets the whole turn end, rendered (mask 0).
- `full`: render the whole message list (for templates the check found unsafe to cut). The
  prompt then rarely extends the held tokens, so each turn opens a new segment (counted drift):
  exact, but not merged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from trinity.common.registry import Registry

# the dummy turns the delta is cut from: plain words, so no template rewrites them
DUMMY_USER = "bridge prefix question"
DUMMY_REPLY = "bridgeprefixreplymark"


class BridgeError(ValueError):
    """This delta cannot be rendered safely (the caller renders the whole list instead and the
    ledger counts the drift)."""


@runtime_checkable
class Bridge(Protocol):
    """Builds the prompt ids of a call that continues a sampled reply."""

    name: str

    def continue_ids(
        self,
        tokenizer: Any,
        held: Sequence[int],
        completion: Sequence[int],
        stopped: bool,
        new_messages: list[dict[str, Any]],
        all_messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Prompt ids for `all_messages`, which are the held conversation + the sampled reply
        (`completion`, the tail of `held`; `stopped`: it ended on a stop token, finish reason
        "stop") + `new_messages`. Raises `BridgeError` when it cannot build them safely."""
        ...


BRIDGE: Registry[type] = Registry("bridging")


def split_reply_prefix(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], str | None]:
    """(the messages before a reply prefix, the prefix's text) of a message list that ends with
    an assistant message marked `"prefix": True` (`format.reply_prefix`; the form of DeepSeek's
    and Mistral's chat prefix completion); (the messages, None) for any other list.

    A reply prefix is rendered as the rest's prompt (with its generation prompt) followed by the
    prefix's own tokens, `encode(prefix)`: the reply is forced to start with it after the chat
    template's generation prompt, and its tokens are prompt tokens (never trained). Trinity-RFT
    renders the same list with `continue_final_message` and tokenises the text whole: the same
    ids wherever the generation prompt ends on a token boundary (every ChatML and Llama
    template), without the template's rendering of a finished assistant turn (Qwen3 puts an
    empty think block into one)."""
    if messages and messages[-1].get("role") == "assistant" and messages[-1].get("prefix") is True:
        content = messages[-1].get("content")
        if not isinstance(content, str) or not content:
            raise ValueError(f"a reply prefix message needs a text content, got {content!r}")
        return list(messages[:-1]), content
    return list(messages), None


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template's text for `messages` (no tokenising)."""
    kwargs = dict(template_kwargs or {})
    if tools:  # an empty list renders as no tools, as TaskModelHandle.chat always did
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The whole message list with the generation prompt, tokenised as `apply_chat_template`
    does (the first call of a session, and the `full` bridge)."""
    kwargs = dict(template_kwargs or {})
    if tools:  # an empty list renders as no tools, as TaskModelHandle.chat always did
        kwargs["tools"] = tools
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    return list(ids)


def encode(tokenizer: Any, text: str) -> list[int]:
    """`text` tokenised as a chat template's output is (no added special tokens)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def delta_ids(
    tokenizer: Any,
    completion: Sequence[int],
    stopped: bool,
    new_messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[int], str]:
    """(the delta ids to append after `completion`, the text they render) of the `delta` bridge.

    1. render [dummy user, dummy assistant, *new_messages] with the generation prompt
    2. cut after the dummy assistant's content; the text before the cut must tokenise to a
       prefix of the whole text's ids (a clean boundary), else `BridgeError`
    3. the turn end: the tokens the template puts after an assistant's content before the next
       message (rendering [dummy user, dummy assistant] alone shows them; one token when it
       cannot tell). A completion that `stopped` on one of them continues after it.
    """
    for m in new_messages:
        if DUMMY_REPLY in json.dumps(m, default=str):
            raise BridgeError("a new message contains the bridge's dummy marker")
    dummy = [
        {"role": "user", "content": DUMMY_USER},
        {"role": "assistant", "content": DUMMY_REPLY},
    ]
    # 1.
    try:
        text = render_text(
            tokenizer,
            dummy + list(new_messages),
            add_generation_prompt=True,
            tools=tools,
            template_kwargs=template_kwargs,
        )
        alone = render_text(
            tokenizer,
            dummy,
            add_generation_prompt=False,
            tools=tools,
            template_kwargs=template_kwargs,
        )
    except Exception as e:  # a template's own refusal (e.g. roles must alternate)
        raise BridgeError(f"the chat template cannot render the new messages: {e}") from e
    # 2.
    at = text.find(DUMMY_REPLY)
    if at < 0 or text.find(DUMMY_REPLY, at + 1) >= 0:
        raise BridgeError("the chat template does not render an assistant's content verbatim")
    cut = at + len(DUMMY_REPLY)
    head, whole = encode(tokenizer, text[:cut]), encode(tokenizer, text)
    if whole[: len(head)] != head:
        raise BridgeError(
            f"the end of an assistant turn is not a token boundary in this template "
            f"(text after the reply: {text[cut : cut + 40]!r})"
        )
    delta = whole[len(head) :]
    if not delta:
        raise BridgeError("the chat template renders nothing after an assistant turn")
    # 3.
    if stopped and completion:
        k = _turn_end_length(tokenizer, text, cut, alone, len(head), whole)
        end = delta[:k]
        if completion[-1] in end:
            delta = delta[end.index(completion[-1]) + 1 :]
    return delta, text[cut:]


def _turn_end_length(
    tokenizer: Any, text: str, cut: int, alone: str, head: int, whole: list[int]
) -> int:
    """How many ids after the cut close the assistant turn: the tail `alone` renders after the
    dummy reply, when the full text has it there too on a token boundary; else 1."""
    at = alone.find(DUMMY_REPLY)
    tail = alone[at + len(DUMMY_REPLY) :] if at >= 0 else ""
    if not tail or not text.startswith(tail, cut):
        return 1
    upto = encode(tokenizer, text[: cut + len(tail)])
    if whole[: len(upto)] != upto:
        return 1
    return max(1, len(upto) - head)


@BRIDGE.register("delta")
class DeltaBridge:
    """Held tokens + the new messages rendered behind a dummy assistant turn (module doc)."""

    name = "delta"

    def continue_ids(
        self,
        tokenizer: Any,
        held: Sequence[int],
        completion: Sequence[int],
        stopped: bool,
        new_messages: list[dict[str, Any]],
        all_messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        delta, _ = delta_ids(
            tokenizer,
            completion,
            stopped,
            new_messages,
            tools=tools,
            template_kwargs=template_kwargs,
        )
        return [*held, *delta]


@BRIDGE.register("full")
class FullBridge:
    """The whole message list rendered again (templates unsafe to cut; module doc)."""

    name = "full"

    def continue_ids(
        self,
        tokenizer: Any,
        held: Sequence[int],
        completion: Sequence[int],
        stopped: bool,
        new_messages: list[dict[str, Any]],
        all_messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        return render_ids(tokenizer, all_messages, tools=tools, template_kwargs=template_kwargs)
