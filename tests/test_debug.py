"""`trinity debug workflow`: one task in this process, its transcript and saved experiences."""

from __future__ import annotations

import json

import torch
from test_e2e import grpo_config
from typer.testing import CliRunner

from trinity.cli import app
from trinity.common.experience import Experience
from trinity.launcher.debug import transcript


class CharTokenizer:
    """Token id i is the character chr(i)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_the_transcript_styles_prompt_trained_and_untrained_tokens():
    # prompt "Q:", then "ab" sampled, "|x|" a tool's reply, "c" sampled again
    tokens = [ord(c) for c in "Q:ab|x|c"]
    exp = Experience(
        tokens=tokens,
        prompt_length=2,
        action_mask=torch.tensor([1, 1, 0, 0, 0, 1], dtype=torch.bool),
    )
    text = transcript(exp, CharTokenizer())
    assert text.plain == "Q:ab|x|c"
    spans = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert spans == [("ab", "bold green"), ("|x|", "yellow"), ("c", "bold green")]
    assert str(text.style) == "dim"  # the prompt (the text's base style)


def test_debug_workflow_runs_one_task_and_saves_its_experiences(tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    out = tmp_path / "exps.jsonl"
    r = CliRunner().invoke(
        app, ["debug", "workflow", "--config", str(cfg), "--task", "3", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "task 3 of 'add'" in r.output and "experience 3: single_turn" in r.output
    exps = [Experience.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(exps) == 4  # repeat_times samples of the one task
    assert all(0 < e.response_length <= 4 and e.reward is not None for e in exps)
    # an eval task is sampled greedily, once
    r = CliRunner().invoke(
        app, ["debug", "workflow", "--config", str(cfg), "--eval", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 1
    bad = CliRunner().invoke(app, ["debug", "workflow", "--config", str(cfg), "--task", "40"])
    assert bad.exit_code == 2 and "the taskset has tasks 0 to 39" in bad.output


def test_debug_workflow_serves_auxiliary_models_in_process(tmp_path, tiny_model_dir):
    """A judge workflow under `trinity debug`: the judge is an in-process engine too."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        "explorer: {auxiliary_models: [{name: judge, model_path: "
        f"{tiny_model_dir}, max_response_tokens: 1}}]}}\n",
    )
    text = cfg.read_text().replace("explorer: {eval_interval: 2, runner_per_model: 16}\n", "")
    text = text.replace(
        "default_reward_fn_type: arithmetic_reward",
        "default_reward_fn_type: arithmetic_reward\n    default_workflow_type: judge_workflow",
    )
    cfg.write_text(text)
    out = tmp_path / "exps.jsonl"
    r = CliRunner().invoke(
        app, ["debug", "workflow", "--config", str(cfg), "--task", "0", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    exps = [Experience.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(exps) == 4
    # a one-token judge reply cannot hold "Score: N" (the tiny tokenizer splits digits off):
    # every answer is a parse failure, excluded
    assert all(e.metrics["judge_parsed"] == 0.0 for e in exps)
    assert all(e.info["excluded"] == "judge_parse_failure" for e in exps)
