"""What a run returns, writes to `summary.json` and prints at its end."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from trinity.common.startup import timeline
from trinity.trainer.checkpoint import checkpoint_step, latest_resumable


@dataclass
class StageResult:
    name: str
    mode: str
    steps: int
    checkpoint: str | None
    eval_start: dict[str, float] = field(default_factory=dict)
    eval_end: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class RunResult:
    run_dir: Path
    stages: list[StageResult]
    seconds: float
    metrics_file: str = "metrics.jsonl"
    outputs: list[str] = field(default_factory=lambda: ["metrics.jsonl"])
    peak_pss_gb: float | None = None
    """Peak PSS of this process and its descendants during the run (sampled every 2 s): with a
    Ray instance this process started, that is the driver, Ray's own processes and every actor."""
    startup: dict[str, float] = field(default_factory=dict)
    """The start-up timeline (`startup/<mark>_s`, seconds since the driver's process start) of
    the run's first step, when this process ran it (`common.startup`)."""


def write_summary(result: RunResult, path: Path, joined: bool) -> None:
    """What the closing summary prints, as JSON beside the metrics (replaced atomically): each
    stage's steps, seconds, evals and checkpoint, the wall time and the peak PSS with its scope
    (`tree`: driver, Ray and every actor; `driver`: this process only, in a cluster it joined)."""
    record = {
        "wall_seconds": result.seconds,
        "peak_pss_gb": result.peak_pss_gb,
        "peak_pss_scope": "driver" if joined else "tree",
        "startup_seconds": {k.removeprefix("startup/"): v for k, v in result.startup.items()},
        "stages": [dataclasses.asdict(s) for s in result.stages],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def print_summary(result: RunResult, console: Console, joined: bool = False) -> None:
    console.rule("[bold]summary")
    first = result.stages[0] if result.stages else None
    shown = [k for s in result.stages for k in (*s.eval_start, *s.eval_end)]
    width = max([32, *(len(k) for k in shown)])
    if first and first.eval_start:
        for k, v in eval_lines(first.eval_start):
            console.print(f"eval at start      {k:<{width}} {v}")
    for s in result.stages:
        for k, v in eval_lines(s.eval_end):
            console.print(f"eval after {s.name:<8} {k:<{width}} {v}")
        console.print(f"stage {s.name:<12} {s.mode:<6} {s.steps:>5} steps  {s.seconds:7.1f} s")
        if s.checkpoint:
            console.print(f"  checkpoint: {s.checkpoint}")
    console.print(f"wall time {result.seconds:.1f} s")
    if line := timeline(result.startup):
        console.print(f"start-up  {line} (since the driver's start)", soft_wrap=True)
    if result.peak_pss_gb is not None:
        whose = (
            "this process only: the Ray cluster it joined is not its child"
            if joined
            else "driver, Ray and every actor"
        )
        console.print(f"peak PSS  {result.peak_pss_gb:.2f} GB ({whose}; sampled every 2 s)")
    console.print(f"outputs   {result.run_dir} ({', '.join(result.outputs)})", soft_wrap=True)
    console.print(f"plots     trinity report {result.run_dir}", soft_wrap=True)


def eval_lines(evals: dict[str, float]) -> list[tuple[str, str]]:
    """(key, value with its 95% interval where there is one) of a stage's evaluation:
    `accuracy` with its avg@n interval, each pass@k with its own; pass@1 (= accuracy) left out."""
    lines = []

    def order(k: str) -> tuple[str, int]:  # per set: accuracy, then pass@k by k
        stem, _, last = k.rpartition("/")
        return stem, int(last.removeprefix("pass@")) if last.startswith("pass@") else 0

    heads = [k for k in evals if "_ci_" not in k and not k.endswith("/pass@1")]
    for k in sorted(heads, key=order):
        v = evals[k]
        stem = k
        if k.endswith("/accuracy"):  # its interval is avg@n's
            avg = k.removesuffix("accuracy") + "avg@"
            stem = next((x.removesuffix("_ci_low") for x in evals if x.startswith(avg)), k)
        shown = f"{v:.3f}"
        if f"{stem}_ci_low" in evals and f"{stem}_ci_high" in evals:
            shown += f" [{evals[f'{stem}_ci_low']:.3f}, {evals[f'{stem}_ci_high']:.3f}]"
        lines.append((k, shown))
    return lines


@dataclass(frozen=True)
class Progress:
    """Where a run is: the stage running, the run-wide step it started after, its planned
    steps (None: open-ended) and its folder. Set by the stage as it starts its loops."""

    stage: str
    offset: int
    total: int | None
    stage_dir: Path


def stop_lines(
    progress: Progress | None,
    last_steps: dict[str, int],
    mode: str,
    continuing: bool,
    rename: str | None,
) -> list[str]:
    """What a run that stopped before its end (Ctrl-C, a signal, a crash) prints: where it
    stood, its newest checkpoint, and the command that continues it.

    `progress`: where the run was (None: no stage had begun); `last_steps`: the newest step each source reported
    (`Monitor.last_steps`); `continuing`: the run already had `continue_from_checkpoint: true`;
    `rename`: the run's name when the launcher chose it (`<name>_<timestamp>`), which the
    command must name to find the folder again.
    """
    if progress is None:
        return ["stopped before its first stage began: nothing to continue; run it again"]
    stage, total = progress.stage, progress.total
    source = "trainer" if "trainer" in last_steps else "explorer"
    kind = "train" if source == "trainer" else "explore"
    at = last_steps.get(source)
    of = f" of {progress.offset + total}" if total else ""
    where = (
        f"stopped in stage {stage} at {kind} step {at}{of}"
        if at is not None
        else (f"stopped in stage {stage} before its first step")
    )
    sets = [f"name={rename}"] if rename else []
    if mode == "bench":
        return [where, "bench keeps no state between runs: run the same command again"]
    if mode in ("explore", "serve"):
        again = "the explorer continues after its cursor in the buffer"
        return [where, f"run the same command{_with(sets)} to continue ({again})"]
    ckpt = latest_resumable(progress.stage_dir)
    if ckpt is None:
        said = f"no checkpoint of stage {stage} yet: the stage starts again from its beginning"
    else:
        said = f"the last checkpoint is step {checkpoint_step(ckpt)} ({ckpt})"
    if not continuing:
        sets.append("continue_from_checkpoint=true")
    return [where, said, f"run the same command{_with(sets)} to continue"]


@dataclass(frozen=True)
class StopRecord:
    """What `stop_lines` needs, kept in a file while the run goes (`launcher.supervise`), so
    that a parent process can say it for a run process killed before it could."""

    progress: Progress | None
    last_steps: dict[str, int]
    mode: str
    continuing: bool
    rename: str | None

    def lines(self) -> list[str]:
        return stop_lines(self.progress, self.last_steps, self.mode, self.continuing, self.rename)

    def write(self, path: Path) -> None:
        """Replace `path` with this record (whole or not at all: a reader never sees half)."""
        data = dataclasses.asdict(self)
        if self.progress is not None:
            data["progress"]["stage_dir"] = str(self.progress.stage_dir)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> StopRecord | None:
        """The record at `path`; None where the run wrote none (it stopped before it began)."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        p = data["progress"]
        progress = None if p is None else Progress(**{**p, "stage_dir": Path(p["stage_dir"])})
        return cls(progress, data["last_steps"], data["mode"], data["continuing"], data["rename"])


def _with(sets: list[str]) -> str:
    return (" with " + " ".join(f"--set {s}" for s in sets)) if sets else ""
