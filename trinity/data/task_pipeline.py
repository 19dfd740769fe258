"""The task pipeline: raw datasets turned into the taskset a stage explores, before it explores.

    data_processor:
      task_pipeline:
        inputs: [data/gsm8k/train.jsonl]
        operators:
          - {name: document_deduplicator, args: {text_key: question}}
          - {name: llm_difficulty_score_filter, args: {api_or_hf_model: judge, min_score: 0.0,
             input_keys: [question, answer], field_names: [Question, Answer]}}
        target_fields: [question, answer]
        priority_weights: {difficulty: 1.0}
        top_k: 100

1. read every row of `inputs` (`tasks.files.read_rows`)
2. apply the `operators` in order (`task_ops`: Data-Juicer's names and args), or the recipe
   `config_path` (`recipes`)
3. rank by priority: sum of weight × column over `priority_weights` (`difficulty` reads the
   `llm_difficulty_score` column, `quality` `llm_quality_score`, any other key its own column),
   highest first (ties keep input order); keep the first `top_k` (-1: all)
4. keep the `target_fields` columns (empty: all) plus the scores, and write the rows as jsonl to
   `output.path` or `<run folder>/task_pipeline/tasks.jsonl`; the stage's explorer reads that
   file as `buffer.explorer_input.taskset` (its format and workflow settings stay). A file the
   same settings wrote over the same inputs (`fingerprint`) is reused, not rewritten: a resumed
   run's cursor counts tasks of the list it explored.

The explorer runs it (`Explorer.prepare`) once its auxiliary models are served, so an LLM
operator scores with one of them (`api_or_hf_model`: an `explorer.auxiliary_models` name).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from trinity.data.recipes import RecipeRunner, read_recipe
from trinity.data.task_ops import OpContext, build_row_operator
from trinity.tasks.files import read_rows

ALIASES = {"difficulty": "llm_difficulty_score", "quality": "llm_quality_score"}
SCORE_COLUMNS = ("llm_difficulty_score", "llm_quality_score", "pass_rate")


def pipeline_ops(tp: Any) -> list[tuple[str, dict[str, Any]]]:
    """The pipeline's (op name, args): the recipe's when `config_path` is set."""
    if tp.config_path:
        return read_recipe(tp.config_path)
    return [(op.name, dict(op.args)) for op in tp.operators]


def ranked(rows: list[dict], weights: dict[str, float], top_k: int) -> list[dict]:
    """`rows` by descending weighted priority (stable), the first `top_k` (-1: all)."""
    if weights:

        def priority(row: dict) -> float:
            total = 0.0
            for key, w in weights.items():
                col = key if key in row else ALIASES.get(key, key)
                value = row.get(col)
                if value is None:
                    raise ValueError(
                        f"task_pipeline.priority_weights: {key!r} needs a {col!r} column; a row "
                        f"has {sorted(row)} (an operator such as llm_difficulty_score_filter "
                        "writes it)"
                    )
                total += w * float(value)
            return total

        rows = sorted(rows, key=priority, reverse=True)
    return rows if top_k < 0 else rows[:top_k]


def output_path(cfg: Any, run_dir: str | Path) -> Path:
    tp = cfg.data_processor.task_pipeline
    if tp.output is not None and tp.output.path:
        return Path(tp.output.path)
    return Path(run_dir) / "task_pipeline" / "tasks.jsonl"


def fingerprint(tp: Any) -> str:
    """The pipeline's settings and its inputs' sizes and times: an output written under the
    same fingerprint is reused (a resumed run explores the tasks its cursor counted)."""
    inputs = []
    for path in tp.inputs:
        p = Path(path)
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        inputs += [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
    recipe = Path(tp.config_path).read_text() if tp.config_path else None
    return json.dumps([tp.model_dump(mode="json"), inputs, recipe], sort_keys=True, default=str)


async def run_task_pipeline(cfg: Any, run_dir: str | Path, ctx: OpContext) -> tuple[Path, dict]:
    """Steps 1-4 of the module doc; the file written and the pipeline's metrics. `ctx`: the
    auxiliary models and the rollout model's pass rates (`Explorer._row_pass_rates`). An output
    the same settings over the same inputs wrote is reused (`task_pipeline/reused` 1)."""
    tp = cfg.data_processor.task_pipeline
    out = output_path(cfg, run_dir)
    stamp = out.with_name(out.name + ".fingerprint.json")
    key = fingerprint(tp)
    if out.is_file() and stamp.is_file() and stamp.read_text() == key:
        return out, {"task_pipeline/reused": 1.0}
    t0 = time.perf_counter()
    rows: list[dict] = []
    for path in tp.inputs:
        rows += read_rows(path)
    metrics: dict[str, float] = {"task_pipeline/input_rows": float(len(rows))}
    ops = pipeline_ops(tp)
    if tp.config_path:
        rows, own = await RecipeRunner(ops).process(rows, ctx)
        metrics.update({f"task_pipeline/{k}": v for k, v in own.items()})
    else:
        for i, (name, args) in enumerate(ops):
            before = len(rows)
            rows, own = await build_row_operator(name, args).process(rows, ctx)
            metrics[f"task_pipeline/{i}_{name}/dropped"] = float(before - len(rows))
            metrics.update({f"task_pipeline/{i}_{name}/{k}": v for k, v in own.items()})
    rows = ranked(rows, dict(tp.priority_weights), tp.top_k)
    if tp.target_fields:
        keep = set(tp.target_fields) | set(SCORE_COLUMNS)
        rows = [{k: v for k, v in r.items() if k in keep} for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    # whole files only: explorers of one run (mode explore) may write it at once
    part = out.with_name(f"{out.name}.{os.getpid()}.part")
    part.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(part, out)
    stamp.write_text(key)
    metrics["task_pipeline/output_rows"] = float(len(rows))
    metrics["time/task_pipeline"] = time.perf_counter() - t0
    return out, metrics
