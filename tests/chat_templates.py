"""Tokenizers and chat templates built offline (the `tokenizers` library) for the ledger tests.

- `chatml()`: a ChatML template in the style of reasoning models: an assistant reply before the
  last user turn loses its `<think>...</think>` block when a conversation is rendered; tool
  results are grouped into one user turn of `<tool_response>` blocks; assistant `tool_calls` are
  rendered as hermes-style `<tool_call>` JSON (the arguments re-serialised with `tojson`).
  `chatml(keep_history=True)` is its twin that renders every reply verbatim: the test oracle.
- `llama3()`: Llama-3-style headers (`<|start_header_id|>role<|end_header_id|>\\n\\n ...
  <|eot_id|>`), `<|begin_of_text|>` first, tool results as role `ipython`; append-only.
- `turn_counter()`: ChatML whose user turns are numbered by their position in the conversation:
  a delta rendered behind a dummy prefix gets the wrong number, so delta bridging is unsafe.
- `verbatim_tools()`: append-only ChatML that renders tool-call arguments strings verbatim.
"""

from __future__ import annotations

from functools import cache
from typing import Any

# fmt: off
WORDS = ["the", "sum", "of", "two", "numbers", "is", "what", "we", "need", "to", "check", "first",
         "then", "add", "them", "again", "call", "calc", "tool", "result", "answer", "final",
         "plan", "think", "expression", "value", "compute", "step", "wrong", "right", "sure",
         "question", "system", "user", "assistant", "careful", "agent", "use", "if", "needed",
         "retry", "edited"]
# fmt: on

_CHATML_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHATML_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                 "</tool_response>"]  # fmt: skip
_LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

_TOOLS_SYSTEM = (
    "{%- if tools %}{%- set ns.tools = '\\n\\n# Tools\\n<tools>' %}"
    "{%- for t in tools %}{%- set ns.tools = ns.tools + '\\n' + (t | tojson) %}{%- endfor %}"
    "{%- set ns.tools = ns.tools + '\\n</tools>' %}{%- endif %}"
)

# {history}: how an assistant reply before the last user turn is rendered
_CHATML = (
    "{%- set ns = namespace(last_user=-1, tools='') %}"
    + _TOOLS_SYSTEM
    + "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + ns.tools + '<|im_end|>\\n' }}"
    "{%- elif tools %}{{- '<|im_start|>system\\nYou may call tools.' + ns.tools + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content or '' %}"
    "{%- if m.reasoning_content %}"
    "{%- set content = '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' + content %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{HISTORY}"
    "{%- for tc in (m.tool_calls or []) %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tc.function.name + \'", "arguments": \' '
    "+ (tc.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_DROP_THINK = (
    "{%- if loop.index0 < ns.last_user and '</think>' in content %}"
    "{{- content.split('</think>')[-1].lstrip('\\n') }}"
    "{%- else %}{{- content }}{%- endif %}"
)
_VERBATIM = "{{- content }}"

LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for m in messages %}"
    "{%- set role = 'ipython' if m.role == 'tool' else m.role %}"
    "{%- set ns = namespace(content=m.content or '') %}"
    "{%- for tc in (m.tool_calls or []) %}"
    '{%- set ns.content = ns.content + \'{"name": "\' + tc.function.name + \'", '
    "\"parameters\": ' + tc.function.arguments + '}' %}"
    "{%- endfor %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + ns.content + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

TURN_COUNTER_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}"
    "{{- '<|im_start|>user\\nturn ' + (loop.index0 | string) + ': ' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

VERBATIM_TOOLS_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for tc in (m.tool_calls or []) %}"
    "{{- '<tool_call>' + tc.function.name + ' ' + tc.function.arguments + '</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    lines = []
    for _ in range(400):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"{words} {a} + {b} = {a + b}.")
        lines.append(f'{{"name": "calc", "arguments": {{"expression": "{a}+{b}"}}}}')
    return lines * 2


@cache
def _tokenizer_json(special: tuple[str, ...], added: tuple[str, ...]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        min_frequency=2,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(list(added))
    return tok.to_str()


def _fast(special: list[str], added: list[str], eos: str, template: str) -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(tuple(special), tuple(added))),
        eos_token=eos,
        pad_token=special[0],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = template
    return tok


def chatml(keep_history: bool = False) -> Any:
    """The reasoning-style ChatML tokenizer (module doc); eos `<|im_end|>`."""
    template = _CHATML.replace("{HISTORY}", _VERBATIM if keep_history else _DROP_THINK)
    return _fast(_CHATML_SPECIAL, _CHATML_ADDED, "<|im_end|>", template)


def llama3() -> Any:
    """The Llama-3-style tokenizer (module doc); eos `<|eot_id|>`."""
    return _fast(_LLAMA_SPECIAL, [], "<|eot_id|>", LLAMA3_TEMPLATE)


def turn_counter() -> Any:
    return _fast(_CHATML_SPECIAL, _CHATML_ADDED, "<|im_end|>", TURN_COUNTER_TEMPLATE)


def verbatim_tools() -> Any:
    return _fast(_CHATML_SPECIAL, _CHATML_ADDED, "<|im_end|>", VERBATIM_TOOLS_TEMPLATE)
