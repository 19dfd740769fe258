"""Where metrics go: `metrics.jsonl`, the console, and the backends `monitor_type` names.

    monitor: {monitor_type: [tensorboard, wandb]}   # jsonl and the console are always on

Backends (TensorBoard, wandb offline, an MLflow file store, SwanLab offline) are registered in
`trinity.monitor.backends.MONITOR`; each gets every record's numbers with its step.

Explorer and trainer report each step separately; the monitor merges their reports into one
record per step (`{"step": 3, "stage": "grpo", "rollout/reward_mean": ..., "train/loss": ...}`)
and writes it once every expected source has reported (or at close).

Reports also go to a journal (`metrics.journal.jsonl`, written by the `MetricsHub`). A run whose
driver was killed leaves reports there that never reached `metrics.jsonl`; the next run of the
same folder merges them into its records of those steps (`begin_stage`), and a run that closes
normally deletes the journal. A replayed report (`MetricsHub.replay`: an explore step's report
that the buffer kept with the step, sent again by the explorer continuing after it) is written
only when no record of its stage and step (written or pending) holds all its keys yet, so a step
whose report arrived before the crash gets no second record.

Console: when it is a terminal (`isatty`), one rich progress bar per stage with the step count,
ETA and the latest metrics, and a printed line only for evaluations; otherwise (a log file, a
pipe) one plain line per step with `step k/N` and the ETA.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from trinity.monitor.backends import RunInfo, build, monitor_types

if TYPE_CHECKING:
    from trinity.monitor.stall import StallDoctor


class Monitor:
    def __init__(
        self,
        run_dir: Path,
        types: list[str],
        console: Console | None = None,
        progress_bar: bool | None = None,
        part: str = "",
        *,
        info: RunInfo | None = None,
        monitor_args: dict[str, Any] | None = None,
    ) -> None:
        """`progress_bar`: None = a bar when the console's file is a terminal, lines otherwise.

        `part`: the process's share of a run split over processes (`mode: explore` / `train`);
        it writes `metrics.<part>.jsonl` and `tensorboard/<part>/` beside the others'.
        `info`: the run as the backends name it (project, group, name, config); None: a run
        named after `run_dir`. `monitor_args`: the backends' arguments (`monitor.monitor_args`).
        Raises `MonitorUnavailable` when a backend's package is missing, `RegistryError` for an
        unknown name.
        """
        self.run_dir = run_dir
        self.doctor: StallDoctor | None = None  # watches the run's waits (`monitor.stall`)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = run_dir / (f"metrics.{part}.jsonl" if part else "metrics.jsonl")
        self.journal_path = self.jsonl_path.with_suffix(".journal.jsonl")
        _drop_torn_line(self.jsonl_path)
        self._unmerged = _unmerged_reports(self.journal_path, self.jsonl_path)
        info = info or RunInfo(run_dir, name=run_dir.name, part=part)
        self.backends = build(monitor_types(types), info, monitor_args or {})
        self.outputs = [self.jsonl_path.name, *(type(b).OUTPUT for b in self.backends)]
        """What this monitor writes in the run folder: its metrics file, then each backend's."""
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        self.console = console or Console(highlight=False)
        self.progress_bar = self.console.is_terminal if progress_bar is None else progress_bar
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self.first_step = 0
        self._t_stage = time.perf_counter()
        self._pending: dict[int, dict[str, Any]] = {}
        self._sources: dict[int, set[str]] = {}
        self.expected: set[str] = set()
        self.last_expected: set[str] = set()
        self.last_step = -1
        self.stage = ""
        self.history: list[dict[str, Any]] = []
        self.last_steps: dict[str, int] = {}
        """The newest step each source ("trainer", "explorer", ...) reported: where a stopped
        run stood (`launcher.summary.stop_lines`)."""
        self.watchers: list[Callable[[], None]] = []
        """Called after each report and each stage's start (a run keeps its stop record)."""
        self._t_last = time.perf_counter()

    def begin_stage(
        self,
        stage: str,
        expected_sources: set[str],
        last_step: int,
        last_step_sources: set[str] | None = None,
        first_step: int = 0,
    ) -> None:
        """Start a stage: a step's record is written once all `expected_sources` reported; the
        stage's last step also waits for `last_step_sources` (e.g. the final evaluation). The
        stage runs steps `first_step + 1 .. last_step` (its progress bar's length)."""
        self.end_stage()
        self.stage, self.expected, self.last_step = stage, expected_sources, last_step
        self.last_expected = expected_sources | (last_step_sources or set())
        self.first_step, self._t_stage = first_step, time.perf_counter()
        # what an earlier run reported but never wrote (its driver was killed)
        for source, step, metrics, replay in self._unmerged.pop(stage, []):
            self.add(source, step, metrics, replay)
        if self.progress_bar:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
                console=self.console,
            )
            self._task = self._bar.add_task(
                stage or "run", total=last_step - first_step, metrics=""
            )
            self._bar.start()
        self._tell_watchers()

    def _tell_watchers(self) -> None:
        for watcher in self.watchers:
            watcher()

    def end_stage(self) -> None:
        """Write what is pending and close the stage's progress bar (if any)."""
        self.flush()
        if self._bar is not None:
            self._bar.stop()
            self._bar, self._task = None, None

    def add(self, source: str, step: int, metrics: dict[str, Any], replay: bool = False) -> None:
        """`source`'s report of `step`; `replay`: a report sent again, dropped when a record of
        the step already holds it (module docstring)."""
        if replay and set(metrics) <= self._recorded_keys(step):
            return
        self.last_steps[source] = max(step, self.last_steps.get(source, step))
        self._pending.setdefault(step, {}).update(metrics)
        self._sources.setdefault(step, set()).add(source)
        expected = self.last_expected if step == self.last_step else self.expected
        if expected <= self._sources[step]:
            for s in sorted(k for k in self._pending if k <= step):
                self._write(s)
        self._tell_watchers()

    def _recorded_keys(self, step: int) -> set[str]:
        """The keys of the current stage's records of `step`: written (any process of this
        part, read back from the file) or pending here."""
        self._jsonl.flush()
        keys = _written_keys(self.jsonl_path).get((self.stage, step), set())
        return keys | set(self._pending.get(step, {}))

    def flush(self) -> None:
        for s in sorted(self._pending):
            self._write(s)

    def _write(self, step: int) -> None:
        metrics = self._pending.pop(step)
        self._sources.pop(step, None)
        record = {"step": step, "stage": self.stage, **_clean(metrics)}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        numbers = {k: v for k, v in record.items() if isinstance(v, int | float) and k != "step"}
        for backend in self.backends:
            backend.log(numbers, step)
        self.history.append(record)
        self._print(record)

    def _print(self, r: dict[str, Any]) -> None:
        now = time.perf_counter()
        dt, self._t_last = now - self._t_last, now
        metrics = [
            f"{label} {fmt.format(r[key])}"
            for key, label, fmt in (
                ("rollout/reward_mean", "reward", "{:.3f}"),
                ("train/loss", "loss", "{:.4f}"),
                ("rollout/tokens_per_s", "gen tok/s", "{:.0f}"),
                ("train/tokens_per_s", "train tok/s", "{:.0f}"),
            )
            if isinstance(r.get(key), int | float)
        ]
        evals = [
            f"[green]{k[5:]} {v:.3f}[/]"
            for k, v in r.items()
            if k.startswith("eval/") and k.endswith("/accuracy") and isinstance(v, int | float)
        ]
        done, total = r["step"] - self.first_step, self.last_step - self.first_step
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=max(0, done), metrics=" | ".join(metrics))
            if evals:  # evaluations stay on screen above the bar
                self.console.print(
                    f"[bold]{r['stage'] or 'run'}[/] step {r['step']:>4} | " + " | ".join(evals),
                    soft_wrap=True,
                )
            return
        parts = [f"[bold]{r['stage'] or 'run'}[/] step {r['step']:>4}"]
        if total > 0 and 0 < done <= total:
            parts[0] += f"/{self.last_step}"
        parts += metrics + evals
        if evals:  # per-step times are not shown: records arrive in batches, the ETA says the pace
            parts.append(f"{dt:.1f}s")
        if total > 0 and 0 < done < total:
            eta = (now - self._t_stage) / done * (total - done)
            parts.append(f"ETA {_duration(eta)}")
        self.console.print(" | ".join(parts), soft_wrap=True)

    def close(self) -> None:
        """Write what is pending; every journaled report is then in the records: drop the
        journal (unless reports of a stage this run did not reach are still unmerged)."""
        self.end_stage()
        self._jsonl.close()
        if not self._unmerged:
            self.journal_path.unlink(missing_ok=True)
        backends, self.backends = self.backends, []
        for backend in backends:
            backend.close()


def _duration(seconds: float) -> str:
    """`1:02:03` / `2:03` / `45s`."""
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}" if m else f"{sec}s"


def _clean(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in sorted(metrics.items()):
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def _written_keys(records: Path) -> dict[tuple[str, int], set[str]]:
    """Per (stage, step), every key its records in the file `records` hold."""
    written: dict[tuple[str, int], set[str]] = {}
    if records.is_file():
        for line in records.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            written.setdefault((r.get("stage", ""), r["step"]), set()).update(r)
    return written


def _unmerged_reports(journal: Path, records: Path) -> dict[str, list[tuple[str, int, dict, bool]]]:
    """Per stage, the journal's reports that no record of their step holds (in report order),
    each as (source, step, metrics, replay).

    A report is in the records when a record of its stage and step has every one of its keys: a
    failing run's close can write a step's record with one source's report while the other's
    reached only the journal.
    """
    if not journal.is_file():
        return {}
    _drop_torn_line(journal)
    written = _written_keys(records)
    out: dict[str, list[tuple[str, int, dict, bool]]] = {}
    for line in journal.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        if not set(e["metrics"]) <= written.get((e["stage"], e["step"]), set()):
            report = (e["source"], e["step"], e["metrics"], bool(e.get("replay")))
            out.setdefault(e["stage"], []).append(report)
    return out


def _drop_torn_line(path: Path) -> None:
    """A run killed mid-write leaves a last line without its newline: cut it, so a resumed run
    appends whole records (the steps it retrains are logged again; the later record wins)."""
    if not path.is_file():
        return
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
