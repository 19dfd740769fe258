"""Template check: probe a chat template with generated conversations, choose its bridging.

    trinity model check-template --model tiny://1m
    trinity model check-template --model ~/models/Qwen3-0.6B --conversations 100

The probes are tool-using conversations built from a seeded generator (`probe_conversations`):
system prompts, questions, assistant replies with `<think>` blocks and hermes-style
`<tool_call>` text, tool results (one or two in a row) and follow-up user turns. Every assistant
reply ends with a marker word unique in its conversation, so its end can be found in any
rendering. The report says:

- append-only: rendering a conversation's first k messages is a prefix (text and ids) of
  rendering its first k + 1, for every k; when it is not, re-rendering a longer history changes
  tokens the model already saw;
- strips reasoning: an earlier reply's `<think>` block (in its content, or as
  `reasoning_content`) is missing once a later user turn follows;
- rewrites tool arguments: an assistant `tool_calls` entry's argument string is not rendered
  verbatim (re-serialised, reordered, or dropped);
- delta bridging safe: for every reply followed by other turns, the `delta` bridge's text and
  ids equal what rendering the whole conversation puts after that reply, and the cut is a
  clean token boundary;
- the bridging the runtime will use (`choose_bridging`): `delta` when it is safe, else `full`;
  refused (`TemplateRefused`) when the template renders no conversation, or no generation
  prompt (the model would go on writing the user's turn).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity.explorer.bridging import BridgeError, delta_ids, encode, render_text
from trinity.explorer.ledger import fingerprint

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
# a tool call's arguments as a model might write them: keys out of order, odd spacing
ODD_ARGUMENTS = '{"b": 2,  "a":1}'
# fmt: off
_WORDS = ["the", "sum", "of", "two", "numbers", "is", "what", "we", "need", "to", "check",
          "first", "then", "add", "them", "again"]
# fmt: on


class TemplateRefused(ValueError):
    """No safe bridging exists for this chat template (the message says why)."""


@dataclass
class TemplateReport:
    fingerprint: str
    conversations: int = 0  # probe conversations rendered
    continuations: int = 0  # replies followed by other turns, bridged and compared
    append_only: bool = True
    strips_reasoning: bool = False
    rewrites_tool_arguments: bool = False
    tool_messages: bool = True  # the template renders role "tool"
    delta_safe: bool = True
    delta_equal: int = 0  # continuations whose delta equals the in-context rendering
    bridging: str | None = None  # "delta" | "full" | None (refused)
    refused: str = ""
    details: dict[str, str] = field(default_factory=dict)  # first example of each finding

    def lines(self) -> list[str]:
        """The human-readable report."""

        def yes(flag: bool) -> str:
            return "yes" if flag else "no"

        def detail(key: str) -> str:
            return f"  ({self.details[key]})" if key in self.details else ""

        out = [
            f"fingerprint: {self.fingerprint}",
            f"conversations probed: {self.conversations} "
            f"({self.continuations} continuations bridged)",
        ]
        if self.refused:
            return [*out, f"bridging: refused: {self.refused}"]
        out += [
            f"append-only: {yes(self.append_only)}{detail('append_only')}",
            f"strips reasoning: {yes(self.strips_reasoning)}{detail('strips_reasoning')}",
            f"rewrites tool arguments: {yes(self.rewrites_tool_arguments)}"
            f"{detail('rewrites_tool_arguments')}",
            f"tool messages: {'rendered' if self.tool_messages else 'refused'}"
            f"{detail('tool_messages')}",
            f"delta bridging safe: {yes(self.delta_safe)} "
            f"({self.delta_equal}/{self.continuations} deltas equal the in-context rendering)"
            f"{detail('delta')}",
            f"bridging the runtime will use: {self.bridging}",
        ]
        return out


def probe_conversations(n: int, seed: int = 0, tools: bool = True) -> list[list[dict[str, Any]]]:
    """`n` deterministic probe conversations (module doc), each ending with an assistant reply.
    `tools`: include tool-call replies and tool results."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": "You are a careful calculator agent."})
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        msgs.append({"role": "user", "content": f"What is {a} + {b}? Use the tool if needed."})
        for t in range(rng.randint(2, 4)):
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))
            mark = f"endmark{c}x{t}"
            content = f"{words} {mark}"
            if rng.random() < 0.4:
                content = f"<think>\nplan {words}\n</think>\n\n{content}"
            use_tool = tools and rng.random() < 0.6
            if use_tool:
                call = json.dumps({"name": "calc", "arguments": {"expression": f"{a}+{b}"}})
                content = f"<tool_call>\n{call}\n</tool_call> {content}"
            msgs.append({"role": "assistant", "content": content})
            if use_tool:
                for k in range(rng.randint(1, 2)):
                    msgs.append({"role": "tool", "content": f"result {a + b + k}"})
            if rng.random() < 0.7 or not use_tool:
                msgs.append({"role": "user", "content": f"Check it again, step {t}."})
        msgs.append({"role": "assistant", "content": f"The answer is {a + b}. endmark{c}z"})
        out.append(msgs)
    return out


def _marker(message: dict[str, Any]) -> str:
    """The unique word an assistant probe reply ends with."""
    return str(message["content"]).split()[-1]


def check_template(
    tokenizer: Any,
    template_kwargs: Mapping[str, Any] | None = None,
    conversations: int = 24,
    seed: int = 0,
) -> TemplateReport:
    """Probe `tokenizer`'s chat template (module doc); never raises for a template's fault:
    a template that cannot be used is reported with `bridging=None` and `refused`."""
    kw = dict(template_kwargs or {})
    report = TemplateReport(fingerprint=fingerprint(tokenizer, kw))
    if not getattr(tokenizer, "chat_template", None):
        report.refused = "the tokenizer has no chat template (set model.custom_chat_template)"
        return report
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    try:
        with_prompt = render_text(
            tokenizer, question, add_generation_prompt=True, template_kwargs=kw
        )
        without = render_text(tokenizer, question, add_generation_prompt=False, template_kwargs=kw)
    except Exception as e:
        report.refused = f"the chat template cannot render a one-question conversation: {e}"
        return report
    if not with_prompt.startswith(without) or len(with_prompt) <= len(without):
        report.refused = (
            "add_generation_prompt renders no assistant header after the user's turn: the "
            "model would go on writing the user's message"
        )
        return report
    convs = probe_conversations(conversations, seed)
    try:
        render_text(
            tokenizer, convs[0], add_generation_prompt=False, tools=TOOLS, template_kwargs=kw
        )
        _ = [
            render_text(tokenizer, c, add_generation_prompt=False, tools=TOOLS, template_kwargs=kw)
            for c in convs
            if any(m["role"] == "tool" for m in c)
        ]
    except Exception as e:
        report.tool_messages = False
        report.details["tool_messages"] = f"tool results cannot be rendered: {e}"
        convs = probe_conversations(conversations, seed, tools=False)
    tools = TOOLS if report.tool_messages else None
    for conv in convs:
        try:
            _check_append_only(tokenizer, conv, tools, kw, report)
            _check_deltas(tokenizer, conv, tools, kw, report)
        except Exception as e:  # a conversation the template refuses to render
            report.refused = f"the chat template cannot render a probe conversation: {e}"
            return report
        report.conversations += 1
    _check_reasoning(tokenizer, kw, report)
    _check_tool_arguments(tokenizer, kw, report)
    report.bridging = "delta" if report.delta_safe else "full"
    return report


def _check_append_only(
    tokenizer: Any,
    conv: list[dict[str, Any]],
    tools: list | None,
    kw: dict[str, Any],
    report: TemplateReport,
) -> None:
    if not report.append_only:
        return
    for k in range(1, len(conv)):
        gen = conv[k]["role"] == "assistant"
        shorter = render_text(
            tokenizer, conv[:k], add_generation_prompt=gen, tools=tools, template_kwargs=kw
        )
        longer = render_text(
            tokenizer, conv[: k + 1], add_generation_prompt=False, tools=tools, template_kwargs=kw
        )
        ids_short, ids_long = encode(tokenizer, shorter), encode(tokenizer, longer)
        if not longer.startswith(shorter) or ids_long[: len(ids_short)] != ids_short:
            report.append_only = False
            where = _first_difference(shorter, longer)
            report.details["append_only"] = (
                f"adding message {k + 1} ({conv[k]['role']}) changes the rendering of the "
                f"earlier ones at character {where}: {shorter[where : where + 30]!r} became "
                f"{longer[where : where + 30]!r}"
            )
            return


def _check_deltas(
    tokenizer: Any,
    conv: list[dict[str, Any]],
    tools: list | None,
    kw: dict[str, Any],
    report: TemplateReport,
) -> None:
    """Each reply followed by other turns: the delta bridge against the whole rendering."""
    replies = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    for k, j in itertools.pairwise(replies):
        report.continuations += 1
        full = render_text(
            tokenizer, conv[:j], add_generation_prompt=True, tools=tools, template_kwargs=kw
        )
        mark = _marker(conv[k])
        at = full.find(mark)
        problem = ""
        if at < 0:
            problem = f"reply {k + 1}'s end is not in the rendering"
        else:
            cut = at + len(mark)
            head, whole = encode(tokenizer, full[:cut]), encode(tokenizer, full)
            try:
                ids, text = delta_ids(
                    tokenizer, [], False, conv[k + 1 : j], tools=tools, template_kwargs=kw
                )
            except BridgeError as e:
                problem = str(e)
            else:
                if whole[: len(head)] != head:
                    problem = f"the end of reply {k + 1} is not a token boundary"
                elif text != full[cut:]:
                    at = _first_difference(text, full[cut:])
                    problem = (
                        f"after reply {k + 1} the delta renders {text[at : at + 40]!r} where the "
                        f"whole conversation has {full[cut + at : cut + at + 40]!r}"
                    )
                elif ids != whole[len(head) :]:
                    problem = f"after reply {k + 1} the delta's ids differ from the in-context ids"
        if problem:
            if report.delta_safe:
                report.details["delta"] = problem
            report.delta_safe = False
        else:
            report.delta_equal += 1


def _first_difference(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _check_reasoning(tokenizer: Any, kw: dict[str, Any], report: TemplateReport) -> None:
    """Strips reasoning: a form of reasoning the template renders in the last reply is gone
    from the same reply once a user turn follows. A form never rendered is noted."""
    thought = "weighing both options carefully"
    forms = {
        "<think> block in content": {"content": f"<think>\n{thought}\n</think>\n\nIt is 5."},
        "reasoning_content": {"content": "It is 5.", "reasoning_content": thought},
    }
    ignored = []
    for name, reply in forms.items():
        last = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", **reply}]
        later = [*last, {"role": "user", "content": "Sure?"}]
        try:
            shown = render_text(tokenizer, last, add_generation_prompt=False, template_kwargs=kw)
            then = render_text(tokenizer, later, add_generation_prompt=True, template_kwargs=kw)
        except Exception:
            ignored.append(name)
            continue
        if thought not in shown:
            ignored.append(name)
        elif thought not in then:
            report.strips_reasoning = True
            report.details["strips_reasoning"] = (
                f"an earlier reply's {name} is dropped once a user turn follows"
            )
    if ignored and "strips_reasoning" not in report.details:
        report.details["strips_reasoning"] = f"never renders: {', '.join(ignored)}"


def _check_tool_arguments(tokenizer: Any, kw: dict[str, Any], report: TemplateReport) -> None:
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calc", "arguments": ODD_ARGUMENTS},
    }
    conv = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "5"},
    ]
    try:
        text = render_text(
            tokenizer, conv, add_generation_prompt=True, tools=TOOLS, template_kwargs=kw
        )
    except Exception as e:
        report.rewrites_tool_arguments = True
        report.details["rewrites_tool_arguments"] = f"assistant tool_calls cannot be rendered: {e}"
        return
    if ODD_ARGUMENTS not in text:
        report.rewrites_tool_arguments = True
        shown = "dropped" if "calc" not in text else "re-serialised"
        report.details["rewrites_tool_arguments"] = (
            f"the arguments string {ODD_ARGUMENTS!r} is {shown} in the rendering"
        )


_CHOICES: dict[str, TemplateReport] = {}


def choose_bridging(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The bridge name (`bridging.BRIDGE`) the runtime uses for this tokenizer + template:
    `check_template`'s verdict, cached per fingerprint. Raises `TemplateRefused` when none is
    safe."""
    fp = fingerprint(tokenizer, template_kwargs)
    report = _CHOICES.get(fp)
    if report is None:
        report = _CHOICES[fp] = check_template(tokenizer, template_kwargs)
    if report.bridging is None:
        raise TemplateRefused(f"chat template {fp}: {report.refused}")
    return report.bridging
