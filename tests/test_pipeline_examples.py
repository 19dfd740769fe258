"""Trinity-RFT's two data-pipeline examples (copied to tests/data/trinity_configs/, data pointed at
tests/data/gsm8k_tiny) validate and run 2 steps without Data-Juicer, tiny models substituted for
the policy and the judge. A random-init judge gives no score, so the LLM filters here keep the
unscored rows (`keep_unscored`): the run shows the plumbing, not the filtering (the filtering by
score is tests/test_task_pipeline.py's, with a scripted judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_e2e import run_trinity

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "trinity_configs"


def tiny_copy(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """The corpus config `name` on tiny models and CPU-sized batches, written under tmp_path."""
    cfg = yaml.safe_load((CONFIGS / name).read_text())
    cfg["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    cfg["model"] = {"model_path": "tiny://1m?seed=0", "max_response_tokens": 8}
    cfg["algorithm"]["repeat_times"] = 2
    cfg.pop("cluster")
    cfg["synchronizer"] = {"sync_interval": 1}
    cfg["trainer"] = {"micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False, "save_interval": 0}
    buf = cfg["buffer"]
    buf.update(batch_size=2, total_steps=2)
    buf["trainer_input"]["experience_buffer"] = {"name": "exp", "storage_type": "queue"}
    ex = cfg["explorer"]
    ex.update(eval_interval=0, eval_on_startup=False, runner_per_model=4)
    ex["rollout_model"] = {"engine_num": 1}
    ex["auxiliary_models"][0].update(model_path="tiny://1m?seed=1", engine_num=1)
    return tmp_path / name, cfg


def write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics(tmp_path: Path, cfg: dict) -> list[dict]:
    f = tmp_path / "ckpt" / cfg["project"] / cfg["name"] / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()]


@pytest.mark.slow  # a whole run
def test_the_task_pipeline_example_runs_and_explores_its_output(tmp_path):
    path, cfg = tiny_copy("grpo_gsm8k_task_pipeline.yaml", tmp_path)
    tp = cfg["data_processor"]["task_pipeline"]
    [op] = tp["operators"]
    op["args"]["keep_unscored"] = True
    tp["operators"].append({"name": "pass_rate_filter"})  # ours: the rollout model's pass rate
    tp["top_k"] = 4
    r = run_trinity(write(path, cfg), timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = tmp_path / "ckpt" / cfg["project"] / cfg["name"] / "task_pipeline" / "tasks.jsonl"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    raw = (ROOT / "tests/data/gsm8k_tiny/train.jsonl").read_text().splitlines()
    assert all(r["pass_rate"] in (0.0, 0.5, 1.0) for r in rows)  # 2 samples of 0/1 reward
    assert [{"question": r["question"], "answer": r["answer"]} for r in rows] == [
        json.loads(x) for x in raw[:4]
    ]  # no weights: input order, the first top_k
    assert "task pipeline wrote" in r.stdout
    steps = [x for x in metrics(tmp_path, cfg) if "rollout/tasks" in x]
    assert len(steps) == 2 and all(x["rollout/tasks"] == 2 for x in steps)


@pytest.mark.slow  # a whole run
def test_the_experience_pipeline_example_runs_its_recipe_natively(tmp_path):
    path, cfg = tiny_copy("grpo_gsm8k_experience_pipeline.yaml", tmp_path)
    recipe = yaml.safe_load((ROOT / "tests/data/dj_recipes/dj_scoring_exp.yaml").read_text())
    recipe["process"][0]["llm_quality_score_filter"]["keep_unscored"] = True
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    ops = cfg["data_processor"]["experience_pipeline"]["operators"]
    ops[0]["args"]["config_path"] = str(recipe_path)
    r = run_trinity(write(path, cfg), timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    steps = [x for x in metrics(tmp_path, cfg) if "rollout/tasks" in x]
    assert len(steps) == 2
    for x in steps:
        assert x["experience_pipeline/0_data_juicer/dropped"] == 0  # unscored rows kept
        assert (
            x["experience_pipeline/0_llm_quality_score_filter/score_failed"] == 4
        )  # 2 tasks x 2 samples, unscored


@pytest.mark.parametrize(
    "name", ["grpo_gsm8k_task_pipeline.yaml", "grpo_gsm8k_experience_pipeline.yaml"]
)
def test_the_examples_validate_on_tiny_models(name, tmp_path, monkeypatch):
    from trinity.config import load_config
    from trinity.config.preflight import preflight

    monkeypatch.chdir(ROOT)
    path, cfg = tiny_copy(name, tmp_path)
    report = preflight(load_config(write(path, cfg)))
    assert report.problems == []
    assert any("service.data_juicer" in n for n in report.notes)
