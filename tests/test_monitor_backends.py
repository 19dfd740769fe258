"""Monitor backends write what the run logs, offline, and it reads back with each tool's own
reader: TensorBoard's event reader, wandb's record protos, MLflow's client, SwanLab's store."""

from __future__ import annotations

import importlib.util
import io
import json
import struct
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

from trinity.config.schema import MonitorConfig
from trinity.monitor import backends
from trinity.monitor.backends import (
    MONITOR,
    Arg,
    MonitorUnavailable,
    RunInfo,
    config_problems,
)
from trinity.monitor.monitor import Monitor

# three steps as explorer and trainer report them; step 2 has an evaluation with a pass@k name
REPORTS = [
    ("trainer", 1, {"train/loss": 0.5, "train/lr": 1.0e-3}),
    ("explorer", 1, {"rollout/reward_mean": 0.25}),
    ("trainer", 2, {"train/loss": 0.25, "train/lr": 1.0e-3}),
    ("explorer", 2, {"rollout/reward_mean": 0.5, "eval/add/pass@4": 0.75}),
    ("trainer", 3, {"train/loss": 0.125, "train/lr": 5.0e-4, "train/grad_norm": float("nan")}),
    ("explorer", 3, {"rollout/reward_mean": 1.0}),
]


def run_monitor(
    run_dir: Path, types: list[str], args: dict | None = None, part: str = ""
) -> Monitor:
    info = RunInfo(run_dir, "proj", "grp", "nm", part, config={"algorithm": {"lr": 0.5}})
    monitor = Monitor(run_dir, types, Console(file=io.StringIO()), part=part, info=info,
                      monitor_args=args)  # fmt: skip
    monitor.begin_stage("grpo", {"explorer", "trainer"}, last_step=3)
    for source, step, metrics in REPORTS:
        monitor.add(source, step, metrics)
    monitor.close()
    return monitor


def logged(key: str) -> list[tuple[int, float]]:
    """(step, value) of `key` in REPORTS, as every backend must hold them."""
    return [(s, m[key]) for _, s, m in REPORTS if key in m]


class Recorder:
    """A backend that keeps what it is given (the contract every backend sees)."""

    PACKAGE: ClassVar[str | None] = None
    EXTRA: ClassVar[str] = ""
    ARGS: ClassVar[dict[str, Arg]] = {"color": Arg("a test argument")}
    OUTPUT: ClassVar[str] = "recorder/"
    made: ClassVar[list[Recorder]] = []

    def __init__(self, info: RunInfo, args: dict[str, Any]) -> None:
        self.info, self.args, self.logs, self.closed = info, args, [], False
        Recorder.made.append(self)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logs.append((step, metrics))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def recorder():
    """`Recorder` registered as monitor_type test_recorder for the test."""
    MONITOR.register("test_recorder")(Recorder)
    Recorder.made.clear()
    yield Recorder
    MONITOR._items.pop("test_recorder")


def test_every_backend_gets_each_record_s_numbers_with_its_step(tmp_path, recorder):
    monitor = run_monitor(tmp_path, ["jsonl", "test_recorder"], {"color": "red", "uri": "x"})
    (rec,) = Recorder.made
    assert rec.args == {"color": "red"}  # only the arguments it declares
    assert (rec.info.project, rec.info.group, rec.info.run_name) == ("proj", "grp", "nm")
    assert [step for step, _ in rec.logs] == [1, 2, 3]
    assert rec.logs[1][1] == {
        "train/loss": 0.25,
        "train/lr": 1.0e-3,
        "rollout/reward_mean": 0.5,
        "eval/add/pass@4": 0.75,
    }  # fmt: skip  (no step, no stage)
    assert "train/grad_norm" not in rec.logs[2][1]  # NaN is written as null, not sent
    assert rec.closed and monitor.outputs == ["metrics.jsonl", "recorder/"]


def test_a_backend_that_fails_to_start_closes_the_ones_started(tmp_path, monkeypatch, recorder):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        backends.importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    with pytest.raises(MonitorUnavailable) as info:
        Monitor(tmp_path, ["test_recorder", "wandb"], Console(file=io.StringIO()))
    assert "pip install 'trinity[monitors]'" in str(info.value)
    assert Recorder.made[0].closed


def test_tensorboard_event_files_hold_the_logged_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_monitor(tmp_path, ["tensorboard"], part="trainer")
    events = EventAccumulator(str(tmp_path / "tensorboard" / "trainer"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert got == logged("train/loss")


def wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of a wandb offline run file (`run-<id>.wandb`): a 7-byte header,
    then LevelDB log blocks of 32 KiB whose records have a 7-byte header (crc, length, type:
    1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pieces, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
    return out


def key_of(item: Any) -> str:
    """A wandb record item's key (wandb writes it as `key` or as a one-part `nested_key`)."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_the_logged_keys_and_values(tmp_path):
    pytest.importorskip("wandb")
    run_monitor(tmp_path, ["wandb"], {"api_key": "unused-offline"})
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds and kinds[-1] == "exit", kinds  # finished and flushed
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.run_group, run.display_name) == ("proj", "grp", "nm")
    history = [
        {key_of(item): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    got = [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert got == logged("train/loss")
    assert [(h["_step"], h["eval/add/pass@4"]) for h in history if "eval/add/pass@4" in h] == [
        (2, 0.75)
    ]
    config = {key_of(u): json.loads(u.value_json) for u in run.config.update}
    assert config["algorithm"] == {"value": {"lr": 0.5}} or config["algorithm"] == {"lr": 0.5}


def mlflow_client(uri: str, monkeypatch) -> Any:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in to its file store
    return mlflow.MlflowClient(tracking_uri=uri)


def test_mlflow_file_store_reads_back_with_mlflow_s_client(tmp_path, monkeypatch):
    client = mlflow_client((tmp_path / "mlruns").as_uri(), monkeypatch)
    run_monitor(tmp_path, ["mlflow"], part="explorer-a")
    experiment = client.get_experiment_by_name("proj")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "nm_explorer-a"
    assert (run.data.tags["group"], run.data.tags["part"]) == ("grp", "explorer-a")
    assert run.info.status == "FINISHED"

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    assert history("rollout/reward_mean") == logged("rollout/reward_mean")
    assert history("train/loss") == logged("train/loss")
    assert history("eval/add/pass_at_4") == [(2, 0.75)]  # '@' is refused by MLflow
    config = client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
    assert json.loads(Path(config).read_text()) == {"algorithm": {"lr": 0.5}}


def test_mlflow_uri_argument_is_where_it_logs(tmp_path, monkeypatch):
    store = tmp_path / "elsewhere"
    client = mlflow_client(store.as_uri(), monkeypatch)
    run_monitor(tmp_path / "run", ["mlflow"], {"uri": store.as_uri()})
    assert not (tmp_path / "run" / "mlruns").exists()
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert got == logged("train/loss")


def test_swanlab_offline_run_holds_the_logged_values(tmp_path):
    pytest.importorskip("swanlab")  # an optional extra that needs protobuf < 7 (docs/monitoring.md)
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    run_monitor(tmp_path, ["swanlab"], {"mode": "offline", "tags": ["t"]})
    (run_file,) = (tmp_path / "swanlog").glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(str(run_file))
    scalars = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "scalar":
            scalars.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
    reader.close()
    got = [(step, value) for key, step, value in scalars if key == "train/loss"]
    assert got == logged("train/loss")


def test_a_missing_package_names_the_pip_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        backends.importlib.util, "find_spec",
        lambda n, *a: None if n in ("swanlab", "mlflow") else real(n, *a),
    )  # fmt: skip
    with pytest.raises(MonitorUnavailable) as info:
        Monitor(tmp_path, ["swanlab"], Console(file=io.StringIO()))
    assert "pip install 'trinity[swanlab]'" in str(info.value)
    problems, _ = config_problems(MonitorConfig(monitor_type=["tensorboard", "mlflow"]))
    assert [(p.path, p.message) for p in problems] == [
        (
            "monitor.monitor_type",
            "monitor_type 'mlflow' needs the mlflow package, which is not installed: "
            "pip install 'trinity[monitors]' (or pip install mlflow)",
        )
    ]


def test_monitor_args_are_checked_against_the_backends_in_use():
    cfg = MonitorConfig(
        monitor_type=["wandb", "swanlab"],
        monitor_args={"api_key": "k", "mode": "cloud", "uri": "file:/x", "logdri": "/tmp"},
    )
    problems, notes = config_problems(cfg)
    found = {p.path: str(p) for p in problems if p.path != "monitor.monitor_type"}
    assert found == {
        "monitor.monitor_args.mode": "monitor.monitor_args.mode: 'cloud' is not accepted by "
        "swanlab: expected 'offline', 'local', 'disabled'; cloud logging needs the network and "
        "is not built: run offline and upload with `swanlab sync`",
        "monitor.monitor_args.logdri": "monitor.monitor_args.logdri: unknown argument of the "
        "monitors in use (wandb, swanlab); they accept: api_key, base_url, description, "
        "experiment_name, id, logdir, mode, reinit, resume, settings, tags, workspace "
        "(did you mean 'logdir'?)",
    }
    assert sorted(notes) == [
        "monitor.monitor_args.api_key: not applicable here (swanlab: runs are offline or local "
        "here; `swanlab sync <run folder>` uploads them)",
        "monitor.monitor_args.api_key: not applicable here (wandb: runs are offline here; "
        "`wandb sync <run_dir>/wandb/offline-run-*` uploads them)",
        "monitor.monitor_args.uri: not applicable here (an argument of monitor_type 'mlflow', "
        "which the run does not use)",
    ]
    # jsonl and console take no arguments
    problems, _ = config_problems(MonitorConfig(monitor_type="jsonl", monitor_args={"x": 1}))
    assert [str(p) for p in problems] == [
        "monitor.monitor_args.x: unknown argument of the monitors in use (none besides jsonl "
        "and console); they take no arguments"
    ]
