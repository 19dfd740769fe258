"""Trinity-RFT's own examples (tests/data/trinity_examples/, v0.5.2), each on a tiny model and
generated data (tests/trinity_examples.py): the fast checks validate every one and compare with
the table of what each does here (EXPECTED); the slow walker runs 2 steps of every example that
validates, `trinity run` as a user runs it. docs/examples.md is generated from the same table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from trinity_examples import (
    DJ_RECIPE,
    ENDPOINT_UNREACHABLE,
    EXAMPLES,
    EXPECTED,
    NEEDS_SERVER,
    RUNS,
    example_names,
    examples_table,
    problems_of,
    substitute,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [n for n in example_names() if n != DJ_RECIPE]
RUNNABLE = [n for n in CONFIGS if EXPECTED[n] == RUNS]


def test_the_table_names_every_example_file():
    assert len(example_names()) == 60  # 54 examples, 5 benchmark templates, 1 recipe
    assert sorted(EXPECTED) == example_names()


def test_the_data_juicer_recipe_is_not_a_trinity_config():
    from trinity.config import ConfigError, load_config

    recipe = yaml.safe_load((EXAMPLES / DJ_RECIPE).read_text())
    assert "process" in recipe and "model" not in recipe  # Data-Juicer's keys
    with pytest.raises(ConfigError, match="process"):
        load_config(EXAMPLES / DJ_RECIPE)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_example_validates_or_is_refused_by_name(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sub = substitute(name, tmp_path)
    for key, value in sub.env.items():
        monkeypatch.setenv(key, value)
    found = problems_of(sub)
    expected = EXPECTED[name]
    if expected == RUNS and name in NEEDS_SERVER:  # no server in a fast test: only that
        assert len(found) == 1 and ENDPOINT_UNREACHABLE in found[0], found
    elif expected == RUNS:
        assert found == []
    elif expected.startswith("refused:"):
        assert found and all("not built" in p for p in found), found
    else:  # needs: a package this Python lacks, which the problem names
        assert expected.startswith("needs:")
        assert found and all("pip install" in p for p in found), found


def test_the_docs_table_is_current(tmp_path):
    doc = (ROOT / "docs" / "examples.md").read_text()
    assert doc == examples_table(tmp_path), "run: PYTHONPATH=. python scripts/examples_table.py"


# the walker: `trinity run` of each example that validates, 2 steps on a tiny model
ASYNC = ("examples/async_gsm8k/explorer.yaml", "examples/async_gsm8k/trainer.yaml")
EXTERNAL = "examples/bench/external_model.yaml"
WALKED = [n for n in RUNNABLE if n not in ASYNC and n != EXTERNAL]
# walked in CI (`make test-slow`): GRPO on math, CHORD's mix of SFT and RL batches and the BOTS
# curriculum; `make test-long` walks the rest
WALKED_IN_CI = {
    "examples/grpo_gsm8k/gsm8k.yaml",
    "examples/mix_chord/mix_chord.yaml",
    "examples/bots/bots.yaml",
}


def test_every_example_walked_in_ci_is_walked():
    assert set(WALKED) >= WALKED_IN_CI, WALKED_IN_CI - set(WALKED)


def run_example(sub, *sets: str, env: dict | None = None, timeout: int = 300):
    """`trinity run --config <the substituted example>` as a subprocess, its env set."""
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(sub.path), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **sub.env, **(env or {}), "TRINITY_CACHE_DIR": str(CACHE)},
        timeout=timeout,
    )


def steps_logged(root: Path) -> set[int]:
    """The steps any metrics file under `root` logged a rollout or a train step for."""
    steps = set()
    for f in root.rglob("metrics*.jsonl"):
        for row in map(json.loads, f.read_text().splitlines()):
            if any(k.startswith(("rollout/", "train/")) for k in row):
                steps.add(row["step"])
    return steps


CACHE = Path(tempfile.gettempdir()) / "trinity-examples-cache"  # tiny:// builds, shared


@pytest.mark.slow  # a whole run each (~15 s)
@pytest.mark.parametrize(
    "name", [n if n in WALKED_IN_CI else pytest.param(n, marks=pytest.mark.long) for n in WALKED]
)
def test_an_example_runs_two_steps(name, tmp_path):
    sub = substitute(name, tmp_path)
    r = run_example(sub)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    assert steps_logged(tmp_path / "ckpt") == {1, 2}


@pytest.mark.long  # two processes of one run on a private Ray cluster
def test_the_async_explorer_and_trainer_run_two_steps_together(tmp_path):
    # Trinity-RFT's two-process example: both configs name the same run (project, name), so
    # the explorer's queue is the trainer's buffer; docs/running.md
    from tests.ray_cluster import private_cluster

    subs = [substitute(n, tmp_path / Path(n).stem) for n in ASYNC]
    for s in subs:  # one run folder
        s.config["checkpoint_root_dir"] = str(tmp_path / "ckpt")
        s.path.write_text(yaml.safe_dump(s.config, sort_keys=False))
    ckpt = {"TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "ckpt")}
    with private_cluster() as c:
        env = {**c.env, **ckpt, "TRINITY_CACHE_DIR": str(CACHE)}
        procs = []
        for s in subs:
            argv = ["run", "--config", str(s.path), "--set", f"cluster.ray_address={c.address}"]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trinity.cli", *argv],
                    cwd=ROOT,
                    env={**env, **s.env, **ckpt},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    assert steps_logged(tmp_path / "ckpt") == {1, 2}


@pytest.mark.long  # `trinity serve` and a bench
def test_the_external_model_example_benches_trinity_serve(tmp_path):
    # the endpoint is `trinity serve` of the tiny model, started as a user starts it (the
    # example's own model is a hosted API); tests/test_external_model_serve.py checks scores
    from test_serve import lines_of, url_of

    sub = substitute(EXTERNAL, tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "serve", "--config", str(sub.path),
         "--set", "name=served", "--set", "model.external_model.enable=false"],
        cwd=ROOT, env={**os.environ, **sub.env, "TRINITY_CACHE_DIR": str(CACHE)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out, seen = lines_of(server), []
        url = url_of(out, seen, bound_s=180)
        r = run_example(sub, env={"OPENAI_BASE_URL": url})
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    [samples] = (tmp_path / "ckpt").rglob("bench.samples.jsonl")
    assert len(samples.read_text().splitlines()) == 2  # the eval set's 2 rows, once each


def test_validate_reports_a_curricula_feature_column_missing_from_the_rows(tmp_path):
    # found walking examples/bots/bots.yaml: rows without its selector's feature_keys passed
    # validate and failed the run at its first step
    from trinity.config import load_config
    from trinity.config.preflight import preflight

    data = tmp_path / "tasks.jsonl"
    data.write_text(
        '{"question": "1+1", "answer": "2", "rate": 0.5}\n{"question": "2+2", "answer": "4"}\n'
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"model_path": "tiny://1m?seed=0"},
                "checkpoint_root_dir": str(tmp_path / "ckpt"),
                "buffer": {
                    "batch_size": 1,
                    "explorer_input": {
                        "taskset": {
                            "name": "t",
                            "storage_type": "file",
                            "path": str(data),
                            "format": {"prompt_key": "question", "response_key": "answer"},
                            "data_selector": {
                                "selector_type": "offline_easy2hard",
                                "feature_keys": ["rate"],
                            },
                        }
                    },
                },
            }
        )
    )
    found = [(p.path, p.message) for p in preflight(load_config(cfg)).problems]
    assert found == [
        (
            "buffer.explorer_input.taskset.data_selector.feature_keys",
            "data_selector.feature_keys: task 1 of 't' has no 'rate'",
        )
    ]
