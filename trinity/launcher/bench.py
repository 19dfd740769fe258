"""`mode: bench`: evaluate a run's saved checkpoints on its eval tasksets, one row per checkpoint.

    trinity run --config x.yaml --set mode=bench

The run is the one the config names (`<checkpoint_root_dir>/<project>/<name>`). Its checkpoints
are `global_step_N` folders, in the run folder for a single-stage run and in `<run>/<stage>/` for a
staged one; steps are numbered run-wide as the training run numbered its metrics (a stage's steps
continue from the previous stage's last). `explorer.bench_on_latest_checkpoint` keeps only the
newest, `explorer.bench_checkpoints` picks 'all', 'latest', 'every:N' or a list of steps;
`explorer.eval_on_startup` adds `model.model_path` as step 0; a run with no checkpoint yet
evaluates `model.model_path` alone. With `model.external_model` the one row is its endpoint
(`explorer/external_engine.py`). All evaluations are of one batched pass over every eval set
each; a progress line with an ETA follows each. Results go to the monitor (`metrics.bench.jsonl`,
so the training run's own metrics file is untouched), to `bench.json` (rows, and the best
checkpoint per set with its rule) and `bench.samples.jsonl` (prompt, response, reward, correct
of every sample), and are printed as a table.
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


def select(found: list[BenchPoint], choice: str | list[int]) -> list[BenchPoint]:
    """The checkpoints `explorer.bench_checkpoints` names: 'all', 'latest', 'every:N' (steps
    that are multiples of N, and the latest) or a list of run-wide steps (0: none here, the base
    model is added by `bench_points`)."""
    if choice == "all":
        return found
    if choice == "latest":
        return found[-1:]
    if isinstance(choice, str):  # every:N
        every = int(choice.removeprefix("every:"))
        return [p for i, p in enumerate(found) if p.step % every == 0 or i == len(found) - 1]
    have = {p.step for p in found}
    if missing := sorted(set(choice) - have - {0}):
        raise ValueError(
            f"explorer.bench_checkpoints names steps {missing} that have no checkpoint; the run "
            f"has steps {sorted(have)}"
        )
    return [p for p in found if p.step in choice]


def bench_points(cfg: Any, run_dir: Path, model_path: str) -> tuple[list[BenchPoint], str]:
    """What to evaluate, and a line saying so. With `model.external_model` the endpoint alone,
    as step 0 (it has no checkpoints; the run folder's are not loaded)."""
    ext = cfg.model.external_model
    if ext.enable:
        from trinity.explorer.external_endpoint import endpoint_of

        url = endpoint_of(ext).base_url
        point = BenchPoint(f"{ext.model_name} at {url} (model.external_model)", "", 0)
        return [point], f"bench: evaluating the external model {ext.model_name} at {url}"
    found = find_checkpoints(run_dir)
    e = cfg.explorer
    choice = "latest" if e.bench_on_latest_checkpoint else e.bench_checkpoints
    points = select(found, choice)
    base = BenchPoint(f"{model_path} (model.model_path)", model_path, 0)
    with_base = e.eval_on_startup or (isinstance(choice, list) and 0 in choice)
    if not found:
        return [base], f"no checkpoint in {run_dir} yet: evaluating model.model_path"
    which = "the latest checkpoint" if len(points) == 1 else f"{len(points)} checkpoints"
    if with_base:
        points = [base, *points]
        why = "explorer.eval_on_startup" if e.eval_on_startup else "step 0 in bench_checkpoints"
        which = f"model.model_path ({why}) and {which}"
    return points, f"bench: evaluating {which} of {run_dir} (bench_checkpoints: {choice})"


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """'bench: 2/5 evaluated, 31.0 s each, ETA 93 s'."""
    each = elapsed_s / done
    return f"bench: {done}/{total} evaluated, {each:.1f} s each, ETA {each * (total - done):.0f} s"


def best_checkpoints(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per eval set, the row with the highest `eval/<set>/accuracy` (avg@n: missing samples
    count as wrong); ties go to the earliest step (the cheaper claim)."""
    best = {}
    for key in sorted({k for r in rows for k in r if k.endswith("/accuracy")}):
        name = key.removeprefix("eval/").removesuffix("/accuracy")
        scored = [r for r in rows if key in r]
        top = max(scored, key=lambda r: (r[key], -r["step"]))
        best[name] = {
            "checkpoint": top["checkpoint"],
            "step": top["step"],
            "accuracy": top[key],
            "ci": [top.get(_ci(name, top, "low")), top.get(_ci(name, top, "high"))],
            "rule": f"highest {key} (avg@n, failed samples as wrong); ties: earliest step",
        }
    return best


def _ci(name: str, row: dict[str, Any], side: str) -> str:
    """The interval key of the avg@n that `eval/<name>/accuracy` equals."""
    avg = next((k for k in row if k.startswith(f"eval/{name}/avg@") and "_ci_" not in k), "")
    return f"{avg}_ci_{side}"


def best_lines(best: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, b in best.items():
        low, high = b["ci"]
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        lines.append(
            f"best checkpoint for {name}: {b['checkpoint']} (step {b['step']}), accuracy "
            f"{b['accuracy']:.3f}{ci} (95% interval); rule: {b['rule']}"
        )
    return lines


def write_samples(run_dir: Path, samples: list[dict[str, Any]]) -> Path:
    """`bench.samples.jsonl`: one line per sample slot of every checkpoint's evaluation."""
    path = run_dir / "bench.samples.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    return path


def write_table(run_dir: Path, rows: list[dict[str, Any]]) -> tuple[Path, str]:
    """Write `bench.json` ({"rows": one object per checkpoint, "best": per eval set,
    "samples": the per-sample file}) and return it with a text table (accuracy and the largest
    k's pass@k of each set, then the best-checkpoint lines)."""
    best = best_checkpoints(rows)
    path = run_dir / "bench.json"
    record = {"rows": rows, "best": best, "samples": "bench.samples.jsonl"}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    keys = []
    for acc in sorted({k for r in rows for k in r if k.endswith("/accuracy")}):
        stem = acc.removesuffix("accuracy")
        passes = {k for r in rows for k in r if k.startswith(stem + "pass@") and "_ci_" not in k}
        keys += [acc, *sorted(passes, key=lambda k: int(k.rsplit("@", 1)[1]))[-1:]]
    width = max(len("checkpoint"), *(len(r["checkpoint"]) for r in rows))
    lines = [f"{'checkpoint':<{width}}  {'step':>6}  " + "  ".join(keys)]
    for r in rows:
        cells = [f"{r[k]:>{len(k)}.3f}" if k in r else " " * len(k) for k in keys]
        lines.append(f"{r['checkpoint']:<{width}}  {r['step']:>6}  " + "  ".join(cells))
    return path, "\n".join([*lines, *best_lines(best)])
