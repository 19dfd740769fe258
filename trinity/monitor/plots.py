"""Draw `report.FigureSpec`s into PNG files with matplotlib (Agg, no display, no pyplot).

    figure = draw(spec)                 # a matplotlib Figure: one axes per panel
    paths = write_report([Path("runs/a")], Path("out"))

matplotlib is an optional extra (`pip install 'trinity[plots]'`), imported on first use.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity.monitor.report import (
    FigureSpec,
    ReportError,
    RunMetrics,
    SummaryRow,
    figure_specs,
    load_runs,
    summary,
)

MARKERS_UP_TO = 40  # points per line drawn with markers (sparse curves such as evaluations)


def _matplotlib() -> Any:
    if importlib.util.find_spec("matplotlib") is None:
        raise ReportError(
            "trinity report needs matplotlib, which is not installed: "
            "pip install 'trinity[plots]' (or pip install matplotlib)"
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    return Figure, FigureCanvasAgg, MaxNLocator


def draw(spec: FigureSpec) -> Any:
    """A matplotlib `Figure` of `spec`: one axes per panel (two columns), titled with the
    metric's name, x = step, y = its unit; one line per run with a legend; dotted lines where
    stages start."""
    Figure, FigureCanvasAgg, MaxNLocator = _matplotlib()
    cols = 1 if len(spec.panels) == 1 else 2
    rows = math.ceil(len(spec.panels) / cols)
    fig = Figure(figsize=(6.4 * cols, 3.8 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(spec.title, fontsize=13, fontweight="bold")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, spec.panels, strict=False):
        for line in panel.lines:
            marker = "o" if len(line.steps) <= MARKERS_UP_TO else None
            ax.plot(line.steps, line.values, label=line.label, marker=marker, markersize=3,
                    linewidth=1.4)  # fmt: skip
        steps = [s for line in panel.lines for s in line.steps]
        for step, stage in spec.stage_starts:
            if not min(steps) < step <= max(steps):  # a boundary outside this metric's steps
                continue
            ax.axvline(step, color="0.55", linestyle=":", linewidth=1)
            ax.annotate(stage, (step, 1), xycoords=("data", "axes fraction"),
                        xytext=(3, -3), textcoords="offset points", va="top", fontsize=8,
                        color="0.35")  # fmt: skip
        ax.set_title(panel.key, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[len(spec.panels) :]:
        ax.set_visible(False)
    return fig


def summary_text(rows: Sequence[SummaryRow]) -> str:
    """The summary rows as an aligned plain-text table."""
    table = [("run", "metric", "first", "last", "best (step)", "points")]
    for r in rows:
        best = f"{r.best[0]:.4g} ({r.best[1]})" if r.best else "-"
        table.append((r.label, r.key, f"{r.first:.4g}", f"{r.last:.4g}", best, str(r.points)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    )


@dataclass
class Report:
    """What `write_report` made: PNG files, skipped families, notes, the summary rows."""

    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[SummaryRow] = field(default_factory=list)
    specs: list[FigureSpec] = field(default_factory=list)


def write_report(
    run_dirs: Sequence[Path], out_dir: Path, labels: Sequence[str] = (), dpi: int = 110
) -> Report:
    """Read every run, draw each family's figure into `out_dir/<family>.png`."""
    runs: list[RunMetrics] = load_runs(run_dirs, labels)
    specs, skipped = figure_specs(runs)
    _matplotlib()  # a clear error before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(skipped=skipped, rows=summary(runs), specs=specs)
    report.notes = [n for r in runs for n in r.notes]
    for spec in specs:
        path = out_dir / f"{spec.name}.png"
        draw(spec).savefig(path, dpi=dpi)
        report.files.append(path)
    return report
