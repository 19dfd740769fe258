"""The template check's verdicts on templates built to have (or lack) each property."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import chat_templates
from trinity.explorer.template_check import TemplateRefused, check_template, choose_bridging

ROOT = Path(__file__).resolve().parents[1]


def test_a_reasoning_chatml_template_strips_history_and_is_bridged_by_delta():
    r = check_template(chat_templates.chatml())
    assert not r.append_only and r.strips_reasoning and r.rewrites_tool_arguments
    assert "dropped once a user turn follows" in r.details["strips_reasoning"]
    assert "re-serialised" in r.details["rewrites_tool_arguments"]  # tojson of the string
    assert r.delta_safe and r.delta_equal == r.continuations > 0
    assert r.bridging == "delta"


def test_its_verbatim_twin_keeps_reasoning_but_groups_tool_results():
    r = check_template(chat_templates.chatml(keep_history=True))
    assert not r.strips_reasoning and r.bridging == "delta"
    # one user turn holds consecutive tool results: a second one reopens the first's turn end
    assert not r.append_only and "(tool)" in r.details["append_only"]


def test_a_llama3_style_template_is_append_only_and_keeps_tool_arguments():
    r = check_template(chat_templates.llama3())
    assert r.append_only and not r.strips_reasoning and not r.rewrites_tool_arguments
    assert r.tool_messages and r.bridging == "delta"


def test_a_template_that_numbers_turns_is_not_safe_to_cut_and_is_bridged_whole():
    r = check_template(chat_templates.turn_counter())
    assert r.append_only  # rendering more turns leaves earlier ones alone...
    assert not r.delta_safe  # ...but a delta behind a dummy prefix is numbered wrong
    assert "renders '3: Check" in r.details["delta"] and r.delta_equal < r.continuations
    assert r.bridging == "full"
    assert choose_bridging(chat_templates.turn_counter()) == "full"


def test_tool_arguments_rendered_verbatim_are_not_rewritten():
    r = check_template(chat_templates.verbatim_tools())
    assert not r.rewrites_tool_arguments and r.append_only


def test_a_template_without_a_generation_prompt_is_refused():
    tok = chat_templates.chatml()
    tok.chat_template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}"
        "{%- endfor %}"
    )
    r = check_template(tok)
    assert r.bridging is None and "assistant header" in r.refused
    with pytest.raises(TemplateRefused, match="assistant header"):
        choose_bridging(tok)


def test_a_tokenizer_without_a_template_is_refused():
    tok = chat_templates.chatml()
    tok.chat_template = None
    assert "no chat template" in check_template(tok).refused


def test_a_template_rejecting_tool_messages_is_probed_without_them():
    tok = chat_templates.chatml()
    tok.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'tool' %}"
        "{{- raise_exception('no tool role') }}{%- endif %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    r = check_template(tok)
    assert not r.tool_messages and "no tool role" in r.details["tool_messages"]
    assert r.conversations == 24 and r.bridging == "delta"


def test_the_cli_reports_and_refuses(tmp_path):
    model = tmp_path / "tok"
    tok = chat_templates.llama3()
    tok.save_pretrained(model)
    (model / "config.json").write_text("{}")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{%- for m in messages %}{{- m.content }}{%- endfor %}")
    cmd = [sys.executable, "-m", "trinity.cli", "model", "check-template", "--model", str(model)]
    ok = subprocess.run([*cmd, "--conversations", "8"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "append-only: yes" in ok.stdout and "bridging the runtime will use: delta" in ok.stdout
    refused = subprocess.run(
        [*cmd, "--chat-template", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert refused.returncode == 2 and "assistant header" in refused.stderr
    assert "Traceback" not in refused.stderr
