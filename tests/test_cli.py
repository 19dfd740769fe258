"""The `trinity` command as a user types it: exit codes, messages, no tracebacks on bad input."""

import subprocess
import sys
from pathlib import Path

import pytest

TRINITY = [sys.executable, "-m", "trinity.cli"]
ROOT = Path(__file__).resolve().parents[1]


def trinity(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*TRINITY, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


GOOD = """
model: {model_path: "tiny://1m?seed=0"}
buffer:
  batch_size: 4
  explorer_input:
    taskset:
      storage_type: synthetic
      path: arithmetic
      format: {prompt_key: question, response_key: answer}
"""


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (GOOD + "algorithm: {repeat_time: 4}\n", ["algorithm.repeat_time", "repeat_times"]),
        (GOOD + "algorithm: {repeat_times: many}\n", ["algorithm.repeat_times"]),
        (
            GOOD + "synchronizer: {sync_method: carrier_pigeon}\n",
            ["synchronizer.sync_method", "memory"],
        ),
        (GOOD.replace("synthetic", "sythetic"), ["storage_type", "synthetic"]),
    ],
    ids=["unknown-key", "wrong-type", "bad-enum", "bad-enum-typo"],
)
def test_validate_rejects_bad_config(tmp_path, yaml_text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    r = trinity("validate", "--config", str(cfg))
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    for needle in expected:
        assert needle in out
    assert "Traceback" not in out


def test_validate_missing_file(tmp_path):
    r = trinity("validate", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2
    assert "missing.yaml" in r.stderr and "Traceback" not in r.stderr


def test_validate_prints_batch_table_and_applies_overrides(tmp_path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(GOOD)
    r = trinity("validate", "--config", str(cfg), "--set", "algorithm.repeat_times=3")
    assert r.returncode == 0, r.stderr
    # 4 tasks per step x 3 samples per task = 12 experiences per explore step
    assert "12" in r.stdout and "experiences per explore step" in r.stdout


def test_run_with_bad_config_exits_2(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(GOOD + "trainer: {save_intervall: 3}\n")
    r = trinity("run", "--config", str(cfg))
    assert r.returncode == 2
    assert "trainer.save_intervall" in r.stderr and "Traceback" not in r.stderr


def test_help_on_every_verb():
    verbs = (["run"], ["validate"], ["model", "create"], ["model", "presets"], ["model", "import"])
    for verb in verbs:
        r = trinity(*verb, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, verb
