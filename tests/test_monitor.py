"""Monitor: one record per step in metrics.jsonl; console bar (terminal) vs plain lines (not)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from trinity.monitor.monitor import Monitor


class FakeTTY(io.StringIO):
    """A text file that says it is a terminal (isatty), as an interactive stdout does."""

    def isatty(self) -> bool:
        return True


def run_stage(monitor: Monitor) -> None:
    # a stage of 3 steps after 10 earlier ones (steps 11..13), trainer only, eval at step 12
    monitor.begin_stage("sft", {"trainer"}, last_step=13, first_step=10)
    monitor.add("trainer", 11, {"train/loss": 1.5})
    monitor.add("trainer", 12, {"train/loss": 1.25, "eval/add/accuracy": 0.5})
    monitor.add("trainer", 13, {"train/loss": 1.0})
    monitor.close()


def test_not_a_terminal_prints_plain_lines_with_step_count_and_eta(tmp_path):
    out = io.StringIO()
    console = Console(file=out, highlight=False, width=200)
    monitor = Monitor(tmp_path, ["jsonl"], console)
    assert not monitor.progress_bar  # StringIO.isatty() is False
    run_stage(monitor)
    lines = out.getvalue().splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == ["sft step   11/13", "sft step   12/13",
                                                    "sft step   13/13"]  # fmt: skip
    assert "loss 1.5000" in lines[0] and "ETA" in lines[0] and "ETA" not in lines[2]
    assert "add/accuracy 0.500" in lines[1]
    assert "\x1b[" not in out.getvalue() and "━" not in out.getvalue()  # no bar, no cursor moves
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [11, 12, 13]


def test_terminal_gets_a_progress_bar_with_eta(tmp_path):
    out = FakeTTY()
    console = Console(file=out, highlight=False, width=200, color_system=None)
    monitor = Monitor(tmp_path, ["jsonl"], console)
    assert monitor.progress_bar  # FakeTTY.isatty() is True
    run_stage(monitor)
    text = out.getvalue()
    assert "3/3 steps" in text and "ETA" in text and "━" in text  # the bar, its count and ETA
    assert "loss 1.0000" in text  # the latest metrics ride on the bar
    assert "add/accuracy 0.500" in text  # an evaluation is printed above the bar
    assert "sft step   11" not in text  # no per-step lines
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] \
        == [11, 12, 13]  # fmt: skip


def test_a_torn_last_line_is_cut_before_appending(tmp_path):
    from rich.console import Console

    from trinity.monitor.monitor import Monitor

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "train/lo')  # killed
    Monitor(tmp_path, ["jsonl"], Console(file=io.StringIO())).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_reports_a_killed_driver_never_merged_are_merged_by_the_next_run(tmp_path):
    from trinity.monitor.hub import MetricsHub

    def both(step: int) -> list[tuple[str, int, dict]]:
        return [("explorer", step, {"rollout/reward_mean": step / 10}),
                ("trainer", step, {"train/loss": 1.0 / step})]  # fmt: skip

    def pump(hub: MetricsHub, monitor: Monitor) -> None:
        for event in hub.drain():
            monitor.add(*event)

    quiet = Console(file=io.StringIO())
    first = Monitor(tmp_path, ["jsonl"], quiet)
    hub = MetricsHub(str(first.journal_path))
    hub.begin_stage("grpo")
    first.begin_stage("grpo", {"explorer", "trainer"}, last_step=5)
    for event in both(1) + both(2):
        hub.put(*event)
    pump(hub, first)  # steps 1 and 2 are written
    for event in both(3) + both(4)[:1]:  # then the driver is killed before it pumps again:
        hub.put(*event)  # step 3 was reported whole, step 4 by the explorer only
    del first, hub  # no close: a SIGKILL runs nothing

    second = Monitor(tmp_path, ["jsonl"], quiet)
    hub = MetricsHub(str(second.journal_path))
    hub.begin_stage("grpo")
    second.begin_stage("grpo", {"explorer", "trainer"}, last_step=5)  # writes step 3 at once
    for event in both(4)[1:] + both(5):  # the resumed trainer retrains step 4, then step 5
        hub.put(*event)
    pump(hub, second)
    second.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # each step once, whole
    for r in records:
        assert r["rollout/reward_mean"] == r["step"] / 10 and r["train/loss"] == 1.0 / r["step"]
    assert not second.journal_path.exists()  # a run that closes normally drops the journal


def test_a_report_missing_from_a_partly_written_record_is_merged_too(tmp_path):
    # a failing run's close wrote step 3 with the explorer's report only; the trainer's report
    # of step 3 reached the journal alone (the hub was already drained)
    from trinity.monitor.hub import MetricsHub

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 3, "stage": "grpo", "rollout/reward_mean": 0.3}) + "\n"
    )
    hub = MetricsHub(str(tmp_path / "metrics.journal.jsonl"))
    hub.begin_stage("grpo")
    hub.put("explorer", 3, {"rollout/reward_mean": 0.3})
    hub.put("trainer", 3, {"train/loss": 0.5})
    monitor = Monitor(tmp_path, ["jsonl"], Console(file=io.StringIO()))
    monitor.begin_stage("grpo", {"explorer", "trainer"}, last_step=5)
    monitor.close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [
        {"step": 3, "stage": "grpo", "rollout/reward_mean": 0.3},
        {"step": 3, "stage": "grpo", "train/loss": 0.5},  # the explorer's report is not repeated
    ]
