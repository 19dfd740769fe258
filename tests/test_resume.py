"""A run folder that already holds a run: a fresh suffixed folder, or a resumed run."""

import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import torch
from conftest import copy_run
from safetensors.torch import load_file
from test_e2e import ROOT, buffer_counts, descendants, grpo_config, run_trinity, user_module

from trinity.config.run_folder import fresh_name


def test_fresh_name_is_trinity_rft_s_timestamp_suffix():
    assert fresh_name("add2", datetime(2026, 11, 23, 5, 4, 3)) == "add2_20261123050403"


@pytest.mark.long  # two whole runs; the folder naming itself is tested fast above
def test_rerun_gets_a_fresh_folder_and_never_trains_on_leftovers(
    tmp_path, tiny_model_dir, grpo_run
):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    copy_run(grpo_run, tmp_path)  # the first run of `cfg` (with a checkpoint every step)
    root = tmp_path / "ckpt" / "e2e"
    assert sorted(p.name for p in root.iterdir()) == ["grpo"]
    second = run_trinity(cfg)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 2 and names[0] == "grpo" and names[1].startswith("grpo_"), names
    assert "is in use by an earlier run" in second.stdout
    fresh = root / names[1]
    assert (fresh / "global_step_3").is_dir() and (fresh / "metrics.jsonl").is_file()
    # the first run's folder is as it left it: one metrics record per step, one final checkpoint
    steps = [line for line in (root / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4  # steps 0 (eval on start-up), 1, 2, 3


def sft_config(tmp_path, model_dir, total_steps: int):
    cfg = tmp_path / f"sft_{total_steps}.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: e2e
        name: sft
        mode: train
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {model_dir}, max_response_tokens: 4}}
        algorithm:
          algorithm_type: sft
          optimizer: {{lr: 1.0e-3, lr_warmup_steps: 0, lr_scheduler_type: constant}}
        buffer:
          train_batch_size: 8
          total_epochs: 3
          total_steps: {total_steps}
          trainer_input:
            experience_buffer:
              name: sft_data
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 2, num_tasks: 40}}
              format: {{prompt_key: question, response_key: answer}}
        trainer: {{micro_batch_size_per_gpu: 8, use_dynamic_bsz: false, save_interval: 2}}
        monitor: {{monitor_type: jsonl}}
        """)
    )
    return cfg


@pytest.mark.long  # a crash trial: an interrupted and an uninterrupted run (35-51 s)
def test_resumed_sft_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path, tiny_model_dir):
    # uninterrupted: 6 steps
    whole = tmp_path / "whole"
    whole.mkdir()
    r = run_trinity(sft_config(whole, tiny_model_dir, 6))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # interrupted after the checkpoint of step 4, then resumed to 6 (40 rows / 8 = 5 batches an
    # epoch: the resumed run crosses an epoch boundary in the dataset order)
    cut = tmp_path / "cut"
    cut.mkdir()
    r = run_trinity(sft_config(cut, tiny_model_dir, 4))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run_trinity(sft_config(cut, tiny_model_dir, 6), overrides=["continue_from_checkpoint=true"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resuming stage main from" in r.stdout
    # a train stage from a dataset has the machine to itself: the trainer reserves the free cores
    # and computes with them (a split run's share would be half the cluster and no reservation)
    line = next(x for x in r.stdout.splitlines() if x.startswith("resources:"))
    reserved, threads = re.match(
        r"resources: trainer ([\d.]+) CPU \((\d+) threads\)", line
    ).groups()
    assert float(reserved) > 0 and int(threads) >= float(reserved), line
    a, b = whole / "ckpt" / "e2e" / "sft", cut / "ckpt" / "e2e" / "sft"
    assert sorted(p.name for p in (cut / "ckpt" / "e2e").iterdir()) == ["sft"]  # same folder
    wa = load_file(a / "global_step_6" / "model.safetensors")
    wb = load_file(b / "global_step_6" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:  # optimizer moments, lr schedule and data order all carried over
        assert torch.equal(wa[k], wb[k]), k

    def losses(run_dir):
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in recs if "train/loss" in r}

    whole_losses, cut_losses = losses(a), losses(b)
    assert sorted(cut_losses) == [1, 2, 3, 4, 5, 6]  # each step logged once, in one file
    assert cut_losses == whole_losses


@pytest.mark.slow  # a crash trial: a run that dies at step 4, then its resume
def test_crashed_grpo_run_resumes_exactly_once(tmp_path, tiny_model_dir):
    """Explore step 4 fails (the reward code raises); the trainer had checkpointed step 2 and
    trained step 3 without a checkpoint. The resumed run retrains step 3 from the buffer and
    explores on from step 4: every experience written is trained exactly once."""
    user_module(
        tmp_path,
        "flaky",
        "reward",
        "import os\n"
        "from trinity.rewards import arithmetic_reward\n"
        "calls = 0\n"
        "def reward(response, truth, task_raw):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls > int(os.environ.get('FAIL_AFTER_CALLS', '1000000000')):\n"
        "        raise RuntimeError('the reward server went away')\n"
        "    return arithmetic_reward(response, truth, task_raw)\n",
    )
    cfg = grpo_config(tmp_path, tiny_model_dir)
    cfg.write_text(
        cfg.read_text().replace(
            "default_reward_fn_type: arithmetic_reward",
            "default_reward_fn_type: flaky.reward.reward",
        )
    )
    sets = ["buffer.total_steps=5", "trainer.save_interval=2", "explorer.eval_interval=0"]
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    # 8 eval tasks at start-up, then 3 explore steps x 4 tasks x 4 samples; step 4 fails
    crashed = run_trinity(cfg, {**env, "FAIL_AFTER_CALLS": str(8 + 3 * 16)}, overrides=sets)
    assert crashed.returncode == 1, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    assert "the reward server went away" in crashed.stdout + crashed.stderr
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    assert sorted(p.name for p in run_dir.glob("global_step_*")) == ["global_step_2"]

    resumed = run_trinity(cfg, env, overrides=[*sets, "continue_from_checkpoint=true"])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    out = " ".join(resumed.stdout.split())
    assert "resuming stage main from" in out and "global_step_2" in out
    assert "continues after explore step 3 (12 tasks handed out)" in out
    assert sorted(p.name for p in (tmp_path / "ckpt" / "e2e").iterdir()) == ["grpo"]
    assert (run_dir / "global_step_5").is_dir()
    assert buffer_counts(cfg) == {
        "written": 5 * 16, "trained": 5 * 16, "pending": 0, "leased": 0, "dropped": 0,
        "trained_twice": 0,
    }  # fmt: skip
    # on-policy after the resume too: explore step s sampled with the weights of train step s-1
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = {
        r["step"]: r["rollout/model_version"] for r in records if "rollout/model_version" in r
    }
    assert versions == {1: 0, 2: 1, 3: 2, 4: 3, 5: 4}


@pytest.mark.long  # a crash trial: a train process dead between checkpoint and ack
def test_an_explore_process_settles_the_leases_of_the_run_s_checkpoint(tmp_path, tiny_model_dir):
    """Split mode: the train process crashed between writing a checkpoint and acking its
    leases, and the explore process is the first to come back. It creates the buffer, so it is
    the one that must settle those leases as trained; otherwise the trainer would train them
    again."""
    import asyncio

    from trinity.buffer.queue import QueueStorage
    from trinity.common.experience import EID, Experience

    cfg = grpo_config(tmp_path, tiny_model_dir)
    sets = ["trainer.save_interval=2", "explorer.eval_interval=0", "explorer.eval_on_startup=false"]
    first = run_trinity(cfg, overrides=[*sets, "buffer.total_steps=2"])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    ckpt = run_dir / "global_step_2"
    # 4 more experiences, read under a lease the checkpoint records but nobody acked
    extra = [
        Experience(
            tokens=torch.tensor([1, 2, 3, i]), prompt_length=3, logprobs=torch.tensor([-0.5]),
            reward=1.0, eid=EID(batch=99, task=i, run=0), model_version=2,
        )
        for i in range(4)
    ]  # fmt: skip

    async def lease_extra() -> int:
        # the run goes on (its first part finished its 2 steps): the log takes writes again
        q = QueueStorage(str(run_dir / "buffer" / "exp.db"), capacity=100, reopen=True)
        await q.write(extra)
        return (await q.read(4)).id

    lease = asyncio.run(lease_extra())
    recorded = json.loads((ckpt / "buffer_leases.json").read_text())
    (ckpt / "buffer_leases.json").write_text(json.dumps([*recorded, lease]))
    # as if it had been saved so: the manifest lists the file's new size (else it is torn)
    manifest = json.loads((ckpt / "checkpoint_manifest.json").read_text())
    manifest["files"]["buffer_leases.json"] = (ckpt / "buffer_leases.json").stat().st_size
    (ckpt / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    assert buffer_counts(cfg)["leased"] == 4

    explore = run_trinity(
        cfg,
        overrides=[*sets, "buffer.total_steps=3", "mode=explore", "continue_from_checkpoint=true"],
    )
    assert explore.returncode == 0, explore.stdout[-3000:] + explore.stderr[-3000:]
    assert buffer_counts(cfg) == {
        "written": 3 * 16 + 4, "trained": 2 * 16 + 4, "pending": 16, "leased": 0, "dropped": 0,
        "trained_twice": 0,
    }  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_trains_nothing_twice(tmp_path, tiny_model_dir):
    """10 trials: start the run (continue_from_checkpoint), SIGKILL the driver's whole process
    group, the trainer actor or the explorer actor at a drawn moment (during start-up, or a drawn
    number of steps in), start it again; then let it finish. By experience id nothing is lost or
    trained twice, and the steps continue."""
    import contextlib
    import random
    import signal
    import tempfile
    import time

    rng = random.Random(1234)  # the moments and targets are drawn, but the same every run
    ray_tmp = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))  # short: Ray's socket paths
    cfg = grpo_config(tmp_path, tiny_model_dir)
    steps = 100  # 10 trials train at most 8 steps each: every trial is killed mid-run
    sets = [
        f"buffer.total_steps={steps}",
        "buffer.total_epochs=12",
        "trainer.save_interval=1",
        "explorer.eval_interval=0",
        "explorer.eval_on_startup=false",
        "continue_from_checkpoint=true",
        "cluster.one_process=false",
    ]  # cluster.one_process=false: trainer and explorer processes to kill
    args = [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "TRINITY_CACHE_DIR": str(tmp_path / "cache"), "RAY_TMPDIR": str(ray_tmp)}
    cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg), *args]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"

    def newest_checkpoint() -> int:
        names = (d.name.removeprefix("global_step_") for d in run_dir.glob("global_step_*"))
        return max((int(n) for n in names if n.isdigit()), default=0)

    killed, early = [], []  # early: trials that ended before their kill (exit code, log tail)
    p = None
    try:
        for trial in range(10):
            target = rng.choice(["driver", "trainer", "explorer"])
            log = tmp_path / f"trial_{trial}.log"
            with log.open("w") as out:
                p = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True,
                                     stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            # the moment is drawn in steps, not seconds, so it falls mid-run on a fast machine
            # too: during start-up (one trial in five), or 1-8 steps after the last checkpoint
            if rng.random() < 0.2:
                time.sleep(rng.uniform(1.0, 8.0))
            else:
                due, deadline = newest_checkpoint() + rng.randint(1, 8), time.monotonic() + 180
                while newest_checkpoint() < due and p.poll() is None:
                    assert time.monotonic() < deadline, f"trial {trial}: no step {due} in 180 s"
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 0.5))
            procs = descendants(p.pid)  # this run's processes only, none of an earlier trial
            if p.poll() is not None:
                early.append((trial, p.returncode, log.read_text()[-1500:]))
            else:
                if target != "driver":  # SIGKILL the actor's process, if it is up yet
                    title = "ray::TrainerRunner" if target == "trainer" else "ray::Explorer"
                    hits = [pid for pid, cmdline in procs.items() if cmdline.startswith(title)]
                    for pid in hits:
                        os.kill(pid, signal.SIGKILL)
                    target = target if hits else "driver"
                if target == "driver":
                    os.killpg(p.pid, signal.SIGKILL)
                killed.append(target)
            p.wait(timeout=120)
            for pid in procs:  # what outlived its driver (Ray workers are reparented on its death)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["pkill", "-9", "-f", str(ray_tmp)], check=False)  # Ray's leftovers
            if (run_dir / f"global_step_{steps}").is_dir():
                break
        assert len(killed) >= 10, f"only {len(killed)} trials were killed mid-run: {early}"
        final = run_trinity(cfg, {"RAY_TMPDIR": str(ray_tmp)}, overrides=sets, timeout=300)
        assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    finally:
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-f", str(ray_tmp)], check=False)
    assert (run_dir / f"global_step_{steps}").is_dir()
    counts = buffer_counts(cfg)
    assert counts["written"] == counts["trained"] == steps * 16, (killed, counts)
    assert counts["trained_twice"] == counts["pending"] == counts["leased"] == 0, (killed, counts)
    assert sorted(p.name for p in (tmp_path / "ckpt" / "e2e").iterdir()) == ["grpo"]
    # every metrics line whole after the kills, and every step has its training record: a step
    # the trainer checkpointed was reported first, and reports a killed driver had not merged
    # were journaled and merged by the next run
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    trained = {json.loads(x)["step"] for x in lines if "train/loss" in json.loads(x)}
    assert trained == set(range(1, steps + 1)), sorted(set(range(1, steps + 1)) - trained)
