"""`trinity report`: a run's curves from its metrics files, several runs on one figure.

    trinity report checkpoints/quickstart/add2                       # -> add2/report/*.png
    trinity report runs/a runs/b --label baseline --label ours --out cmp/

This module reads the records and decides what to draw (pure data); `plots.py` draws it with
matplotlib. A run folder holds `metrics.jsonl`, or one `metrics.<part>.jsonl` per process of a
run split over processes (`metrics.trainer.jsonl`, `metrics.explorer-<name>.jsonl`) and
`metrics.bench.jsonl` from mode bench; all are read. A record is one step
(`{"step": 3, "stage": "grpo", "rollout/reward_mean": 0.4, ...}`); steps are numbered run-wide
across stages, and a step logged twice (a resumed run redoes the steps after its checkpoint)
keeps its later values. A metric found in one file of a run is one line labelled with the run;
found in several (two explorers' rewards, training-time and bench evaluations), one line per
file, labelled `run [part]`.

Figures come from metric-name families (`FAMILIES`): reward, held-out accuracy, response
length, loss, KL and entropy, throughput, memory. Each metric of a family found in any run is one
panel; a family none of the runs has is skipped with a note, never drawn empty.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

JOURNAL_SUFFIX = ".journal.jsonl"


class ReportError(ValueError):
    """A run folder or metrics file that cannot be read; the message names it (and the line)."""


@dataclass(frozen=True)
class Family:
    """A figure: the metric names it draws (globs; `exclude` removes some) and how a panel of
    each is labelled (`units`: the y-axis label by the name's last part)."""

    name: str
    title: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def matches(self, key: str) -> bool:
        def hit(globs: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(key, g) for g in globs)

        return hit(self.include) and not hit(self.exclude)


FAMILIES: tuple[Family, ...] = (
    Family("reward", "Reward of the rollouts", ("rollout/reward_mean", "rollout/accuracy_mean")),
    Family("eval_accuracy", "Held-out accuracy", ("eval/*/accuracy",)),
    Family(
        "response_length",
        "Response length",
        ("rollout/response_length", "eval/*/response_length", "rollout/truncated_frac"),
    ),
    Family("loss", "Training loss", ("train/*loss", "critic/*loss"), ("*kl_loss",)),
    Family(
        "kl_entropy",
        "KL and entropy",
        ("train/*kl*", "train/*entropy*", "off_policy/mismatch_kl"),
        ("*kl_coef*",),
    ),
    Family("throughput", "Throughput", ("*/tokens_per_s",)),
    Family("memory", "Memory", ("*mem*", "*rss*", "*pss*")),
)

UNITS = {
    "reward_mean": "mean reward",
    "accuracy_mean": "fraction correct",
    "accuracy": "fraction correct",
    "response_length": "tokens per response",
    "truncated_frac": "fraction cut at max tokens",
    "tokens_per_s": "tokens / s",
}

SIZE_UNITS = {"bytes": "bytes", "kb": "KB", "mb": "MB", "gb": "GB", "mib": "MiB", "gib": "GiB",
              "s": "s"}  # fmt: skip

SUMMARY: tuple[tuple[str, str | None], ...] = (
    ("rollout/reward_mean", "max"),
    ("eval/*/accuracy", "max"),
    ("train/loss", "min"),
    ("rollout/response_length", None),
    ("*/tokens_per_s", "max"),
    ("*mem*", None),
)
"""The summary table's metrics (globs) and which way is better (None: neither)."""


@dataclass
class Line:
    """One curve: `label` (the run, and its part when the metric is in several of its files)."""

    label: str
    steps: list[int]
    values: list[float]


@dataclass
class Panel:
    """One metric's axes: a line per run (and part)."""

    key: str
    ylabel: str
    lines: list[Line]


@dataclass
class FigureSpec:
    """One PNG: a family's panels, and the stage boundaries to mark (when every run shares
    them)."""

    name: str
    title: str
    panels: list[Panel]
    stage_starts: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class RunMetrics:
    """A run's records, one list per metrics file (`part`: "" for `metrics.jsonl`)."""

    label: str
    path: Path
    parts: dict[str, list[dict]]
    notes: list[str] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {k for recs in self.parts.values() for r in recs for k in r if _is_metric(r, k)}

    def lines(self, key: str) -> list[Line]:
        """The run's curves of `key`: one per file holding it."""
        holders = [p for p, recs in self.parts.items() if any(key in r for r in recs)]
        out = []
        for part in holders:
            points = [(r["step"], r[key]) for r in self.parts[part] if _is_number(r.get(key))]
            label = f"{self.label} [{part}]" if len(holders) > 1 and part else self.label
            out.append(Line(label, [s for s, _ in points], [float(v) for _, v in points]))
        return out

    def stage_starts(self) -> list[tuple[int, str]]:
        """(first step, name) of each stage after the first, by the order records show them."""
        firsts: dict[str, int] = {}
        for recs in self.parts.values():
            for r in recs:
                stage = r.get("stage") or ""
                firsts[stage] = min(firsts.get(stage, r["step"]), r["step"])
        ordered = sorted((s, name) for name, s in firsts.items())
        return ordered[1:] if len(ordered) > 1 else []


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_metric(record: dict, key: str) -> bool:
    return key not in ("step", "stage") and _is_number(record[key])


def metrics_files(run_dir: Path) -> dict[str, Path]:
    """part -> metrics file of a run folder ("" for `metrics.jsonl`); journals left out."""
    found = {}
    for path in sorted(run_dir.glob("metrics*.jsonl")):
        if path.name.endswith(JOURNAL_SUFFIX):
            continue
        if path.name == "metrics.jsonl":
            found[""] = path
        elif path.name.startswith("metrics."):
            found[path.name[len("metrics.") : -len(".jsonl")]] = path
    return found


def read_records(path: Path, notes: list[str] | None = None) -> list[dict]:
    """The records of one metrics file, one per step (a step logged twice keeps its later
    values per key), in step order. A last line without its newline is a write cut short by a
    kill: skipped, with a note in `notes`. Any other bad line is a `ReportError` naming the file
    and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read: {e}") from None
    lines = text.split("\n")
    by_step: dict[tuple[str, int], dict] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # the last line, with no newline after it: torn
                if notes is not None:
                    notes.append(f"{path}:{number}: skipped a line cut short (a killed run)")
                continue
            raise ReportError(f"{path}:{number}: not valid JSON: {e.msg}") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}:{number}: a record must be a JSON object")
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise ReportError(f"{path}:{number}: a record needs an integer 'step', got {step!r}")
        by_step.setdefault((str(record.get("stage") or ""), step), {}).update(record)
    return sorted(by_step.values(), key=lambda r: r["step"])


def load_run(path: Path, label: str | None = None) -> RunMetrics:
    """A run folder (or one metrics file) read whole; `ReportError` when it is missing, has no
    metrics file, or a file has a bad line."""
    if not path.exists():
        raise ReportError(f"{path}: no such run folder")
    if path.is_file():
        files = {"": path}
    else:
        files = metrics_files(path)
        if not files:
            raise ReportError(
                f"{path}: no metrics.jsonl (or metrics.<part>.jsonl) in this folder; "
                "give the run folder, <checkpoint_root_dir>/<project>/<name>"
            )
    notes: list[str] = []
    parts = {part: read_records(f, notes) for part, f in files.items()}
    if not any(parts.values()):
        raise ReportError(f"{path}: its metrics files hold no records")
    name = label or (path.parent.name if path.is_file() else path.name)
    return RunMetrics(name, path, parts, notes)


def load_runs(paths: Sequence[Path], labels: Sequence[str] = ()) -> list[RunMetrics]:
    """Every run, labelled by `labels` (in order) or its folder's name; folders of the same
    name are told apart by their parent (`project/name`)."""
    if labels and len(labels) != len(paths):
        raise ReportError(f"{len(labels)} labels for {len(paths)} runs: give one per run")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    if not labels:
        names = [r.label for r in runs]
        for r in runs:
            if names.count(r.label) > 1:
                base = r.path.parent if r.path.is_file() else r.path
                r.label = f"{base.parent.name}/{base.name}"
    return runs


def ylabel(key: str) -> str:
    """The y-axis label of a metric: its unit where known, else its name's last part."""
    tail = key.rsplit("/", 1)[-1]
    if tail in UNITS:
        return UNITS[tail]
    if "entropy" in tail or "kl" in tail.split("_"):  # log-probability differences
        return f"{tail.replace('_', ' ')} (nats)"
    name, _, suffix = tail.rpartition("_")
    if suffix in SIZE_UNITS and name:  # peak_rss_gb -> "peak rss (GB)"
        return f"{name.replace('_', ' ')} ({SIZE_UNITS[suffix]})"
    return tail.replace("_", " ")


def figure_specs(runs: Sequence[RunMetrics]) -> tuple[list[FigureSpec], list[str]]:
    """(the figures to draw, a note per family skipped because no run has its metrics)."""
    keys = sorted(set().union(*(r.keys() for r in runs)))
    starts = [r.stage_starts() for r in runs]
    shared_starts = starts[0] if all(s == starts[0] for s in starts) else []
    specs, skipped = [], []
    for family in FAMILIES:
        panels = [
            Panel(k, ylabel(k), [line for r in runs for line in r.lines(k) if line.steps])
            for k in keys
            if family.matches(k)
        ]
        panels = [p for p in panels if p.lines]
        if panels:
            specs.append(FigureSpec(family.name, family.title, panels, shared_starts))
        else:
            globs = ", ".join(family.include)
            skipped.append(f"{family.name}: skipped, no run has its metrics ({globs})")
    return specs, skipped


@dataclass
class SummaryRow:
    label: str
    key: str
    first: float
    last: float
    best: tuple[float, int] | None  # (value, step), None when neither way is better
    points: int


def summary(runs: Sequence[RunMetrics]) -> list[SummaryRow]:
    """First, last and best value of each key metric of each run (`SUMMARY`)."""
    rows = []
    for run in runs:
        keys = sorted(run.keys())
        for glob, better in SUMMARY:
            for key in (k for k in keys if fnmatch.fnmatchcase(k, glob)):
                for line in run.lines(key):
                    if not line.values:
                        continue
                    best = None
                    if better is not None:
                        pick = max if better == "max" else min
                        i = pick(range(len(line.values)), key=line.values.__getitem__)
                        best = (line.values[i], line.steps[i])
                    rows.append(
                        SummaryRow(line.label, key, line.values[0], line.values[-1], best,
                                   len(line.values))
                    )  # fmt: skip
    return rows
