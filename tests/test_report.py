"""`trinity report`: curves drawn from metrics files written here with hand-chosen values.

The figures are checked as matplotlib objects (titles, axis labels, each line's x and y data)
and as PNG files; the data each figure was built from (`FigureSpec`) must equal the file's."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trinity.cli import app
from trinity.monitor.plots import draw, write_report
from trinity.monitor.report import ReportError, figure_specs, load_run, load_runs, summary

PNG = b"\x89PNG\r\n\x1a\n"

# a two-stage run: SFT steps 1-2 (evaluated at 0 and 2), then GRPO steps 3-4 (evaluated at 4)
RECORDS = [
    {"step": 0, "stage": "sft", "eval/add/accuracy": 0.1, "eval/add/response_length": 5.0},
    {"step": 1, "stage": "sft", "train/loss": 2.0, "train/tokens_per_s": 100.0},
    {"step": 2, "stage": "sft", "train/loss": 1.5, "train/tokens_per_s": 120.0,
     "eval/add/accuracy": 0.4, "eval/add/response_length": 4.5},
    {"step": 3, "stage": "grpo", "rollout/reward_mean": 0.25, "train/loss": 0.125,
     "train/entropy": 2.5, "train/kl_loss": 0.01, "train/kl_coef": 0.001,
     "rollout/response_length": 4.0, "rollout/tokens_per_s": 300.0},
    {"step": 4, "stage": "grpo", "rollout/reward_mean": 0.75, "train/loss": 0.0625,
     "train/entropy": 2.25, "train/kl_loss": 0.02, "train/kl_coef": 0.001,
     "rollout/response_length": 3.5, "rollout/tokens_per_s": 320.0,
     "eval/add/accuracy": 0.9, "eval/add/response_length": 3.0},
]  # fmt: skip


def write_run(folder: Path, records: list[dict], name: str = "metrics.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def curves(ax) -> dict[str, tuple[list, list]]:
    """label -> (x, y) of the data lines of an axes (stage markers have '_' labels)."""
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def by_key(spec) -> dict:
    return {p.key: p for p in spec.panels}


def test_one_run_draws_each_family_from_the_file_s_values(tmp_path):
    run = write_run(tmp_path / "add2", RECORDS)
    made = write_report([run], tmp_path / "out", dpi=40)
    names = [p.name for p in made.files]
    assert names == ["reward.png", "eval_accuracy.png", "response_length.png", "loss.png",
                     "kl_entropy.png", "throughput.png"]  # fmt: skip
    for path, spec in zip(made.files, made.specs, strict=True):
        data = path.read_bytes()
        assert data[:8] == PNG
        # IHDR: width and height in pixels = figure inches (6.4 per column; 3.8 per row + 0.6
        # for the title) x 40 dpi; one or two panels are one row
        width, height = struct.unpack(">II", data[16:24])
        cols = 1 if len(spec.panels) == 1 else 2
        assert (width, height) == (round(6.4 * cols * 40), round((3.8 + 0.6) * 40))
    # no run has a memory metric: skipped, with a note, and no empty plot
    assert [s.split(":")[0] for s in made.skipped] == ["memory"]
    assert not (tmp_path / "out" / "memory.png").exists()

    specs = {s.name: s for s in made.specs}
    evals = by_key(specs["eval_accuracy"])["eval/add/accuracy"]
    assert [(ln.label, ln.steps, ln.values) for ln in evals.lines] == [
        ("add2", [0, 2, 4], [0.1, 0.4, 0.9])
    ]
    assert list(by_key(specs["reward"])) == ["rollout/reward_mean"]
    # the loss family leaves the KL loss to the KL figure; the KL coefficient is no KL
    assert list(by_key(specs["loss"])) == ["train/loss"]
    assert list(by_key(specs["kl_entropy"])) == ["train/entropy", "train/kl_loss"]
    assert list(by_key(specs["throughput"])) == ["rollout/tokens_per_s", "train/tokens_per_s"]
    assert sorted(by_key(specs["response_length"])) == [
        "eval/add/response_length", "rollout/response_length"
    ]  # fmt: skip
    loss = by_key(specs["loss"])["train/loss"].lines[0]
    assert (loss.steps, loss.values) == ([1, 2, 3, 4], [2.0, 1.5, 0.125, 0.0625])
    assert specs["loss"].stage_starts == [(3, "grpo")]


def test_the_drawn_figure_has_labelled_axes_and_the_file_s_points(tmp_path):
    run = load_run(write_run(tmp_path / "add2", RECORDS))
    specs, _ = figure_specs([run])
    fig = draw(next(s for s in specs if s.name == "response_length"))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert fig.get_suptitle() == "Response length"
    assert [ax.get_title() for ax in axes] == [
        "eval/add/response_length", "rollout/response_length"
    ]  # fmt: skip
    assert all(ax.get_xlabel() == "step" for ax in axes)
    assert [ax.get_ylabel() for ax in axes] == ["tokens per response"] * 2
    assert curves(axes[0]) == {"add2": ([0, 2, 4], [5.0, 4.5, 3.0])}
    assert curves(axes[1]) == {"add2": ([3, 4], [4.0, 3.5])}
    # the SFT -> GRPO boundary is marked where the metric spans it (evaluations), not elsewhere
    assert any(ln.get_label().startswith("_") for ln in axes[0].get_lines())
    assert not any(ln.get_label().startswith("_") for ln in axes[1].get_lines())
    assert [ax.get_legend().get_texts()[0].get_text() for ax in axes] == ["add2", "add2"]


def test_memory_metrics_get_their_figure_with_the_unit_of_their_name(tmp_path):
    run = load_run(write_run(tmp_path / "r", [
        {"step": 1, "stage": "", "memory/peak_rss_gb": 1.5, "sync/bytes": 4096.0},
        {"step": 2, "stage": "", "memory/peak_rss_gb": 1.75, "sync/bytes": 4096.0},
    ]))  # fmt: skip
    specs, skipped = figure_specs([run])
    (spec,) = specs  # sync/bytes is no memory metric; every other family is skipped
    assert spec.name == "memory" and len(skipped) == 6
    (ax,) = [ax for ax in draw(spec).axes if ax.get_visible()]
    assert (ax.get_title(), ax.get_ylabel()) == ("memory/peak_rss_gb", "peak rss (GB)")
    assert curves(ax) == {"r": ([1, 2], [1.5, 1.75])}


def test_several_runs_share_each_figure_one_line_per_run(tmp_path):
    a = write_run(tmp_path / "p1" / "run", RECORDS)
    b = write_run(tmp_path / "p2" / "run", [
        {"step": 1, "stage": "", "rollout/reward_mean": 0.5},
        {"step": 2, "stage": "", "rollout/reward_mean": 0.625},
        {"step": 3, "stage": "", "rollout/reward_mean": 1.0},
    ])  # fmt: skip
    made = write_report([a, b], tmp_path / "out", dpi=40)
    reward = next(s for s in made.specs if s.name == "reward")
    fig = draw(reward)
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    # folders of the same name are told apart by their parent
    assert curves(ax) == {
        "p1/run": ([3, 4], [0.25, 0.75]),
        "p2/run": ([1, 2, 3], [0.5, 0.625, 1.0]),
    }
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p1/run", "p2/run"]
    assert reward.stage_starts == []  # the runs' stages differ: none is marked
    # a family only one run has is still drawn, with that run's line only
    evals = by_key(next(s for s in made.specs if s.name == "eval_accuracy"))
    assert [ln.label for ln in evals["eval/add/accuracy"].lines] == ["p1/run"]
    # labels given by the user name the lines
    runs = load_runs([a, b], ["base", "ours"])
    assert [r.label for r in runs] == ["base", "ours"]


def test_split_run_parts_are_read_and_told_apart_where_they_overlap(tmp_path):
    run = tmp_path / "async"
    write_run(
        run,
        [{"step": 1, "stage": "", "train/loss": 1.0}, {"step": 2, "stage": "", "train/loss": 0.5}],
        "metrics.trainer.jsonl",
    )
    write_run(
        run, [{"step": 1, "stage": "", "rollout/reward_mean": 0.25}], "metrics.explorer-alpha.jsonl"
    )
    write_run(run, [{"step": 1, "stage": "", "rollout/reward_mean": 0.5},
                    {"step": 2, "stage": "", "rollout/reward_mean": 0.75}],
              "metrics.explorer-beta.jsonl")  # fmt: skip
    # a journal holds reports, not records: never read
    (run / "metrics.trainer.journal.jsonl").write_text("{not json\n")
    specs = {s.name: s for s in figure_specs([load_run(run)])[0]}
    reward = by_key(specs["reward"])["rollout/reward_mean"]
    assert [(ln.label, ln.steps, ln.values) for ln in reward.lines] == [
        ("async [explorer-alpha]", [1], [0.25]),
        ("async [explorer-beta]", [1, 2], [0.5, 0.75]),
    ]
    loss = by_key(specs["loss"])["train/loss"]
    assert [(ln.label, ln.values) for ln in loss.lines] == [("async", [1.0, 0.5])]


def test_a_step_logged_again_keeps_its_later_values_and_a_torn_last_line_is_skipped(tmp_path):
    run = tmp_path / "resumed"
    write_run(run, [
        {"step": 1, "stage": "", "train/loss": 1.0},
        {"step": 2, "stage": "", "train/loss": 0.75},  # lost with its checkpoint: redone
        {"step": 2, "stage": "", "train/loss": 0.5},
        {"step": 3, "stage": "", "train/loss": 0.25, "train/lr": None},  # null: not finite
    ])  # fmt: skip
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "stage": "", "train/lo')  # killed mid-write
    loaded = load_run(run)
    assert loaded.notes and "metrics.jsonl:5: skipped a line cut short" in loaded.notes[0]
    (line,) = loaded.lines("train/loss")
    assert (line.steps, line.values) == ([1, 2, 3], [1.0, 0.5, 0.25])
    rows = {r.key: r for r in summary([loaded])}
    # first / last / best (lowest loss, at its step) / points
    assert (rows["train/loss"].first, rows["train/loss"].last) == (1.0, 0.25)
    assert rows["train/loss"].best == (0.25, 3) and rows["train/loss"].points == 3


def test_summary_gives_first_last_and_best_per_key_metric(tmp_path):
    rows = summary([load_run(write_run(tmp_path / "add2", RECORDS))])
    table = {r.key: (r.first, r.last, r.best, r.points) for r in rows}
    assert table == {
        "rollout/reward_mean": (0.25, 0.75, (0.75, 4), 2),
        "eval/add/accuracy": (0.1, 0.9, (0.9, 4), 3),
        "train/loss": (2.0, 0.0625, (0.0625, 4), 4),
        "rollout/response_length": (4.0, 3.5, None, 2),  # neither way is better
        "rollout/tokens_per_s": (300.0, 320.0, (320.0, 4), 2),
        "train/tokens_per_s": (100.0, 120.0, (120.0, 2), 2),
    }


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such run folder"),
        (lambda d: d.mkdir(), "no metrics.jsonl (or metrics.<part>.jsonl) in this folder"),
        (lambda d: write_run(d, []), "its metrics files hold no records"),
        (
            lambda d: (write_run(d, RECORDS[:2]) / "metrics.jsonl").open("a").write("{oops\n\n"),
            "metrics.jsonl:3: not valid JSON",
        ),
        (
            lambda d: write_run(d, [RECORDS[0], {"stage": "sft", "train/loss": 1.0}]),
            "metrics.jsonl:2: a record needs an integer 'step', got None",
        ),
        (lambda d: write_run(d, [RECORDS[0], [1, 2]]), "metrics.jsonl:2: a record must be"),
    ],
    ids=["missing-folder", "no-metrics-file", "empty", "bad-json", "no-step", "not-an-object"],
)
def test_bad_input_is_a_clear_error_naming_the_file(tmp_path, setup, message):
    run = tmp_path / "run"
    setup(run)
    with pytest.raises(ReportError) as info:
        load_run(run)
    assert message in str(info.value) and str(run) in str(info.value)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_cli_writes_pngs_beside_the_run_and_prints_the_summary(tmp_path):
    run = write_run(tmp_path / "add2", RECORDS)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (run / "report").iterdir()) == [
        "eval_accuracy.png", "kl_entropy.png", "loss.png", "response_length.png", "reward.png",
        "throughput.png",
    ]  # fmt: skip
    assert "memory: skipped, no run has its metrics" in result.output
    row = next(ln for ln in result.output.splitlines() if "eval/add/accuracy" in ln)
    assert row.split() == ["add2", "eval/add/accuracy", "0.1", "0.9", "0.9", "(4)", "3"]
    mismatch = CliRunner().invoke(app, ["report", str(run), "--label", "a", "--label", "b"])
    assert mismatch.exit_code == 2 and "2 labels for 1 runs" in mismatch.output


def test_report_of_a_real_run(grpo_run, tmp_path):
    """The shared end-to-end GRPO run (3 steps, evaluated at 0, 2 and 3): every family it
    reports is drawn, and each curve is its metrics.jsonl's values."""
    _, root = grpo_run
    run_dir = root / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    made = write_report([run_dir], tmp_path / "report")
    assert {p.name for p in made.files} >= {
        "reward.png", "eval_accuracy.png", "response_length.png", "loss.png", "kl_entropy.png",
        "throughput.png",
    }  # fmt: skip
    specs = {s.name: s for s in made.specs}
    for family, key in [("reward", "rollout/reward_mean"), ("eval_accuracy",
                        "eval/add_eval/accuracy"), ("loss", "train/loss")]:  # fmt: skip
        (line,) = by_key(specs[family])[key].lines
        expected = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        assert list(zip(line.steps, line.values, strict=True)) == expected, key
    assert by_key(specs["eval_accuracy"])["eval/add_eval/accuracy"].lines[0].steps == [0, 2, 3]
