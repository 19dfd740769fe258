"""End to end on CPU: `trinity run` as a subprocess on a tiny model, reading what it wrote."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]


def run_trinity(
    config: Path,
    env_extra: dict | None = None,
    timeout: int = 240,
    overrides: list[str] = (),
    cache: Path | None = None,
):
    """`trinity run --config config --set o ...` as a subprocess; tiny:// builds go to `cache`."""
    cache = cache or config.parent / "cache"
    env = {**os.environ, "TRINITY_CACHE_DIR": str(cache), **(env_extra or {})}
    sets = [arg for o in overrides for arg in ("--set", o)]
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config), *sets],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def grpo_config(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: e2e
        name: grpo
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {model_dir}, max_response_tokens: 4}}
        algorithm:
          algorithm_type: grpo
          repeat_times: 4
          optimizer: {{lr: 1.0e-2}}
        buffer:
          batch_size: 4
          total_steps: 3
          explorer_input:
            taskset:
              name: add
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 1, num_tasks: 40, seed: 0}}
              format: {{prompt_key: question, response_key: answer}}
            eval_tasksets:
              - name: add_eval
                storage_type: synthetic
                path: arithmetic
                split: test
                generator_args: {{digits: 1, num_tasks: 8, seed: 0}}
                format: {{prompt_key: question, response_key: answer}}
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue}}
        explorer: {{eval_interval: 2, runner_per_model: 16}}
        trainer: {{micro_batch_size_per_gpu: 8, use_dynamic_bsz: false}}
        monitor: {{monitor_type: tensorboard}}
        """)
        + extra
    )
    return cfg


def test_grpo_end_to_end(tmp_path, tiny_model_dir):
    r = run_trinity(grpo_config(tmp_path, tiny_model_dir))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [rec["step"] for rec in records]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 3
    by_step = {rec["step"]: rec for rec in records}
    assert "eval/add_eval/accuracy" in by_step[0]  # eval_on_startup
    assert "eval/add_eval/accuracy" in by_step[2]  # eval_interval: 2
    assert "eval/add_eval/accuracy" in by_step[3]  # final evaluation
    for s in (1, 2, 3):
        for key in ("rollout/reward_mean", "train/loss", "train/pg_loss", "train/grad_norm"):
            assert key in by_step[s], (s, key)
        # on-policy: explore step s samples with the weights of train step s-1
        assert by_step[s]["rollout/model_version"] == s - 1
    assert list((run_dir / "tensorboard").iterdir()), "no TensorBoard event files"
    # the final checkpoint is a transformers directory whose weights moved
    ckpt = run_dir / "global_step_3"
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(ckpt / "model.safetensors")
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4
    assert "summary" in r.stdout and str(run_dir) in r.stdout.replace("\n", "")


def test_actor_failure_exits_nonzero_with_traceback(tmp_path, tiny_model_dir):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "boom.py").write_text(
        "from trinity.workflows import Workflow\n"
        "class Boom(Workflow):\n"
        "    async def run(self, task, model):\n"
        "        raise ValueError('kaboom from the user workflow')\n"
    )
    cfg = grpo_config(tmp_path, tiny_model_dir, extra="")
    text = cfg.read_text().replace(
        "default_reward_fn_type: arithmetic_reward",
        "default_reward_fn_type: arithmetic_reward\n    default_workflow_type: userpkg.boom.Boom",
    )
    text = text.replace(
        "explorer: {eval_interval: 2,",
        "explorer: {eval_on_startup: false, max_retry_times: 1, eval_interval: 2,",
    )
    cfg.write_text(text)
    r = run_trinity(cfg, env_extra={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "kaboom from the user workflow" in r.stderr
    assert 'boom.py", line 4, in run' in r.stderr, r.stderr[-3000:]  # the actor traceback
    assert "2 tries" in r.stderr  # bounded retries: 1 + max_retry_times


def test_checkpoint_sync_and_offset(tmp_path, tiny_model_dir):
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        extra="synchronizer: {sync_method: checkpoint, sync_interval: 1, sync_offset: 1}\n",
    )
    r = run_trinity(cfg)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = {
        json.loads(x)["step"]: json.loads(x)
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
    }
    # one-step off-policy: explore steps 1, 2 use v0, step 3 uses v1
    assert [records[s]["rollout/model_version"] for s in (1, 2, 3)] == [0, 0, 1]


def test_epochs_with_a_partial_batch_run_on_policy(tmp_path, tiny_model_dir):
    # 8 train tasks, 3 per step, 2 epochs: 16 tasks = five steps of 3, then 1. When an epoch's
    # last batch was served partial (2 tasks, step 3), the trainer waited for 3 tasks' worth of
    # experiences while the on-policy explorer waited for the weights of that step: deadlock.
    cfg = grpo_config(tmp_path, tiny_model_dir)
    text = cfg.read_text().replace(
        "{digits: 1, num_tasks: 40, seed: 0}", "{digits: 1, num_tasks: 8}"
    )
    cfg.write_text(text.replace("total_steps: 3", "total_epochs: 2"))
    from trinity.tasks.synthetic import arithmetic

    n_train = len(arithmetic("train", 0, 8, digits=1))
    assert n_train % 3 != 0, n_train  # an epoch ends inside a batch
    r = run_trinity(cfg, timeout=180, overrides=["buffer.batch_size=3", "explorer.eval_interval=0"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [
        json.loads(line)
        for line in (tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    tasks = [rec["rollout/tasks"] for rec in records if "rollout/tasks" in rec]
    assert sum(tasks) == 2 * n_train
    assert tasks[:-1] == [3.0] * (len(tasks) - 1)  # only the run's last step is partial
    assert max(rec["step"] for rec in records if "train/loss" in rec) == len(tasks)
