"""`model.external_model` end to end: `trinity serve` of a checkpoint, started as a user starts
it, benched through its endpoint, scores each task as `mode: bench` of the checkpoint itself
(greedy: the same replies), slow: two bench runs and a serve process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_e2e import ROOT, run_trinity
from test_serve import lines_of, url_of

pytestmark = pytest.mark.long  # two serve processes and three benches (over 2 minutes)

KEY = "sk-bench-key"
TASKS = 16
APIS = ("chat", "completions")  # model.external_model.api: messages, or token-id prompts
# the problems the checkpoint is trained on and evaluated on: a 1M model learns most of 60
# one-digit sums in ~90 SFT steps, so its greedy replies are partly right and both benches have
# right and wrong answers to agree on
PROBLEMS = "{digits: 1, num_tasks: %d, seed: 0}"


def _checkpoint(tmp_path: Path, model_dir: Path) -> Path:
    """An SFT checkpoint of `model_dir` (`trinity run`, mode train): its final global_step_N."""
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        mode: train
        project: ext
        name: sft
        checkpoint_root_dir: {tmp_path / "ckpt"}
        cluster: {{ray_address: local}}
        model: {{model_path: {model_dir}, max_response_tokens: 6}}
        algorithm:
          algorithm_type: sft
          optimizer: {{lr: 3.0e-3, lr_warmup_steps: 10, weight_decay: 0.0}}
        buffer:
          train_batch_size: 64
          total_epochs: 100
          total_steps: 90
          trainer_input:
            experience_buffer:
              name: teacher
              storage_type: synthetic
              path: arithmetic
              generator_args: {PROBLEMS % 60}
              format: {{prompt_key: question, response_key: answer}}
        explorer: {{eval_on_startup: false}}
        trainer: {{micro_batch_size_per_gpu: 64, use_dynamic_bsz: false, save_interval: 0}}
        monitor: {{monitor_type: jsonl}}
        """)
    )
    r = run_trinity(cfg)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [ckpt] = (tmp_path / "ckpt" / "ext" / "sft").glob("global_step_*")
    return ckpt


def _config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        mode: bench
        project: ext
        name: local
        checkpoint_root_dir: {tmp_path / "ckpt"}
        cluster: {{ray_address: local}}
        model: {{model_path: {model_dir}, max_response_tokens: 6}}
        buffer:
          explorer_input:
            eval_tasksets:
              - name: add_eval
                storage_type: synthetic
                path: arithmetic
                generator_args: {PROBLEMS % TASKS}
                format: {{prompt_key: question, response_key: answer}}
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue}}
        explorer: {{api_port: 0, api_key: {KEY}, runner_per_model: 16}}
        synchronizer: {{sync_method: checkpoint}}
        monitor: {{monitor_type: jsonl}}
        """)
    )
    return cfg


def _samples(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "bench.samples.jsonl").read_text().splitlines()
    return {s["task"]: s for s in map(json.loads, lines)}


def test_an_external_bench_of_trinity_serve_scores_as_the_checkpoint(tmp_path, tiny_model_dir):
    ckpt = _checkpoint(tmp_path, tiny_model_dir)
    cfg = _config(tmp_path, ckpt)
    env_cache = {"TRINITY_CACHE_DIR": str(tmp_path / "cache")}
    # 1. the checkpoint itself
    local = run_trinity(cfg)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    # 2. `trinity serve` of the same checkpoint, as a user starts it
    server = subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "serve", "--config", str(cfg),
         "--set", "name=served"],
        cwd=ROOT, env={**__import__("os").environ, **env_cache},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out, seen = lines_of(server), []
        url = url_of(out, seen, bound_s=180)
        # 3. bench through its endpoint, by each API: the URL and key from the environment
        # (upstream's keys)
        external = {}
        for api in APIS:
            external[api] = run_trinity(
                cfg,
                env_extra={"BENCH_URL": url, "BENCH_KEY": KEY},
                overrides=[
                    f"name=external_{api}",
                    "model.external_model.enable=true",
                    f"model.external_model.api={api}",
                    f"model.external_model.model_name={ckpt}",  # trinity serve's name
                    "model.external_model.base_url_env=BENCH_URL",
                    "model.external_model.api_key_env=BENCH_KEY",
                ],
            )
            r = external[api]
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        # 4. a wrong key is refused before anything starts, the 401 named
        refused = run_trinity(
            cfg,
            env_extra={"BENCH_URL": url, "BENCH_KEY": "sk-wrong"},
            overrides=[
                "name=refused",
                "model.external_model.enable=true",
                f"model.external_model.model_name={ckpt}",
                "model.external_model.base_url_env=BENCH_URL",
                "model.external_model.api_key_env=BENCH_KEY",
            ],
        )
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    said = refused.stdout + refused.stderr
    assert f"the endpoint {url} refused the API key (401 Unauthorized" in said
    assert "sk-wrong" not in said
    runs = tmp_path / "ckpt" / "ext"
    mine = _samples(runs / "local")
    right = sum(s["correct"] for s in mine.values())
    assert 0 < right < TASKS, right  # right and wrong replies to agree on
    local_bench = json.loads((runs / "local" / "bench.json").read_text())
    assert local_bench["rows"][0]["eval/add_eval/accuracy"] == right / TASKS
    for api in APIS:
        said = external[api].stdout
        assert f"bench: evaluating the external model {ckpt} at {url}" in said
        # per task: the same greedy reply, the same reward, the same verdict
        theirs = _samples(runs / f"external_{api}")
        assert sorted(mine) == sorted(theirs) == list(range(TASKS))
        for task, s in mine.items():
            t = theirs[task]
            assert (t["prompt"], t["response"], t["reward"], t["correct"], t["failed"]) == (
                s["prompt"], s["response"], s["reward"], s["correct"], False
            ), (api, task)  # fmt: skip
        bench = json.loads((runs / f"external_{api}" / "bench.json").read_text())
        assert bench["rows"][0]["eval/add_eval/accuracy"] == right / TASKS, api
