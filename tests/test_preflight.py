"""Pre-flight: every broken config in tests/data/broken_configs is refused by both verbs.

Each `*.yaml` there names, in a `# expect: <key path>` comment, the key path its report must
contain. Both `validate` and `run` must exit 2 with that path, print no traceback, start no Ray
and create no run directory. In-process (typer's CliRunner) for speed, plus a few real
subprocess runs of the `trinity` entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from trinity.cli import app
from trinity.config import load_config
from trinity.config.preflight import preflight
from trinity.tasks import TasksetError, load_taskset

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "broken_configs"
BROKEN = sorted(CORPUS.glob("*.yaml"))


def expected_paths(config: Path) -> list[str]:
    lines = config.read_text().splitlines()
    return [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("# expect:")]


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("ray.init was called for a config with problems")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.chdir(ROOT)  # the corpus names its data files relative to the repository


def test_corpus_is_large_and_every_case_names_a_key_path():
    assert len(BROKEN) >= 20
    assert {c.stem for c in BROKEN} >= RUN_SAMPLE
    for config in BROKEN:
        assert expected_paths(config), f"{config.name} has no '# expect: <key path>' line"


# `run` makes `validate`'s check (`cli._check`) in a child process (`trinity check`), a second
# Python with torch per case: the whole corpus goes through `validate`, and a sample through
# `run` shows the child's verdict and every line of its report reach run's caller
RUN_SAMPLE = {"everything_at_once", "adaptive_kl_without_penalty", "dotted_path_import_fails"}
CASES = [(c, "validate") for c in BROKEN] + [(c, "run") for c in BROKEN if c.stem in RUN_SAMPLE]


@pytest.mark.parametrize(("config", "verb"), CASES, ids=[f"{v}-{c.stem}" for c, v in CASES])
def test_broken_config_is_refused_before_anything_starts(config, verb, tmp_path, no_ray):
    ckpt = tmp_path / "ckpt"
    args = [verb, "--config", str(config), "--set", f"checkpoint_root_dir={ckpt}"]
    result = CliRunner().invoke(app, args)
    out = result.output
    assert result.exit_code == 2, out
    for path in expected_paths(config):
        assert f"{path}" in out, f"{path!r} not reported:\n{out}"
    assert "Traceback" not in out
    assert not ckpt.exists()


def test_problem_carries_valid_names_and_suggestion(no_ray):
    result = CliRunner().invoke(
        app, ["validate", "--config", str(CORPUS / "misspelt_kl_loss_fn_args.yaml")]
    )
    assert result.exit_code == 2
    assert (
        "algorithm.kl_loss_fn_args.kl_cof: unknown argument of kl_loss_fn 'k3'; "
        "it accepts: kl_coef (did you mean 'kl_coef'?)"
    ) in result.output


def test_every_bad_row_is_reported_with_file_and_line(no_ray):
    cfg = load_config(CORPUS / "taskset_bad_json_row.yaml")
    messages = [p.message for p in preflight(cfg).problems]
    assert any("bad_json.jsonl:2: invalid JSON" in m for m in messages), messages
    # line 1 and line 3 are fine: one bad row, counted once in the summary
    assert not any(":1:" in m or ":3:" in m for m in messages)
    assert any(m.startswith("1 bad row;") for m in messages)


EXAMPLE_CONFIGS = sorted((ROOT / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("config", EXAMPLE_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_example_config_validates(config, no_ray):
    """Each shipped example passes `trinity validate` as its header says to run it: with its
    folder as a plugin directory when the folder holds the plugin (*.py) it names."""
    plugins = ["--plugin-dir", str(config.parent)] if any(config.parent.glob("*.py")) else []
    result = CliRunner().invoke(app, ["validate", "--config", str(config), *plugins])
    assert result.exit_code == 0, result.output


def test_example_configs_are_found():
    names = {f"{p.parent.name}/{p.stem}" for p in EXAMPLE_CONFIGS}
    assert {"quickstart/quickstart", "real_model/smollm2_grpo", "real_model/smollm2_bench"} <= names


# -- skip_bad_rows ---------------------------------------------------------------------------------


def skip_config(tmp_path: Path, rows: list[str], skip: bool) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(r + "\n" for r in rows))
    cfg = tmp_path / "skip.yaml"
    cfg.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        "buffer:\n  explorer_input:\n"
        "    default_reward_fn_type: arithmetic_reward\n"
        f"    taskset: {{path: {data}, skip_bad_rows: {str(skip).lower()}, "
        "format: {prompt_key: question, response_key: answer}}\n"
    )
    return cfg


ROWS = [
    json.dumps({"question": "1+1=", "answer": "2"}),
    '{"question": "2+2=", "answer": ',  # invalid JSON
    json.dumps({"question": "3+3="}),  # no answer, and arithmetic_reward needs one
    json.dumps({"question": "4+4=", "answer": "8"}),
]


def test_skip_bad_rows_counts_and_skips(tmp_path, no_ray, caplog):
    # without the option: both bad rows are problems
    r = CliRunner().invoke(app, ["validate", "--config", str(skip_config(tmp_path, ROWS, False))])
    assert r.exit_code == 2 and "rows.jsonl:2: invalid JSON" in r.output
    assert "rows.jsonl:3: row has no key 'answer'" in r.output
    # with it: validate passes and says how many rows it will skip
    cfg_path = skip_config(tmp_path, ROWS, True)
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg_path)])
    assert r.exit_code == 0, r.output
    assert "buffer.explorer_input.taskset: 2 bad rows will be skipped" in r.output
    # the runtime's loader (as the explorer calls it) drops the same two rows, with a warning
    storage = load_config(cfg_path).buffer.explorer_input.taskset
    with caplog.at_level("WARNING"):
        tasks = load_taskset(storage, default_reward_fn_type="arithmetic_reward")
    assert [t.prompt for t in tasks] == ["1+1=", "4+4="]
    assert [t.index for t in tasks] == [0, 1]
    assert "skipped 2 bad rows" in caplog.text
    # and without the option the loader refuses at the first bad row, naming it
    with pytest.raises(TasksetError, match=r"rows\.jsonl:2: invalid JSON"):
        load_taskset(storage.model_copy(update={"skip_bad_rows": False}))


def test_skip_bad_rows_with_nothing_left_is_a_problem(tmp_path, no_ray):
    r = CliRunner().invoke(
        app, ["validate", "--config", str(skip_config(tmp_path, ROWS[1:3], True))]
    )
    assert r.exit_code == 2
    assert "no tasks to run: every row is bad" in r.output


def test_a_format_key_no_row_has_is_said_once_without_advice_to_skip(tmp_path, no_ray):
    """Every row lacking the same key is the config's mistake (here `format.prompt_key` left at
    its default `prompt`): one problem naming the key and the keys the rows do have, not one per
    row with advice to skip them all."""
    rows = [json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) for i in range(16)]
    cfg = skip_config(tmp_path, rows, False)
    cfg.write_text(cfg.read_text().replace("prompt_key: question, ", ""))
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg)])
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert out.count("row has no key 'prompt' (format.prompt_key)") == 1, out
    assert "every row (16) is bad the same way: " in out
    assert "the row's keys are ['answer', 'question']" in out
    assert "skip_bad_rows" not in out


# -- the real entry point --------------------------------------------------------------------------


def trinity(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRINITY_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "name", ["unknown_algorithm_type", "model_path_missing", "taskset_bad_json_row"]
)
def test_entry_point_run_exits_2_and_starts_nothing(name, tmp_path):
    config = CORPUS / f"{name}.yaml"
    ckpt = tmp_path / "ckpt"
    r = trinity(
        "run", "--config", str(config), "--set", f"checkpoint_root_dir={ckpt}", tmp_path=tmp_path
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    for path in expected_paths(config):
        assert path in out
    assert "Traceback" not in out
    assert not ckpt.exists()
    assert not (tmp_path / "cache").exists()  # no tiny model was built either


# -- user code and notes ---------------------------------------------------------------------------


def test_user_module_failing_at_import_is_a_problem(tmp_path, monkeypatch, no_ray):
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(CORPUS / "unknown_reward_fn.yaml")
    inp = cfg.buffer.explorer_input.model_copy(
        update={"default_reward_fn_type": "broken_rewards.score"}
    )
    cfg = cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"explorer_input": inp})})
    [problem] = preflight(cfg).problems
    assert problem.path == "buffer.explorer_input.default_reward_fn_type"
    assert "RuntimeError: boom at import" in problem.message


@pytest.mark.parametrize("verb", ["validate", "run"])
def test_not_applicable_notes_printed_by_both_verbs(verb, tmp_path, no_ray):
    # a config with a problem, so that `run` stops after printing the notes (`run` checks in
    # a child process, whose output it passes on)
    args = [verb, "--config", str(CORPUS / "serve_tool_call_parser_typo.yaml")]
    args += ["--set", "explorer.rollout_model.gpu_memory_utilization=0.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert (
        "notes:\n  explorer.rollout_model.gpu_memory_utilization: not applicable here (vLLM"
    ) in result.output


def test_readers_collect_bad_rows_instead_of_raising(tmp_path):
    from trinity.tasks import read_located_rows

    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"q": 1}\n{"q": \n"text"\n{"q": 4}\n')
    bad: list[str] = []
    rows = read_located_rows(jsonl, bad_rows=bad)
    assert [loc for _, loc in rows] == [f"{jsonl}:1", f"{jsonl}:4"]
    assert [b.split(": ", 1)[0] for b in bad] == [f"{jsonl}:2", f"{jsonl}:3"]
    js = tmp_path / "t.json"
    js.write_text('[{"q": 1}, 2, {"q": 3}]')
    bad = []
    assert len(read_located_rows(js, bad_rows=bad)) == 2
    assert bad == [f"{js} row 1: row is a int, expected a JSON object"]
    csv = tmp_path / "t.csv"
    csv.write_text("q,a\n1,2\n3,4,5\n6,7\n")
    bad = []
    assert [r for r, _ in read_located_rows(csv, bad_rows=bad)] == [
        {"q": "1", "a": "2"},
        {"q": "6", "a": "7"},
    ]
    assert bad == [f"{csv}:3: row has more cells than the header has columns"]


# -- every problem at once, Trinity-RFT's non-features (issue 18, findings 12 and 13) ------------


def test_schema_problems_do_not_hide_preflight_problems(no_ray):
    result = CliRunner().invoke(
        app, ["validate", "--config", str(CORPUS / "everything_at_once.yaml")]
    )
    assert result.exit_code == 2
    assert "4 problems" in result.output  # one report: schema, cross-field and pre-flight
    assert "unknown algorithm_type 'grpoo'" in result.output
    assert "no such folder '/nonexistent/trinity-test-model'" in result.output


def test_reward_fn_task_fields_are_required_with_file_and_line(no_ray):
    cfg = load_config(CORPUS / "reward_fn_task_fields_missing.yaml")
    messages = [p.message for p in preflight(cfg).problems]
    assert any(
        m.startswith("tests/data/broken_configs/data/countdown_no_fields.jsonl:1: row has no "
                     "'numbers', 'target', which reward fn 'countdown_reward' reads")
        for m in messages
    ), messages  # fmt: skip
    assert any("countdown_no_fields.jsonl:2: row has no 'target'," in m for m in messages)


def test_trinity_rft_derived_and_unread_args_are_accepted_with_a_note():
    from trinity.config.preflight import _algorithm_problems

    cfg = load_config(ROOT / "tests/data/trinity_configs/mix_chord.yaml")
    assert _algorithm_problems(cfg.algorithm, ["sft_dataset"]) == []
    # the effective config holds what the trainer reads; the derived keys are noted, not read
    assert "train_batch_size_usual" not in cfg.algorithm.policy_loss_fn_args
    assert cfg.algorithm.policy_loss_fn_args["mu_peak"] == 0.5
    assert cfg.algorithm.kl_loss_fn_args == {}
    notes = preflight(cfg).notes
    assert (
        "algorithm.policy_loss_fn_args.train_batch_size_usual: derived here from the batch "
        "settings (Trinity-RFT fills it too); the value written is not read"
    ) in notes
    assert (
        "algorithm.kl_loss_fn_args.kl_coef: not applicable here (kl_loss_fn is 'none': unread)"
        in notes
    )


def test_kl_args_under_kl_loss_fn_none_are_accepted(tmp_path, no_ray):
    cfg = tmp_path / "kl.yaml"
    cfg.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        "algorithm: {algorithm_type: grpo, kl_loss_fn: none, kl_loss_fn_args: {kl_coef: 0.001}}\n"
        "buffer:\n  explorer_input:\n    taskset: {storage_type: synthetic, path: arithmetic, "
        "format: {prompt_key: question, response_key: answer}}\n"
    )
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "algorithm.kl_loss_fn_args.kl_coef: not applicable here" in r.output


def test_message_list_under_prompt_key_is_read_as_messages(tmp_path, no_ray):
    rows = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]
    rows.write_text(json.dumps({"prompt": chat, "answer": "2"}) + "\n")
    cfg = tmp_path / "chat.yaml"
    cfg.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        f"buffer:\n  explorer_input:\n    taskset: {{path: {rows}, "
        "format: {prompt_key: prompt, response_key: answer}}\n"
    )
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    [task] = load_taskset(load_config(cfg).buffer.explorer_input.taskset)
    assert task.messages == chat and task.prompt is None


def test_train_from_a_queue_needs_no_step_count(no_ray):
    from trinity.config import resolve

    cfg = load_config(ROOT / "tests/data/trinity_configs/train_from_queue_until_closed.yaml")
    assert preflight(cfg).problems == []
    r = resolve(cfg)
    assert r.total_steps is None and "until every writer has closed" in r.total_steps_source


def test_staged_config_with_problems_everywhere_is_one_report(tmp_path, no_ray):
    cfg = tmp_path / "staged.yaml"
    cfg.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        "algorithm: {algorithm_type: grpoo}\n"
        "stages:\n"
        "  - {stage_name: a, algorithm: {repeat_times: 0}}\n"
        "  - {stage_name: b, data_processor: {experience_pipeline: {input_save_path: x.jsonl}}}\n"
    )
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = [ln.strip() for ln in r.output.splitlines() if ln.startswith("  ")]
    # base (cross-field and pre-flight), an invalid stage, and a valid stage's refusal; once each
    assert sorted(ln.split(":")[0] for ln in lines) == [
        "algorithm.algorithm_type",
        "buffer.explorer_input.taskset",
        "stages[0].algorithm.repeat_times",
        "stages[1].data_processor.experience_pipeline.input_save_path",
    ]


def test_a_stage_s_note_is_printed_once_under_its_stage(tmp_path, no_ray):
    cfg = tmp_path / "staged.yaml"
    cfg.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        "buffer: {explorer_input: {taskset: {storage_type: synthetic, path: arithmetic}}}\n"
        "stages:\n"
        "  - {stage_name: a, explorer: {rollout_model: {enforce_eager: false}}}\n"
    )
    notes = preflight(load_config(cfg)).notes
    assert [n.split(":")[0] for n in notes] == ["stages[0].explorer.rollout_model.enforce_eager"]
