"""Data-Juicer recipes: a YAML file whose `process` lists operators, each `{op_name: {args}}`.

    process:
      - text_length_filter: {min_len: 10, text_key: question}
      - llm_quality_score_filter: {api_or_hf_model: judge, min_score: 0.5}

`RecipeRunner` runs a recipe's ops natively (`task_ops`) when every one is built here; else
through a real Data-Juicer, in an environment of its own (Data-Juicer pins torch, transformers
and vLLM versions of its own, so it never enters this project's environment):
- the run's Data-Juicer server (`OpContext.data_juicer`, `dj_server`, `service.data_juicer`),
  which started once: one HTTP call per recipe run, within `timeout_s`;
- else its `dj-process` command, named by the `TRINITY_DJ_PROCESS` environment variable, once
  per recipe run: checked first (`--help` must exit 0 within `HEALTH_TIMEOUT_S`), then run over
  the rows as a jsonl file, within `timeout_s`.
With neither, a recipe with an op not built here is refused (by `validate`, `recipe_problems`,
and when it runs) naming the op and how to get Data-Juicer.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from trinity.data.task_ops import ROW_OPERATORS, OpContext, RowOperator, build_row_operator

DJ_ENV = "TRINITY_DJ_PROCESS"
HEALTH_TIMEOUT_S = 60.0
INSTALL_HINT = (
    f"install py-data-juicer in an environment of its own (make setup-data-juicer) and set "
    f"{DJ_ENV} to its dj-process"
)


class RecipeError(ValueError):
    """A recipe that cannot run: unreadable, malformed, or an op neither built nor available."""


def read_recipe(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The (op name, args) pairs of a Data-Juicer recipe's `process` list."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"Data-Juicer recipe not found: {str(p)!r}")
    doc = yaml.safe_load(p.read_text()) or {}
    process = doc.get("process") if isinstance(doc, dict) else None
    if not isinstance(process, list):
        raise RecipeError(f"{p}: a Data-Juicer recipe has a `process` list of operators")
    ops = []
    for i, item in enumerate(process):
        if not (isinstance(item, dict) and len(item) == 1):
            raise RecipeError(f"{p}: process[{i}] must be one `op_name: {{args}}` mapping")
        [(name, args)] = item.items()
        ops.append((str(name), dict(args or {})))
    return ops


def missing_ops(ops: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in ops if name not in ROW_OPERATORS]


def dj_command() -> str | None:
    return os.environ.get(DJ_ENV) or None


def uses_server(service: Any) -> bool:
    """`service.data_juicer` names a Data-Juicer server (auto-started or at server_url): it
    runs the recipes (`dj_server.service_problems` checks it)."""
    return service is not None and bool(service.auto_start or service.server_url)


def recipe_problems(
    ops: list[tuple[str, dict[str, Any]]], where: str, service: Any = None
) -> list[str]:
    """Why the recipe cannot run here (empty: it can): an op neither built nor run by a
    configured Data-Juicer (a server, `service`: `service.data_juicer`; or `dj-process`), or a
    native op's bad arguments."""
    missing = missing_ops(ops)
    if missing and uses_server(service):
        return []
    if missing and dj_command() is None:
        return [
            f"{where}: Data-Juicer op(s) {', '.join(map(repr, missing))} not built natively "
            f"(built: {', '.join(sorted(ROW_OPERATORS))}); to run them {INSTALL_HINT}"
        ]
    if missing:  # Data-Juicer runs the whole recipe: it must answer
        try:
            health_check(dj_command() or "")
        except RecipeError as e:
            return [f"{where}: {e}"]
    problems = []
    for name, args in ops if not missing else []:
        try:
            build_row_operator(name, args)
        except ValueError as e:
            problems.append(f"{where}: {e}")
    return problems


class RecipeRunner:
    """A recipe's ops, run natively or by Data-Juicer (module doc). Built, it has checked its
    native ops' arguments; whether a Data-Juicer runs the others is the run's (`validate`
    checks it: `recipe_problems`)."""

    def __init__(self, ops: list[tuple[str, dict[str, Any]]], timeout_s: float = 3600.0):
        self.raw = ops
        self.timeout_s = timeout_s
        self.missing = missing_ops(ops)  # the ops Data-Juicer runs (then it runs them all)
        self.native: list[tuple[str, RowOperator]] | None = None
        if not self.missing:
            self.native = [(n, build_row_operator(n, a)) for n, a in ops]

    def models_needed(self) -> list[str]:
        return [m for _, op in self.native or [] for m in op.models_needed()]

    async def process(
        self, rows: list[dict], ctx: OpContext
    ) -> tuple[list[dict], dict[str, float]]:
        if self.native is None:  # in a thread: the event loop serves the engines meanwhile
            if ctx.data_juicer is not None:
                run = ctx.data_juicer.run
            elif dj_command() is None:
                raise RecipeError(
                    f"data_juicer recipe: Data-Juicer op(s) {', '.join(map(repr, self.missing))} "
                    f"not built natively; to run them {INSTALL_HINT}, or set "
                    "service.data_juicer (docs/data.md)"
                )
            else:
                run = run_dj_subprocess
            return await asyncio.to_thread(run, self.raw, rows, self.timeout_s), {}
        metrics: dict[str, float] = {}
        for i, (name, op) in enumerate(self.native):
            before = len(rows)
            rows, own = await op.process(rows, ctx)
            metrics[f"{i}_{name}/dropped"] = float(before - len(rows))
            metrics.update({f"{i}_{name}/{k}": v for k, v in own.items()})
        return rows, metrics


def health_check(cmd: str) -> None:
    """`cmd --help` exits 0 within HEALTH_TIMEOUT_S; RecipeError saying what it did otherwise."""
    try:
        health = subprocess.run(
            [cmd, "--help"], capture_output=True, text=True, timeout=HEALTH_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RecipeError(f"Data-Juicer health check failed ({cmd} --help): {e}") from e
    if health.returncode != 0:
        raise RecipeError(
            f"Data-Juicer health check failed ({cmd} --help exited {health.returncode}): "
            f"{health.stderr.strip()[-500:]}"
        )


def run_dj_subprocess(
    ops: list[tuple[str, dict[str, Any]]], rows: list[dict], timeout_s: float
) -> list[dict]:
    """`rows` through Data-Juicer's `dj-process` (`TRINITY_DJ_PROCESS`): health check, then the
    recipe over a jsonl copy of the rows; the rows it exports."""
    cmd = dj_command()
    if cmd is None:
        raise RecipeError(f"Data-Juicer is not configured: {INSTALL_HINT}")
    health_check(cmd)
    with tempfile.TemporaryDirectory(prefix="trinity-dj-") as tmp:
        src, out, recipe = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl"), Path(tmp, "recipe.yaml")
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        recipe.write_text(
            yaml.safe_dump(
                {
                    "dataset_path": str(src),
                    "export_path": str(out),
                    "process": [{n: a} for n, a in ops],
                }
            )
        )
        try:
            done = subprocess.run(
                [cmd, "--config", str(recipe)], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as e:
            raise RecipeError(f"Data-Juicer ran over its timeout ({timeout_s:g} s)") from e
        if done.returncode != 0:
            raise RecipeError(
                f"Data-Juicer failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        if not out.is_file():
            raise RecipeError(f"Data-Juicer exported nothing to {out}")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
