"""The task pipeline (`data_processor.task_pipeline`): native Data-Juicer ops against hand-derived
values, priority / top-k, the LLM-scored filter with a scripted judge, Data-Juicer recipes
(native, refused, and through a fake `dj-process` subprocess) and what `validate` says."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from fake_engine import FakeJudgeEngine
from test_one_process import _cfg

from trinity.common.rollout import SamplingParams
from trinity.config.buffer_schema import StorageConfig
from trinity.config.preflight import preflight
from trinity.data.recipes import DJ_ENV, RecipeError, RecipeRunner, read_recipe
from trinity.data.task_ops import OpContext, build_row_operator
from trinity.data.task_pipeline import ranked, run_task_pipeline
from trinity.explorer.auxiliary import AuxiliaryModel, AuxiliaryModels
from trinity.models import load_tokenizer
from trinity.tasks import load_taskset


def run(name: str, rows: list[dict], models=None, pass_rates=None, **args):
    ctx = OpContext(models=models, pass_rates=pass_rates)
    return asyncio.run(build_row_operator(name, args).process(rows, ctx))


def q(*texts: str) -> list[dict]:
    return [{"question": t, "i": i} for i, t in enumerate(texts)]


# -- simple ops --------------------------------------------------------------------------------


def test_text_length_filter_keeps_min_to_max_characters_inclusive():
    kept, m = run(
        "text_length_filter", q("ab", "abc", "abcde", "abcdef"), min_len=3, max_len=5,
        text_key="question",
    )  # fmt: skip
    assert [r["i"] for r in kept] == [1, 2]
    assert [r["text_len"] for r in kept] == [3, 5]
    assert m["filtered_count"] == 2


def test_words_num_filter_counts_whitespace_words():
    kept, _ = run("words_num_filter", q("one", "one two", "a b  c\td"), min_num=2, max_num=3,
                  text_key="question")  # fmt: skip
    assert [r["i"] for r in kept] == [1]  # "a b  c\td" has 4 words


def test_document_deduplicator_drops_exact_copies_keeping_the_first():
    rows = q("What is 2+2?", "what is 2+2?", "What is 2+2?", "What is 2 + 2 ?!")
    kept, m = run("document_deduplicator", [dict(r) for r in rows], text_key="question")
    assert [r["i"] for r in kept] == [0, 1, 3] and m["duplicate_count"] == 1
    kept, _ = run("document_deduplicator", [dict(r) for r in rows], text_key="question",
                  lowercase=True)  # fmt: skip
    assert [r["i"] for r in kept] == [0, 3]
    kept, _ = run("document_deduplicator", [dict(r) for r in rows], text_key="question",
                  lowercase=True, ignore_non_character=True)  # fmt: skip
    assert [r["i"] for r in kept] == [0]  # "whatis22" every time


def test_a_missing_text_column_is_named():
    with pytest.raises(KeyError, match="no 'text' column"):
        run("text_length_filter", q("abc"))


def test_priority_ranks_by_weighted_sum_and_keeps_top_k():
    rows = [
        {"id": "a", "llm_difficulty_score": 0.2, "llm_quality_score": 0.9},  # 2*.2+.9 = 1.3
        {"id": "b", "llm_difficulty_score": 0.8, "llm_quality_score": 0.1},  # 1.6+.1 = 1.7
        {"id": "c", "llm_difficulty_score": 0.5, "llm_quality_score": 0.3},  # 1.0+.3 = 1.3
        {"id": "d", "llm_difficulty_score": 0.0, "llm_quality_score": 0.0},  # 0
    ]
    out = ranked(rows, {"difficulty": 2.0, "quality": 1.0}, top_k=3)
    assert [r["id"] for r in out] == ["b", "a", "c"]  # a before c: the tie keeps input order
    assert [r["id"] for r in ranked(rows, {}, top_k=2)] == ["a", "b"]
    with pytest.raises(ValueError, match="'usage' needs a 'usage' column"):
        ranked(rows, {"usage": 1.0}, top_k=-1)


def test_pass_rate_filter_writes_the_rollout_model_s_pass_rate_and_keeps_the_range():
    async def pass_rates(rows):  # the explorer's: here, scripted per row
        return [{"a": 0.0, "b": 0.5, "c": 1.0, "d": None}[r["question"]] for r in rows]

    rows = [{"question": x} for x in "abcd"]
    kept, m = run("pass_rate_filter", rows, pass_rates=pass_rates, min_pass_rate=0.25,
                  max_pass_rate=1.0)  # fmt: skip
    assert [r["question"] for r in kept] == ["b", "c"]
    assert [r["pass_rate"] for r in rows] == [0.0, 0.5, 1.0, None]
    assert m == {"filtered_count": 2.0, "failed": 1.0, "pass_rate/mean": 0.5}
    with pytest.raises(RuntimeError, match="needs the rollout model"):
        run("pass_rate_filter", rows)
    with pytest.raises(ValueError, match="min_pass_rate <= max_pass_rate"):
        run("pass_rate_filter", rows, pass_rates=pass_rates, min_pass_rate=0.8, max_pass_rate=0.2)


# -- the LLM-scored filter -----------------------------------------------------------------------

SCORES = {"easy": 1, "medium": 5, "hard": 9}  # the judge's raw score, out of 10


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def judge_models(tokenizer, name="judge"):
    """A served auxiliary model `name` whose reply scores the question it is shown."""
    engine = FakeJudgeEngine(tokenizer, None)

    def reply(_shown):
        word = re.search(r"Question: (\w+)", engine.prompts[-1]).group(1)
        return f"Looks {word}.\nScore: {SCORES[word]}" if word in SCORES else "no idea"

    engine.reply = reply
    model = AuxiliaryModel(
        index=0, name=name, model_path="judge-model", client=engine, tokenizer=tokenizer,
        defaults=SamplingParams(n=1, max_tokens=64), template_kwargs={},
        max_prompt_tokens=None, seed=0,
    )  # fmt: skip
    return AuxiliaryModels([model], [model]), engine


def test_llm_difficulty_filter_scores_each_row_with_the_named_auxiliary_model(tokenizer):
    models, engine = judge_models(tokenizer)
    rows = [{"question": w, "answer": "x"} for w in ("easy", "hard", "medium", "odd")]
    kept, m = run(
        "llm_difficulty_score_filter", rows, models, api_or_hf_model="judge", min_score=0.4,
        input_keys=["question", "answer"], field_names=["Question", "Answer"],
    )  # fmt: skip
    assert [r["question"] for r in kept] == ["hard", "medium"]
    assert [r["llm_difficulty_score"] for r in rows] == [0.1, 0.9, 0.5, None]
    assert m["filtered_count"] == 2 and m["score_failed"] == 1
    assert m["llm_difficulty_score/mean"] == pytest.approx(0.5)
    assert "Answer: x" in engine.prompts[0]


def test_llm_filter_naming_an_unserved_model_says_how_to_serve_it(tokenizer):
    models, _ = judge_models(tokenizer)
    with pytest.raises(
        LookupError, match=r"'qwen': no auxiliary model 'qwen'; served: 0 \('judge'\)"
    ):
        run("llm_quality_score_filter", q("easy"), models, api_or_hf_model="qwen")
    with pytest.raises(LookupError, match=r"explorer\.auxiliary_models with name: qwen"):
        run("llm_quality_score_filter", q("easy"), None, api_or_hf_model="qwen")


# -- the pipeline ---------------------------------------------------------------------------------


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


JUDGE_ARGS = {"api_or_hf_model": "judge", "min_score": 0.0, "input_keys": ["question"],
              "field_names": ["Question"]}  # fmt: skip


def test_the_pipeline_writes_a_taskset_the_explorer_reads(tmp_path, tokenizer):
    raw = [
        {"question": "easy one", "answer": "1", "junk": 0},
        {"question": "hard one", "answer": "2", "junk": 0},
        {"question": "hard one", "answer": "2", "junk": 0},  # a copy
        {"question": "medium one", "answer": "3", "junk": 0},
        {"question": "hi", "answer": "4", "junk": 0},  # too short
    ]
    cfg = _cfg(
        data_processor={
            "task_pipeline": {
                "inputs": [write_rows(tmp_path / "raw.jsonl", raw)],
                "operators": [
                    {"name": "text_length_filter", "args": {"min_len": 3, "text_key": "question"}},
                    {"name": "document_deduplicator", "args": {"text_key": "question"}},
                    {"name": "llm_difficulty_score_filter", "args": JUDGE_ARGS},
                ],
                "target_fields": ["question", "answer"],
                "priority_weights": {"difficulty": 1.0},
                "top_k": 2,
            }
        }
    )
    models, engine = judge_models(tokenizer)
    out, metrics = asyncio.run(run_task_pipeline(cfg, tmp_path / "run", OpContext(models)))
    assert out == tmp_path / "run" / "task_pipeline" / "tasks.jsonl"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows == [
        {"question": "hard one", "answer": "2", "llm_difficulty_score": 0.9},
        {"question": "medium one", "answer": "3", "llm_difficulty_score": 0.5},
    ]
    assert metrics["task_pipeline/input_rows"] == 5 and metrics["task_pipeline/output_rows"] == 2
    assert metrics["task_pipeline/0_text_length_filter/dropped"] == 1
    assert metrics["task_pipeline/1_document_deduplicator/dropped"] == 1
    storage = StorageConfig.model_validate(
        {"path": str(out), "format": {"prompt_key": "question", "response_key": "answer"}}
    )
    tasks = load_taskset(storage)
    assert [t.prompt for t in tasks] == ["hard one", "medium one"]
    assert tasks[0].raw["llm_difficulty_score"] == 0.9  # a column a curriculum can read
    # the same settings over the same inputs: the file is reused, the judge not asked again
    calls = len(engine.calls)
    again, metrics = asyncio.run(run_task_pipeline(cfg, tmp_path / "run", OpContext(models)))
    assert again == out and metrics == {"task_pipeline/reused": 1.0} and len(engine.calls) == calls
    cfg.data_processor.task_pipeline.top_k = 1  # other settings: run again
    asyncio.run(run_task_pipeline(cfg, tmp_path / "run", OpContext(models)))
    assert len(engine.calls) > calls and len(out.read_text().splitlines()) == 1


# -- recipes and Data-Juicer ------------------------------------------------------------------------


def recipe(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(textwrap.dedent(body))
    return p


def test_a_recipe_of_native_ops_runs_without_data_juicer(tmp_path, monkeypatch):
    monkeypatch.delenv(DJ_ENV, raising=False)
    p = recipe(tmp_path, """
        project_name: x
        np: 4
        process:
          - text_length_filter: {min_len: 3, text_key: question}
          - document_deduplicator: {text_key: question}
        """)  # fmt: skip
    runner = RecipeRunner(read_recipe(p))
    kept, m = asyncio.run(runner.process(q("ab", "abc", "abc", "abcd"), OpContext()))
    assert [r["i"] for r in kept] == [1, 3]
    assert m == {"0_text_length_filter/dropped": 1.0, "0_text_length_filter/filtered_count": 1.0,
                 "1_document_deduplicator/dropped": 1.0,
                 "1_document_deduplicator/duplicate_count": 1.0}  # fmt: skip


def test_a_recipe_with_an_op_not_built_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv(DJ_ENV, raising=False)
    p = recipe(tmp_path, "process:\n  - language_id_score_filter: {lang: en}\n")
    runner = RecipeRunner(read_recipe(p))  # validate refuses it; a run refuses it as well
    with pytest.raises(
        RecipeError, match=f"'language_id_score_filter' not built.*make setup-data-juicer.*{DJ_ENV}"
    ):
        asyncio.run(runner.process(q("abc"), OpContext()))


FAKE_DJ = """#!{python}
# A stand-in for Data-Juicer's dj-process: --help answers; --config runs the recipe's one op,
# keep_flagged (rows whose `flag` is true), over dataset_path into export_path.
import json, sys, time, yaml
if sys.argv[1:] == ["--help"]:
    sys.exit({help_rc})
cfg = yaml.safe_load(open(sys.argv[2]))
time.sleep({sleep})
[op] = cfg["process"]
assert list(op) == ["keep_flagged"], op
rows = [json.loads(x) for x in open(cfg["dataset_path"])]
with open(cfg["export_path"], "w") as f:
    for r in rows:
        if r["flag"]:
            f.write(json.dumps(r) + "\\n")
"""


def fake_dj(tmp_path: Path, help_rc: int = 0, sleep: float = 0.0) -> str:
    exe = tmp_path / "dj-process"
    exe.write_text(FAKE_DJ.format(python=sys.executable, help_rc=help_rc, sleep=sleep))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_a_recipe_not_built_here_runs_through_the_configured_data_juicer(tmp_path, monkeypatch):
    p = recipe(tmp_path, "process:\n  - keep_flagged: {}\n")
    rows = [{"i": 0, "flag": True}, {"i": 1, "flag": False}, {"i": 2, "flag": True}]
    monkeypatch.setenv(DJ_ENV, fake_dj(tmp_path))
    kept, _ = asyncio.run(RecipeRunner(read_recipe(p)).process(rows, OpContext()))
    assert kept == [rows[0], rows[2]]
    monkeypatch.setenv(DJ_ENV, fake_dj(tmp_path, help_rc=3))
    with pytest.raises(RecipeError, match=r"health check failed .* exited 3"):
        asyncio.run(RecipeRunner(read_recipe(p)).process(rows, OpContext()))
    monkeypatch.setenv(DJ_ENV, fake_dj(tmp_path, sleep=5))
    with pytest.raises(RecipeError, match="over its timeout"):
        asyncio.run(RecipeRunner(read_recipe(p), timeout_s=0.5).process(rows, OpContext()))


# -- validate ---------------------------------------------------------------------------------------


def test_validate_checks_the_task_pipeline(tmp_path, monkeypatch):
    monkeypatch.delenv(DJ_ENV, raising=False)
    raw = write_rows(tmp_path / "raw.jsonl", [{"question": "a", "answer": "b"}])
    bad_recipe = recipe(tmp_path, "process:\n  - language_id_score_filter: {lang: en}\n")

    def problems(**tp):
        cfg = _cfg(data_processor={"task_pipeline": {"inputs": [raw], **tp}})
        at = "data_processor.task_pipeline"
        return {p.path: p.message for p in preflight(cfg).problems if p.path.startswith(at)}

    assert problems(operators=[{"name": "text_length_filter", "args": {"text_key": "q"}}]) == {}
    said = problems(
        inputs=[str(tmp_path / "none.jsonl")],
        operators=[
            {"name": "text_lenght_filter"},
            {"name": "text_length_filter", "args": {"min_length": 3}},
            {"name": "llm_difficulty_score_filter", "args": {"api_or_hf_model": "qwen"}},
        ],
    )
    at = "data_processor.task_pipeline"
    assert "taskset path not found" in said[f"{at}.inputs[0]"]
    assert "text_length_filter" in said[f"{at}.operators[0].name"]  # the close match
    assert "min_length" in said[f"{at}.operators[1].args"]
    assert "api_or_hf_model 'qwen' names no auxiliary model" in said[f"{at}.operators"]
    said = problems(config_path=str(bad_recipe))
    assert "'language_id_score_filter' not built natively" in said[f"{at}.config_path"]
    assert DJ_ENV in said[f"{at}.config_path"]
    monkeypatch.setenv(DJ_ENV, fake_dj(tmp_path))  # Data-Juicer runs the recipe: accepted
    assert problems(config_path=str(bad_recipe)) == {}
    monkeypatch.setenv(DJ_ENV, fake_dj(tmp_path, help_rc=1))  # ... if it answers
    said = problems(config_path=str(bad_recipe))
    assert "health check failed" in said[f"{at}.config_path"]


# -- the experience pipeline's data_juicer operator ----------------------------------------------


def test_data_juicer_experience_operator_scores_then_shaping_reads_the_score(tmp_path, tokenizer):
    """Trinity-RFT's experience-pipeline example: llm_quality_score_filter in a recipe, then
    reward_shaping_mapper on `llm_quality_score`."""
    import torch

    from trinity.common.experience import EID, Experience
    from trinity.data.pipeline import ExperiencePipeline

    p = recipe(tmp_path, """
        process:
          - llm_quality_score_filter:
              api_or_hf_model: judge
              min_score: 0.3
              input_keys: [prompt_text, response_text]
              field_names: [Question, Response]
        """)  # fmt: skip
    shaping = {"reward_shaping_configs": [
        {"stats_key": "llm_quality_score", "op_type": "ADD", "weight": 1.0}]}  # fmt: skip
    pipeline = ExperiencePipeline(
        [("data_juicer", {"config_path": str(p)}), ("reward_shaping_mapper", shaping)]
    )
    exps = [
        Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=1, reward=r, prompt_text=w,
                   response_text="r", eid=EID(task=i))
        for i, (w, r) in enumerate([("easy", 1.0), ("hard", 0.0), ("medium", 1.0)])
    ]  # fmt: skip
    models, _ = judge_models(tokenizer)
    asyncio.run(pipeline.prepare(exps, OpContext(models=models)))
    kept, m = pipeline.run(list(exps))
    assert [e.prompt_text for e in kept] == ["hard", "medium"]  # easy: 0.1 < 0.3
    assert [e.reward for e in kept] == pytest.approx([0.9, 1.5])
    assert exps[0].info["llm_quality_score"] == pytest.approx(0.1)
    assert m["experience_pipeline/0_data_juicer/dropped"] == 1


def test_validate_refuses_a_data_juicer_recipe_op_not_built(tmp_path, monkeypatch):
    monkeypatch.delenv(DJ_ENV, raising=False)
    p = recipe(tmp_path, "process:\n  - language_id_score_filter: {lang: en}\n")
    cfg = _cfg(
        data_processor={
            "experience_pipeline": {
                "operators": [{"name": "data_juicer", "args": {"config_path": str(p)}}]
            }
        }
    )
    said = {p.path: p.message for p in preflight(cfg).problems}
    why = said["data_processor.experience_pipeline.operators[0].args"]
    assert "'language_id_score_filter' not built natively" in why and DJ_ENV in why


@pytest.mark.slow  # a real Data-Juicer: about 35 s; only where one is installed
@pytest.mark.skipif(
    not os.environ.get("TRINITY_TEST_DJ_PROCESS"),
    reason="set TRINITY_TEST_DJ_PROCESS to a real dj-process (make setup-data-juicer)",
)
def test_a_real_data_juicer_runs_a_recipe_through_the_subprocess(monkeypatch):
    monkeypatch.setenv(DJ_ENV, os.environ["TRINITY_TEST_DJ_PROCESS"])
    rows = [
        {"text": "ab", "i": 0},  # shorter than 5
        {"text": "hello world, a longer text", "i": 1},  # 26 > 20 characters
        {"text": "mail me: a@b.com", "i": 2},  # 16: kept, its e-mail address cleaned
    ]
    ops = [("text_length_filter", {"min_len": 5, "max_len": 20}), ("clean_email_mapper", {})]
    kept, _ = asyncio.run(RecipeRunner(ops, timeout_s=600).process(rows, OpContext()))
    assert kept == [{"text": "mail me: ", "i": 2}]
