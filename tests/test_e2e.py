"""End to end on CPU: `trinity run` as a subprocess on a tiny model, reading what it wrote."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.ray_cluster import named_actors, private_cluster
from trinity.common.startup import PHASES

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


# an auxiliary SFT buffer beside the run's experience queue (expert rows for algorithm mix)
AUXILIARY = (
    "    auxiliary_buffers:\n"
    "      sft_dataset: {storage_type: synthetic, path: arithmetic,\n"
    "        generator_args: {digits: 1, num_tasks: 30, seed: 1},\n"
    "        format: {prompt_key: question, response_key: answer}}\n"
)


def with_auxiliary(cfg: Path) -> Path:
    """`cfg` (a `grpo_config`) with the AUXILIARY buffer added to its trainer input."""
    anchor = "  trainer_input:\n"
    cfg.write_text(cfg.read_text().replace(anchor, anchor + AUXILIARY, 1))
    return cfg


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


def grpo_outcome(run_dir: Path) -> dict:
    """What a `grpo_config` run (3 steps, evaluation at step 2) trained, for bit-exact
    comparisons: per step (loss, reward, weights version), the evaluations, the final weights."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("train/loss", "rollout/reward_mean", "rollout/model_version")
    return {
        "steps": {r["step"]: tuple(r.get(k) for k in keys) for r in recs if "train/loss" in r},
        "eval": {
            r["step"]: r["eval/add_eval/accuracy"] for r in recs if "eval/add_eval/accuracy" in r
        },
        "weights": load_file(run_dir / "global_step_3" / "model.safetensors"),
    }


def assert_same_on_policy_training(a: dict, b: dict) -> None:
    """Two `grpo_outcome`s of strictly on-policy runs are the same, bit for bit."""
    assert b["steps"] == a["steps"] and len(a["steps"]) == 3
    assert [v for *_, v in a["steps"].values()] == [0, 1, 2]  # on-policy versions
    assert 2 in a["eval"] and b["eval"] == a["eval"]
    for k, w in a["weights"].items():
        assert torch.equal(w, b["weights"][k]), k


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below `pid` (from `ps`)."""
    rows = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True)
    children: dict[int, list[tuple[int, str]]] = {}
    for line in rows.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2:
            children.setdefault(int(parts[1]), []).append((int(parts[0]), [*parts, ""][2]))
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = args
            todo.append(child)
    return found


@pytest.mark.slow  # a crash trial: ten steps around a SIGKILLed engine
def test_a_run_survives_a_crashed_engine_and_keeps_its_weights(tmp_path, tiny_model_dir):
    """SIGKILL the rollout engine's process mid-run: Ray restarts it, the explorer gives it the
    weights it held, and every later step still samples with the weights of the step before."""
    import time

    cfg = grpo_config(tmp_path, tiny_model_dir)
    # engines in processes of their own (the one-process layout has none to restart: a crash
    # ends that run, with the command that continues it, tests/test_stop.py)
    sets = ["buffer.total_steps=10", "explorer.eval_interval=0", "cluster.one_process=false"]
    env = {**os.environ, "TRINITY_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg)]
    p = subprocess.Popen(
        cmd + [a for s in sets for a in ("--set", s)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    metrics_file = tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl"
    killed, deadline = [], time.monotonic() + 180
    try:
        while not killed and p.poll() is None and time.monotonic() < deadline:
            steps = metrics_file.read_text().count('"train/loss"') if metrics_file.exists() else 0
            if steps >= 1:  # on-policy: the explorer is at most one step ahead of the trainer
                engines = [pid for pid, a in descendants(p.pid).items() if "HFRolloutEngine" in a]
                for pid in engines:
                    os.kill(pid, 9)
                killed += engines
            time.sleep(0.05)
        out, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    assert len(killed) == 1, killed  # one engine, killed once
    assert p.returncode == 0, out[-3000:]
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    by_step = {rec["step"]: rec for rec in records if "rollout/model_version" in rec}
    assert sorted(by_step) == list(range(1, 11))
    # on-policy across the crash: the restarted engine did not fall back to the start weights
    assert [by_step[s]["rollout/model_version"] for s in range(1, 11)] == list(range(10))
    assert by_step[10]["rollout/engine_restarts"] == 1


@pytest.mark.slow  # one stage per algorithm (about twenty), each starting its actors anew
def test_every_rollout_algorithm_type_trains_on_the_quickstart_task(tmp_path, tiny_model_dir):
    """One stage per registered algorithm that learns from rollouts, two steps each, in one run:
    each selects its pieces by `algorithm_type` alone and trains (finite loss, weights move on)."""
    from trinity.algorithm import ALGORITHM

    names = [n for n in ALGORITHM.names() if ALGORITHM.get(n).use_rollout]
    assert {"grpo", "gspo", "cispo", "sapo"} <= set(names)
    extra = {  # what a record needs beyond the base config
        "on_policy_distill": ", explorer: {auxiliary_models: [{model_path: 'tiny://1m?seed=1'}]}",
    }
    algo_extra = {  # dynamic sampling may try 2 × 4 tasks a step: 40 tasks last 2 steps
        "dapo": ", filter_groups: {max_num_gen_batches: 2}",
    }
    stages = "".join(
        f"  - {{stage_name: {n}, algorithm: {{algorithm_type: {n}{algo_extra.get(n, '')}}}"
        f"{extra.get(n, '')}}}\n"
        for n in names
    )
    cfg = with_auxiliary(grpo_config(tmp_path, tiny_model_dir, "stages:\n" + stages))
    r = run_trinity(
        cfg, timeout=600,
        overrides=["buffer.total_steps=2", "explorer.eval_interval=0",
                   "buffer.explorer_input.eval_tasksets=[]"],
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for n in names:
        trained = [rec for rec in records if rec.get("stage") == n and "train/loss" in rec]
        assert len(trained) == 2, (n, trained)
        assert all(math.isfinite(rec["train/loss"]) for rec in trained), n
        assert (run_dir / n / "global_step_2" / "model.safetensors").exists(), n
    by_stage = {n: [rec for rec in records if rec.get("stage") == n and "train/loss" in rec]
                for n in names}  # fmt: skip
    for rec in by_stage["ppo"]:  # the critic trains beside the policy and is checkpointed
        assert rec["critic/vf_loss"] >= 0
    assert (run_dir / "ppo" / "global_step_2" / "critic" / "model.safetensors").exists()
    for n in ("mix", "mix_chord"):  # 4 tasks × 4 samples + as many expert rows (ratio 0.5)
        for rec in by_stage[n]:
            assert rec["train/experiences"] == 32.0 and rec["train/expert/sft_loss"] > 0, n
    for rec in by_stage["raft"]:  # one best rollout per task
        assert rec["train/experiences"] == 4.0


def test_grpo_end_to_end(grpo_run, tiny_model_dir):
    r, root = grpo_run  # grpo_config's run, a checkpoint after every step (shared, read only)
    run_dir = root / "ckpt" / "e2e" / "grpo"
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
    # the run's other monitors (the fixture's overrides): an offline wandb run, an MLflow file
    # store whose metric history is metrics.jsonl's, and Ray's timeline of the run
    assert len(list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))) == 1
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-in to its file store
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (mlrun,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert mlrun.info.run_name == "grpo"
    losses = [(m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, "train/loss")]
    assert losses == [(s, by_step[s]["train/loss"]) for s in (1, 2, 3)]
    timeline = json.loads((run_dir / "timeline.json").read_text())
    # Ray's events of the actors' calls: category task::<Class>.<method>; with no layout key set,
    # this machine's run is one process, whose explorer and trainer the ServiceHost serves
    assert "layout: one process (chosen" in r.stdout
    assert any(str(event.get("cat")).startswith("task::ServiceHost.call") for event in timeline)
    assert "(metrics.jsonl, tensorboard/, wandb/, mlruns/, summary.json)" in r.stdout.replace(
        "\n", ""
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["peak_pss_scope"] == "tree" and summary["peak_pss_gb"] > 0.1
    # the start-up timeline: in the first step's record only, each mark after what it needs
    marks = {k.removeprefix("startup/").removesuffix("_s"): v for k, v in by_step[1].items()
             if k.startswith("startup/")}  # fmt: skip
    assert set(marks) == set(PHASES), marks
    assert not any(k.startswith("startup/") for s in (0, 2, 3) for k in by_step[s])
    assert summary["startup_seconds"] == {f"{k}_s": v for k, v in marks.items()}
    for before, after in [
        ("config", "ray"), ("ray", "trainer_imports"), ("ray", "explorer_imports"),
        ("trainer_imports", "trainer_ready"), ("explorer_imports", "explorer_ready"),
        ("engine_ready", "explorer_ready"), ("explorer_ready", "first_rollout"),
        ("trainer_ready", "first_update"), ("first_rollout", "first_update"),
    ]:  # fmt: skip
        assert marks[before] <= marks[after], (before, after, marks)
    assert marks["first_update"] < summary["wall_seconds"] + marks["config"]
    assert "start-up  config" in r.stdout
    assert [(s["name"], s["steps"]) for s in summary["stages"]] == [("main", 3)]
    assert summary["stages"][0]["checkpoint"].endswith("global_step_3")
    # the final checkpoint is a transformers directory whose weights moved
    ckpt = run_dir / "global_step_3"
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(ckpt / "model.safetensors")
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4
    assert "summary" in r.stdout and str(run_dir) in r.stdout.replace("\n", "")
    # trainer and engine each reserve half the free cores and, taking turns, use them all
    line = next(x for x in r.stdout.splitlines() if x.startswith("resources:"))
    assert re.fullmatch(
        r"resources: trainer ([\d.]+) CPU \((\d+) threads\); each engine \1 CPU \(\2 threads\)",
        line,
    ), line
    # every experience written was trained once and acked at its step's checkpoint
    assert buffer_counts(root / "grpo.yaml") == {
        "written": 3 * 4 * 4, "trained": 3 * 4 * 4, "pending": 0, "leased": 0, "dropped": 0,
        "trained_twice": 0,
    }  # fmt: skip


def buffer_counts(config: Path, buffer: str = "buffer/exp.db") -> dict:
    """`trinity buffer stats --config config` (as a user runs it): one buffer file's counts."""
    stats = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "buffer", "stats", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    return json.loads(stats.stdout)[buffer]


def user_module(tmp_path: Path, package: str, module: str, source: str) -> None:
    """Write `tmp_path/package/module.py` (a user's workflow package) with `source`."""
    pkg = tmp_path / package
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / f"{module}.py").write_text(source)


def test_actor_failure_exits_nonzero_with_traceback(tmp_path, tiny_model_dir):
    user_module(
        tmp_path,
        "userpkg",
        "boom",
        "from trinity.workflows import Workflow\n"
        "class Boom(Workflow):\n"
        "    async def run(self, task, model):\n"
        "        raise ValueError('kaboom from the user workflow')\n",
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


# nccl's bit-exact transfer is covered fast in test_sync_collective; its full run is slow-marked
@pytest.mark.slow  # whole runs; make test keeps room under its 6 minutes (sync: test_sync_*)
@pytest.mark.parametrize("method", ["checkpoint", pytest.param("nccl", marks=pytest.mark.long)])
def test_sync_method_with_offset(tmp_path, tiny_model_dir, method):
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        extra=f"synchronizer: {{sync_method: {method}, sync_interval: 1, sync_offset: 1}}\n",
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


@pytest.mark.long  # whole runs; make test keeps room under its 6 minutes
@pytest.mark.parametrize("style", ["trainer_driven", "explorer_driven"])
def test_dynamic_sync_styles_with_staleness_admission(tmp_path, tiny_model_dir, style):
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        extra=f"synchronizer: {{sync_method: memory, sync_style: {style}, sync_interval: 2}}\n",
    )
    text = cfg.read_text().replace("total_steps: 3", "total_steps: 5")
    text = text.replace(
        "  repeat_times: 4\n",
        "  repeat_times: 4\n  sample_strategy: staleness_control\n"
        "  sample_strategy_args: {max_staleness: 1}\n",
    )
    cfg.write_text(text)
    r = run_trinity(cfg)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    by_step = {
        json.loads(x)["step"]: json.loads(x)
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
    }
    used = [int(by_step[s]["rollout/model_version"]) for s in range(1, 6)]
    published = [s for s in range(1, 6) if "sync/publish_s" in by_step[s]]
    # admission: explore step s starts with weights of train step >= s - 2 (max_staleness 1),
    # and never with weights not trained yet (<= s - 1)
    assert all(s - 2 <= v <= s - 1 for s, v in zip(range(1, 6), used, strict=True) if s > 2), used
    assert used == sorted(used) and set(used) - {0} <= set(published)
    # the trainer sees it: no experience more than 1 version older than the weights training it
    assert max(by_step[s]["staleness/max"] for s in range(1, 6)) <= 1
    counts = [
        v for s in range(1, 6) for k, v in by_step[s].items() if k.startswith("staleness/count_")
    ]
    assert sum(counts) == 5 * 4 * 4  # the histogram covers every experience trained
    if style == "trainer_driven":
        # unasked, every sync_interval train steps; the explorer waits for v2 before step 3
        # (it needs >= 1) and for v4 before step 5 (it needs >= 3)
        assert published == [2, 4] and used == [0, 0, 2, 2, 4]
    else:
        # published only when the explorer asked: it needs new weights before steps 3 to 5
        assert 1 <= len(published) <= 3
    assert buffer_counts(cfg)["trained"] == 5 * 4 * 4


@pytest.mark.slow  # two whole runs compared update by update (30-37 s)
def test_async_at_staleness_0_makes_the_same_updates_as_sync(tmp_path, tiny_model_dir):
    # explorer_driven with max_staleness 0: every explore step must start with the weights of the
    # previous train step, so the run is on-policy lockstep by admission; for a fixed seed it
    # trains exactly what the fixed schedule trains (threads pinned: the plans differ otherwise)
    pinned = ["trainer.num_threads=1", "explorer.rollout_model.num_threads=1"]
    losses, weights = {}, {}
    for style in ("fixed", "explorer_driven"):
        d = tmp_path / style
        d.mkdir()
        cfg = grpo_config(d, tiny_model_dir, extra=f"synchronizer: {{sync_style: {style}}}\n")
        cfg.write_text(
            cfg.read_text().replace(
                "  repeat_times: 4\n",
                "  repeat_times: 4\n  sample_strategy: staleness_control\n"
                "  sample_strategy_args: {max_staleness: 0}\n",
            )
        )
        r = run_trinity(cfg, overrides=[*pinned, "explorer.eval_interval=0"])
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        run_dir = d / "ckpt" / "e2e" / "grpo"
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[style] = {
            r["step"]: (r["train/loss"], r["rollout/model_version"])
            for r in recs
            if "train/loss" in r
        }
        weights[style] = load_file(run_dir / "global_step_3" / "model.safetensors")
    assert losses["explorer_driven"] == losses["fixed"]
    assert [v for _, v in losses["fixed"].values()] == [0, 1, 2]
    for k, w in weights["fixed"].items():
        assert torch.equal(w, weights["explorer_driven"][k]), k


@pytest.mark.long  # a whole run; make test keeps room under its 6 minutes
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


@pytest.mark.long  # a recovery trial: a whole run after a dead cluster's address file
def test_stale_ray_address_file_falls_back_to_a_local_instance(tmp_path, tiny_model_dir):
    # a `ray start --head` that was killed leaves its address file behind: `ray_address: auto`
    # used to try the dead cluster for ~35 s and fail; now it says so and starts a local one
    import shutil
    import socket
    import tempfile

    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    try:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
        env = {"RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}  # `auto` reads the file
        short = ["buffer.total_steps=1", "explorer.eval_on_startup=false"]
        r = run_trinity(
            grpo_config(tmp_path, tiny_model_dir), env_extra=env,
            overrides=[*short, "cluster.one_process=false"], timeout=180,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"the Ray cluster at 127.0.0.1:{port}" in r.stderr
        assert "does not answer; starting a local instance" in r.stderr
        # one process needs no Ray: the dead cluster is not joined, and nothing waits for it
        one = run_trinity(grpo_config(tmp_path, tiny_model_dir), env, overrides=short, timeout=180)
        assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
        assert "without Ray: nothing in the run spans processes" in one.stdout
        # an explicitly named address that does not answer is a config error, found at once
        bad = run_trinity(
            grpo_config(tmp_path, tiny_model_dir),
            overrides=[f"cluster.ray_address=127.0.0.1:{port}"],
            timeout=60,
        )
        assert bad.returncode == 2, bad.stderr[-2000:]
        assert "no Ray cluster answers there" in bad.stderr
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_failing_tasks_are_dropped_counted_and_replaced(tmp_path, tiny_model_dir):
    # a flaky environment: every 5th task raises. Up to max_failure_fraction of a step may fail;
    # each dropped task is replaced by the next one, so every step still trains on 4 tasks
    user_module(
        tmp_path,
        "flakypkg",
        "flaky",
        "from trinity.workflows.math_workflow import MathWorkflow\n"
        "class Flaky(MathWorkflow):\n"
        "    async def run(self, task, model):\n"
        "        if task.index % 5 == 0:\n"
        "            raise RuntimeError('flaky environment')\n"
        "        return await super().run(task, model)\n",
    )
    cfg = grpo_config(tmp_path, tiny_model_dir)
    r = run_trinity(
        cfg,
        env_extra={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        overrides=[
            "buffer.explorer_input.default_workflow_type=flakypkg.flaky.Flaky",
            "explorer.max_retry_times=1",
            "explorer.max_failure_fraction=0.5",
            "explorer.eval_on_startup=false",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [
        json.loads(line)
        for line in (tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [rec for rec in records if "rollout/tasks" in rec]
    assert len(steps) == 3
    for rec in steps:  # tasks 0-3 (+4), 5-8 (+9), 10-13 (+14): one failure per step, refilled
        assert rec["rollout/failed_tasks"] == 1.0
        assert rec["rollout/retries"] == 1.0  # the failing task was tried twice
        assert rec["rollout/tasks"] == 4.0
        assert "train/loss" in rec


@pytest.mark.long  # a topology: a `ray start` cluster and three `trinity run` processes
def test_two_explorers_and_a_trainer_as_three_processes_on_one_cluster(tmp_path, tiny_model_dir):
    # fully asynchronous RFT as Trinity-RFT users run it: `ray start --head`, then two
    # `trinity run`s with mode explore (distinct explorer names) and one with mode train, sharing
    # the run's buffer and synchronizer by name (in the namespace of project/name), each started
    # by whichever came first; the buffer ends when both explorers have released it
    import time

    with private_cluster() as cluster:
        port, env = cluster.port, cluster.env
        cfg = grpo_config(tmp_path, tiny_model_dir)
        # The trainer starts once both explorers have written their first step, so both are
        # registered writers by then: the buffer ends only when both have released it. (With its
        # step budget the trainer would also wait for an explorer started later:
        # tests/test_topologies.py.) The explorers may still be running.
        common = [f"cluster.ray_address=127.0.0.1:{port}", "buffer.explorer_input.eval_tasksets=[]"]
        cache = tmp_path / "cache"
        run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
        procs = {}
        roles = {
            "alpha": ["mode=explore", "explorer.name=alpha", "buffer.total_steps=4"],
            "beta": ["mode=explore", "explorer.name=beta", "buffer.total_steps=4"],
            "train": ["mode=train", "buffer.total_steps=8"],  # what both explorers write
        }
        for mode, own in roles.items():
            if mode == "train":
                deadline = time.time() + 300
                for name in ("alpha", "beta"):
                    log = run_dir / f"metrics.explorer-{name}.jsonl"
                    while not (log.is_file() and log.read_text().strip()):
                        assert time.time() < deadline, f"{name} wrote no step in 300 s"
                        assert procs[name].poll() in (None, 0), procs[name].communicate()
                        time.sleep(0.5)
            sets = [a for o in [*common, *own] for a in ("--set", o)]
            procs[mode] = subprocess.Popen(
                [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg), *sets],
                cwd=ROOT,
                env={**env, "TRINITY_CACHE_DIR": str(cache)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        try:
            outs = {mode: p.communicate(timeout=420) for mode, p in procs.items()}
        except subprocess.TimeoutExpired as e:
            for p in procs.values():
                p.kill()
            outs = {mode: p.communicate() for mode, p in procs.items()}
            raise AssertionError({m: (o[-3000:], r[-3000:]) for m, (o, r) in outs.items()}) from e
        for mode, p in procs.items():
            assert p.returncode == 0, (mode, outs[mode][0][-2000:], outs[mode][1][-3000:])

        def read(name: str) -> list[dict]:
            return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]

        trained = [r["step"] for r in read("metrics.trainer.jsonl") if "train/loss" in r]
        for name in ("alpha", "beta"):
            explored = [r for r in read(f"metrics.explorer-{name}.jsonl") if "rollout/tasks" in r]
            assert [r["step"] for r in explored] == [1, 2, 3, 4], name
        assert trained == list(range(1, 9))
        assert (run_dir / "global_step_8" / "model.safetensors").exists()
        for part in ("trainer", "explorer-alpha", "explorer-beta"):  # one summary per process
            assert json.loads((run_dir / f"summary.{part}.json").read_text())["stages"], part
        counts = buffer_counts(cfg)
        assert counts["written"] == counts["trained"] == 2 * 4 * 4 * 4, counts
        assert counts["leased"] == counts["pending"] == counts["trained_twice"] == 0
        # the last process to finish ended the shared actors: nothing is left in the namespace
        assert named_actors(cluster, "trinity:e2e/grpo") == []


@pytest.mark.long  # a topology: a two-node `ray start` cluster
def test_node_num_spreads_the_engines_over_the_cluster_s_nodes(tmp_path, tiny_model_dir):
    # a two-node Ray cluster on this machine (two raylets, as Ray's own tests build one): the
    # trainer and engine 0 go to the first node, engine 1 to the other
    import tempfile

    from ray.cluster_utils import Cluster

    ray_tmp = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # short: Ray's socket paths
    env = {"RAY_TMPDIR": str(ray_tmp)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cfg = grpo_config(tmp_path, tiny_model_dir)
    sets = ["cluster.node_num=2", "explorer.rollout_model.engine_num=2", "buffer.total_steps=2",
            "buffer.explorer_input.eval_tasksets=[]"]  # fmt: skip
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ids = {cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)}
        r = run_trinity(cfg, env, overrides=[*sets, f"cluster.ray_address={cluster.address}"])
        out = " ".join(r.stdout.split())
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        placed = re.search(r"nodes: 2: (\w+) \(trainer, engine 0\); (\w+) \(engine 1\)", out)
        assert placed, out[-3000:]
        first, second = placed.groups()
        assert first != second
        assert all(any(i.startswith(p) for i in ids) for p in (first, second)), (ids, first, second)
        run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
        steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in steps if "train/loss" in r] == [1, 2]
    finally:
        cluster.shutdown()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    # no cluster to join (ray_address auto): the local instance started is one node, refused at
    # once naming the key; `ray_address: local` is refused by validate already (broken configs)
    r = run_trinity(cfg, {**env, "RAY_ADDRESS": ""}, overrides=sets)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cluster.node_num=2" in r.stderr and "ray start --head" in r.stderr
