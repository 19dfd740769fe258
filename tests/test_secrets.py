"""A config's secrets (the endpoint's API key, a backend's key in monitor_args) are never shown
by `validate` nor handed to the monitor backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_config import write
from test_e2e import ROOT

from trinity.config import dump_config, load_config
from trinity.config.secrets import REDACTED, redacted

SERVE = """
mode: serve
model: {model_path: tiny://1m}
explorer: {api_key: sk-do-not-print}
buffer:
  trainer_input: {experience_buffer: {storage_type: queue}}
"""


def test_secret_keys_are_redacted_at_any_depth_and_nothing_else():
    data = {
        "explorer": {"api_key": "sk-1", "prompt_key": "question", "listen_address": "x"},
        "monitor_args": {"wandb": {"API-KEY": "w", "entity": "me"}, "Password": "p"},
        "tasksets": [{"workflow_args": {"token": "t", "max_tokens": 3}}],
        "unset": {"api_key": None},
    }
    assert redacted(data) == {
        "explorer": {"api_key": REDACTED, "prompt_key": "question", "listen_address": "x"},
        "monitor_args": {"wandb": {"API-KEY": REDACTED, "entity": "me"}, "Password": REDACTED},
        "tasksets": [{"workflow_args": {"token": REDACTED, "max_tokens": 3}}],
        "unset": {"api_key": None},
    }
    assert data["explorer"]["api_key"] == "sk-1"  # a copy: the config itself keeps its key


def test_validate_and_the_dump_never_show_a_secret(tmp_path: Path):
    path = write(tmp_path, SERVE)
    text = dump_config(load_config(path))
    assert "do-not-print" not in text and text.count(REDACTED) == 1
    shown = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "validate", "--config", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert "do-not-print" not in shown.stdout + shown.stderr
    assert REDACTED in shown.stdout, shown.stdout[-2000:] + shown.stderr[-2000:]
