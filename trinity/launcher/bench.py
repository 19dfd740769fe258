"""`mode: bench`: evaluate a run's saved checkpoints on its eval tasksets, one row per checkpoint.

    trinity run --config x.yaml --set mode=bench

The run is the one the config names (`<checkpoint_root_dir>/<project>/<name>`). Its checkpoints
are `global_step_N` folders, in the run folder for a single-stage run and in `<run>/<stage>/` for a
staged one; steps are numbered run-wide as the training run numbered its metrics (a stage's steps
continue from the previous stage's last). `explorer.bench_on_latest_checkpoint` keeps only the
newest; `explorer.eval_on_startup` adds `model.model_path` as step 0; a run with no checkpoint
yet evaluates `model.model_path` alone. Results go to the monitor (`metrics.bench.jsonl`, so the
training run's own metrics file is untouched) and to `bench.json`, and are printed as a table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity.trainer.checkpoint import checkpoint_step, list_checkpoints


@dataclass(frozen=True)
class BenchPoint:
    label: str  # what the table shows: the checkpoint's path in the run folder, or the model path
    path: str  # what the engines load
    step: int  # run-wide step


def find_checkpoints(run_dir: Path) -> list[BenchPoint]:
    """The run's checkpoints in the order they were written, each with its run-wide step.

    Stage folders are ordered by when their oldest kept checkpoint was written (stages run one
    after another); each stage's steps are offset by the previous stage's last step.
    """
    if not run_dir.is_dir():
        return []
    folders = [run_dir, *sorted(p for p in run_dir.iterdir() if p.is_dir())]
    groups = [ckpts for d in folders if (ckpts := list_checkpoints(d))]
    groups.sort(key=lambda ckpts: ckpts[0].stat().st_mtime)
    points, offset = [], 0
    for ckpts in groups:
        for c in ckpts:
            points.append(
                BenchPoint(str(c.relative_to(run_dir)), str(c), offset + checkpoint_step(c))
            )
        offset += checkpoint_step(ckpts[-1])
    return points


def bench_points(cfg: Any, run_dir: Path, model_path: str) -> tuple[list[BenchPoint], str]:
    """What to evaluate, and a line saying so."""
    found = find_checkpoints(run_dir)
    points = found[-1:] if cfg.explorer.bench_on_latest_checkpoint else found
    base = BenchPoint(f"{model_path} (model.model_path)", model_path, 0)
    if not points:
        return [base], f"no checkpoint in {run_dir} yet: evaluating model.model_path"
    which = "the latest checkpoint" if len(points) == 1 else f"{len(points)} checkpoints"
    if cfg.explorer.eval_on_startup:
        points = [base, *points]
        which = f"model.model_path (explorer.eval_on_startup) and {which}"
    return points, f"bench: evaluating {which} of {run_dir}"


def write_table(run_dir: Path, rows: list[dict[str, Any]]) -> tuple[Path, str]:
    """Write `bench.json` (one object per checkpoint) and return it with a text table."""
    path = run_dir / "bench.json"
    path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    keys = sorted({k for r in rows for k in r if k.endswith("/accuracy")})
    width = max(len("checkpoint"), *(len(r["checkpoint"]) for r in rows))
    lines = [f"{'checkpoint':<{width}}  {'step':>6}  " + "  ".join(keys)]
    for r in rows:
        cells = [f"{r[k]:>{len(k)}.3f}" if k in r else " " * len(k) for k in keys]
        lines.append(f"{r['checkpoint']:<{width}}  {r['step']:>6}  " + "  ".join(cells))
    return path, "\n".join(lines)
