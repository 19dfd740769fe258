"""Every topology ends cleanly, whichever side runs out first (slow: real processes on a cluster).

The matrix of issue "runs that cannot hang": {mode both; an explore and a train process; two
explorers and a trainer, the second explorer started after the first finished} x {the trainer's
step budget is reached first; the explorers' tasks run out first}. Each cell: every process exits
0 within its bound, `trinity buffer stats` shows written = trained + dropped with nothing pending,
leased or trained twice, and the run's shared actors are gone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.ray_cluster import Cluster, named_actors, private_cluster
from trinity.buffer.sqlite_log import SQLiteLog

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

PER_STEP = 4 * 4  # batch_size tasks x repeat_times samples: experiences per explore step


def config(tmp_path: Path, model_dir: Path, name: str, extra: str = "") -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: topo
        name: {name}
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {model_dir}, max_response_tokens: 4}}
        algorithm:
          algorithm_type: grpo
          repeat_times: 4
          optimizer: {{lr: 1.0e-3}}
        buffer:
          batch_size: 4
          explorer_input:
            taskset:
              name: add
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 2, num_tasks: 200, seed: 0}}
              format: {{prompt_key: question, response_key: answer}}
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue, max_read_timeout: 60}}
        explorer: {{runner_per_model: 16}}
        trainer: {{micro_batch_size_per_gpu: 16, use_dynamic_bsz: false}}
        monitor: {{monitor_type: jsonl}}
        """)
        + extra
    )
    return cfg


def start(cfg: Path, cluster: Cluster | None, *sets: str) -> subprocess.Popen:
    args = [a for s in sets for a in ("--set", s)]
    if cluster is not None:
        args += ["--set", f"cluster.ray_address={cluster.address}"]
    else:
        args += ["--set", "cluster.ray_address=local"]
    env = cluster.env if cluster is not None else None
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg), *args],
        cwd=ROOT,
        env={**(env or __import__("os").environ), "TRINITY_CACHE_DIR": str(cfg.parent / "cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: dict[str, subprocess.Popen], bound_s: float) -> dict[str, str]:
    """Wait for every process (all of them within `bound_s` s); each must exit 0."""
    deadline, outs = time.time() + bound_s, {}
    try:
        for role, p in procs.items():
            out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
            outs[role] = out + err
    except subprocess.TimeoutExpired as e:
        for p in procs.values():
            p.kill()
        tails = {r: "".join(p.communicate())[-3000:] for r, p in procs.items()}
        raise AssertionError(f"not done within {bound_s} s: {tails}") from e
    for role, p in procs.items():
        assert p.returncode == 0, (role, outs[role][-4000:])
    return outs


def wait_exit(p: subprocess.Popen, bound_s: float) -> str:
    out, err = p.communicate(timeout=bound_s)
    assert p.returncode == 0, (out + err)[-4000:]
    return out + err


def counts(cfg: Path) -> dict[str, int]:
    stats = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "buffer", "stats", "--config", str(cfg)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    (only,) = json.loads(stats.stdout).values()
    return only


def trained_steps(run_dir: Path, part: str) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / f"metrics{part}.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train/loss" in r]


def explored_steps(run_dir: Path, part: str) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / f"metrics{part}.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "rollout/tasks" in r]


def assert_clean(c: dict[str, int], trained: int) -> None:
    assert c["trained"] == trained, c
    assert c["written"] == c["trained"] + c["dropped"], c
    assert c["pending"] == c["leased"] == c["trained_twice"] == 0, c


@pytest.fixture(scope="module")
def cluster():
    with private_cluster() as c:
        yield c


CPUS4 = 4  # Ray's count, not the machine's: room for a trainer and two one-engine explorers


@pytest.fixture(scope="module")
def cluster4():
    # two explorers and a trainer at one thread or more each need 4 CPUs: on 2 the ledger's
    # floor (one thread per engine) holds 3 (common.resources.RunShares)
    with private_cluster(num_cpus=CPUS4) as c:
        yield c


SHARE_LINE = re.compile(
    r"resources: (?P<plan>.*?); (?P<role>\S+) holds (?P<held>\d+) of the run's (?P<cpus>\d+) "
    r"CPUs \((?P<ledger>[^)]*)\)(?P<waits>, waits for its part)?"
)


def assert_shares(outs: dict[str, str], cpus: int, engines: int = 1) -> dict[str, list[int]]:
    """From every `resources:` line of a split run's processes (each at start, an explorer's
    again whenever its part changes): the run's ledger never holds more than the cluster's
    `cpus`, and a process never runs more threads than it holds. Returns each role's holdings
    in the order printed."""
    held: dict[str, list[int]] = {}
    for out in outs.values():
        for m in SHARE_LINE.finditer(out):
            assert int(m["cpus"]) == cpus, m[0]
            assert "oversubscribed" not in m["ledger"], m[0]
            ledger = [e.removesuffix(" kept back").rsplit(" ", 1) for e in m["ledger"].split(", ")]
            assert sum(int(v) for _, v in ledger) <= cpus, m[0]
            threads = [int(t) for t in re.findall(r"\((\d+) threads\)", m["plan"])]
            mine = threads[0] if m["role"] == "trainer" else engines * threads[0]
            if int(m["held"]) == 0:  # its engine loads on one thread; it computes nothing yet
                assert m["waits"], m[0]
            else:
                assert mine <= int(m["held"]), m[0]
            held.setdefault(m["role"], []).append(int(m["held"]))
    return held


@pytest.mark.long
@pytest.mark.parametrize(
    ("steps", "tasks", "expect"),
    [(3, 200, 3), (50, 12, 3)],
    ids=["budget_first", "tasks_first"],
)
def test_mode_both(tmp_path, tiny_model_dir, steps, tasks, expect):
    # one process: explorer and trainer plan the same steps, min(budget, what the tasks give)
    cfg = config(tmp_path, tiny_model_dir, "both")
    p = start(
        cfg,
        None,
        f"buffer.total_steps={steps}",
        f"buffer.explorer_input.taskset.generator_args.num_tasks={tasks}",
        "buffer.total_epochs=1",
    )
    finish({"both": p}, bound_s=240)
    run_dir = tmp_path / "ckpt" / "topo" / "both"
    assert trained_steps(run_dir, "") == list(range(1, expect + 1))
    assert_clean(counts(cfg), trained=expect * PER_STEP)


@pytest.mark.long
def test_explore_and_train_processes_trainer_budget_first(tmp_path, tiny_model_dir, cluster):
    # the trainer's budget (3 steps) ends the run: the explorer, planning 20, is told by its
    # next write and stops cleanly; what it wrote past the budget is dropped, counted. The
    # queue holds one step (capacity 16): a write waits for the trainer to read, so the
    # explorer cannot finish its 20 steps before a slow-starting trainer has trained 3 (mode
    # explore never waits for weights; without the bound a loaded machine let it, on CI)
    cfg = config(tmp_path, tiny_model_dir, "split_budget")
    cap = f"buffer.trainer_input.experience_buffer.capacity={PER_STEP}"
    procs = {
        "train": start(cfg, cluster, "mode=train", "buffer.total_steps=3", cap),
        "explore": start(cfg, cluster, "mode=explore", "buffer.total_steps=20", cap),
    }
    outs = finish(procs, bound_s=300)
    # told either by its next write (the buffer is closed for good) or, first, by its wait
    # for weights the trainer will never publish: both stop it cleanly, and say so
    assert re.search(
        r"explorer 'explorer': the trainer (has finished|finished after step 3)"
        r".*; stopping after explore step \d+",
        outs["explore"],
    ), outs["explore"][-3000:]
    run_dir = tmp_path / "ckpt" / "topo" / "split_budget"
    assert trained_steps(run_dir, ".trainer") == [1, 2, 3]
    assert len(explored_steps(run_dir, ".explorer-explorer")) < 20
    assert_clean(counts(cfg), trained=3 * PER_STEP)
    assert named_actors(cluster, "trinity:topo/split_budget") == []


@pytest.mark.parametrize("storage", ["queue", pytest.param("sql", marks=pytest.mark.long)])
def test_explore_and_train_processes_tasks_first(tmp_path, tiny_model_dir, cluster, storage):
    # no budget on the trainer: it trains until its explorer has finished (3 steps); the two
    # processes meet in a queue or in sql storage (a SQLite file in the run folder)
    cfg = config(tmp_path, tiny_model_dir, "split_tasks")
    cfg.write_text(cfg.read_text().replace("storage_type: queue", f"storage_type: {storage}"))
    procs = {
        "train": start(cfg, cluster, "mode=train"),
        "explore": start(cfg, cluster, "mode=explore", "buffer.total_steps=3"),
    }
    finish(procs, bound_s=300)
    run_dir = tmp_path / "ckpt" / "topo" / "split_tasks"
    assert trained_steps(run_dir, ".trainer") == [1, 2, 3]
    assert_clean(counts(cfg), trained=3 * PER_STEP)
    assert named_actors(cluster, "trinity:topo/split_tasks") == []
    # run again without continue_from_checkpoint: both processes agree on one fresh folder
    # (the first to start names it), and nothing of the first run is read or trained again
    before = counts(cfg)
    procs = {
        "train": start(cfg, cluster, "mode=train"),
        "explore": start(cfg, cluster, "mode=explore", "buffer.total_steps=2"),
    }
    finish(procs, bound_s=300)
    (fresh,) = [p for p in run_dir.parent.iterdir() if p.name.startswith("split_tasks_")]
    assert trained_steps(fresh, ".trainer") == [1, 2]
    assert explored_steps(fresh, ".explorer-explorer") == [1, 2]
    assert_clean(counts(cfg), trained=2 * PER_STEP)  # buffer stats reads the newest run
    stats_old = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "buffer", "stats", "--config", str(cfg)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert str(fresh) in stats_old.stderr
    # the first run's folder is as it was
    assert trained_steps(run_dir, ".trainer") == [1, 2, 3]
    if storage == "sql":
        from trinity.buffer.sql_inspect import buffer_counts

        old = str(run_dir / "buffer" / "exp.sqlite")
        assert buffer_counts(old) == {"topo/split_tasks/exp": before}
        return
    old = SQLiteLog(run_dir / "buffer" / "exp.db", read_only=True)
    assert old.counts() == before
    old.close()


@pytest.mark.long
@pytest.mark.parametrize(
    ("budget", "trained"), [(6, 6), (20, 8)], ids=["budget_first", "tasks_first"]
)
def test_a_second_explorer_started_after_the_first_finished(
    tmp_path, tiny_model_dir, cluster4, budget, trained
):
    # alpha explores 4 steps and exits; only then beta starts (4 steps). A trainer with a step
    # budget waits for beta (it lingers up to max_read_timeout once every explorer it knows has
    # finished): budget 6 ends the run in beta's third step; budget 20 trains all 8, then ends
    # when no further explorer joins within the linger. Cores (4): the trainer holds its half
    # (2), alpha the explorers' half (2) and gives it back when done, so beta holds it then
    name = f"late_{budget}"
    cfg = config(tmp_path, tiny_model_dir, name)
    cluster = cluster4
    trainer = start(cfg, cluster, "mode=train", f"buffer.total_steps={budget}")
    alpha = start(cfg, cluster, "mode=explore", "explorer.name=alpha", "buffer.total_steps=4")
    out_alpha = wait_exit(alpha, 300)
    beta = start(cfg, cluster, "mode=explore", "explorer.name=beta", "buffer.total_steps=4")
    outs = finish({"train": trainer, "beta": beta}, bound_s=300)
    held = assert_shares({**outs, "alpha": out_alpha}, CPUS4)
    assert held["trainer"] == [2] and set(held["explorer/alpha"]) == set(held["explorer/beta"]) == {
        2
    }
    run_dir = tmp_path / "ckpt" / "topo" / name
    assert trained_steps(run_dir, ".trainer") == list(range(1, trained + 1))
    assert explored_steps(run_dir, ".explorer-alpha") == [1, 2, 3, 4]
    assert_clean(counts(cfg), trained=trained * PER_STEP)
    assert named_actors(cluster, f"trinity:topo/{name}") == []


def wait_for_step(log: Path, key: str, step: int, procs: list[subprocess.Popen], bound_s: float):
    """Until `log` (a metrics file) has a record with `key` at step >= `step`."""
    deadline = time.time() + bound_s
    while True:
        if log.is_file():
            rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
            if any(key in r and r["step"] >= step for r in rows):
                return
        for p in procs:
            assert p.poll() is None, "".join(p.communicate())[-4000:]
        assert time.time() < deadline, f"{log} reached no step {step} in {bound_s} s"
        time.sleep(0.5)


def test_sigkill_the_trainer_of_a_split_run_and_start_it_again_alone(
    tmp_path, tiny_model_dir, cluster
):
    # the trainer checkpoints every 2 steps; killed after step 3 it comes back alone (the same
    # command), joins the live run, resumes from its newest checkpoint, takes back the leases its
    # dead process held, and the synchronizer accepts its older weights version: nothing lost,
    # nothing trained twice, the run ends. The queue holds one step (capacity 16), so the
    # explorer's writes wait for the trainer: it cannot finish its 20 steps before the kill
    # lands (mode explore never waits for weights; a slow-starting trainer let it, unbounded)
    cfg = config(tmp_path, tiny_model_dir, "kill_trainer")
    run_dir = tmp_path / "ckpt" / "topo" / "kill_trainer"
    cap = f"buffer.trainer_input.experience_buffer.capacity={PER_STEP}"
    train_args = ("mode=train", "buffer.total_steps=20", "trainer.save_interval=2", cap)
    trainer = start(cfg, cluster, *train_args)
    explorer = start(cfg, cluster, "mode=explore", "buffer.total_steps=20", cap)
    wait_for_step(run_dir / "metrics.trainer.jsonl", "train/loss", 3, [trainer, explorer], 300)
    trainer.kill()  # SIGKILL: no clean-up of any kind
    trainer.communicate()
    again = start(cfg, cluster, *train_args)
    outs = finish({"train": again, "explore": explorer}, bound_s=400)
    assert "joining the live run" in outs["train"], outs["train"][-3000:]
    # from its newest checkpoint: step 2, or a later even step if it got that far before the kill
    resumed = re.search(r"the trainer resumes from \S*global_step_(\d+)", outs["train"])
    assert resumed and int(resumed.group(1)) % 2 == 0 < int(resumed.group(1)) < 20, outs["train"]
    assert (run_dir / "global_step_20" / "model.safetensors").exists()
    # every step has its train record; a step the dead trainer checkpointed exactly one (it was
    # journaled before its checkpoint, and merged by the new process); the steps after that
    # checkpoint are trained again and recorded again (the later record wins)
    steps = trained_steps(run_dir, ".trainer")
    assert sorted(set(steps)) == list(range(1, 21))
    assert [s for s in steps if s <= int(resumed.group(1))] == list(
        range(1, int(resumed.group(1)) + 1)
    )
    assert_clean(counts(cfg), trained=20 * PER_STEP)
    assert named_actors(cluster, "trinity:topo/kill_trainer") == []


@pytest.mark.long
def test_sigkill_one_explorer_of_two_and_start_it_again_alone(tmp_path, tiny_model_dir, cluster4):
    # alpha runs first against a buffer that holds 3 steps: it writes steps 1-3 and blocks in
    # the write of step 4. SIGKILLed there and started again alone, it joins the live run (its
    # own dead process kept it alive), a dead write still waiting takes nothing (superseded),
    # and it continues after its cursor. Then beta and the trainer join: the trainer trains what both
    # wrote, each experience once. The three run at once on 4 CPUs: their threads never sum to
    # more (the trainer's half is kept back, the explorers share the other half)
    cluster = cluster4
    cfg = config(tmp_path, tiny_model_dir, "kill_explorer")
    run_dir = tmp_path / "ckpt" / "topo" / "kill_explorer"
    cap = f"buffer.trainer_input.experience_buffer.capacity={3 * PER_STEP}"
    alpha_args = ("mode=explore", "explorer.name=alpha", "buffer.total_steps=5", cap)
    alpha = start(cfg, cluster, *alpha_args)
    wait_for_step(run_dir / "metrics.explorer-alpha.jsonl", "rollout/tasks", 3, [alpha], 300)
    time.sleep(2)  # into step 4's write, which blocks: the buffer is full
    alpha.kill()
    out_dead = "".join(alpha.communicate())
    again = start(cfg, cluster, *alpha_args)
    beta = start(cfg, cluster, "mode=explore", "explorer.name=beta", "buffer.total_steps=5", cap)
    trainer = start(cfg, cluster, "mode=train", "buffer.total_steps=10", cap)
    outs = finish({"train": trainer, "alpha": again, "beta": beta}, bound_s=400)
    assert "joining the live run" in outs["alpha"], outs["alpha"][-3000:]
    # after step 3, or 4 when the trainer made room before the new process registered and the
    # dead process's write of step 4 went through (it is then in the buffer with its cursor)
    resumed = re.search(r"continues after explore step ([34]) ", outs["alpha"])
    assert resumed, outs["alpha"][-3000:]
    assert trained_steps(run_dir, ".trainer") == list(range(1, 11))
    # every step in the buffer has exactly one record: a step 4 the dead process wrote but never
    # reported is reported from the buffer (its report was written with it) by the new process
    assert explored_steps(run_dir, ".explorer-alpha") == [1, 2, 3, 4, 5]
    assert explored_steps(run_dir, ".explorer-beta") == [1, 2, 3, 4, 5]
    held = assert_shares({**outs, "dead": out_dead}, CPUS4)
    assert held["trainer"] == [2]
    assert held["explorer/alpha"][-1] > 0 and held["explorer/beta"][-1] > 0  # nobody starved
    assert_clean(counts(cfg), trained=10 * PER_STEP)
    assert named_actors(cluster, "trinity:topo/kill_explorer") == []


@pytest.mark.long
def test_the_docs_two_process_example_runs_as_printed(tmp_path, cluster):
    # docs/running.md's block, command for command; `ray start --head` / `ray stop` are the
    # private cluster here, which `ray_address: auto` joins through RAY_ADDRESS as it would the
    # default
    guide = (ROOT / "docs" / "running.md").read_text()
    block = guide.split("Fully asynchronous RFT in two processes")[1].split("```bash\n")[1]
    lines = block.split("```")[0].strip().splitlines()
    assert lines[0] == "ray start --head" and lines[-2:] == ["wait", "ray stop"], lines
    env = {
        **cluster.env,
        "RAY_ADDRESS": cluster.address,
        "TRINITY_CHECKPOINT_ROOT": str(tmp_path / "ckpt"),
        "TRINITY_CACHE_DIR": str(tmp_path / "cache"),
    }
    procs = {}
    for line in lines[1:-2]:
        argv = line.rstrip(" &").split()
        assert argv[:2] == ["trinity", "run"], line
        procs[line] = subprocess.Popen(
            [sys.executable, "-m", "trinity.cli", *argv[1:]],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    finish(procs, bound_s=400)
    run_dir = tmp_path / "ckpt" / "async" / "grpo"
    explored = explored_steps(run_dir, ".explorer-explorer")
    assert explored == list(range(1, 9))  # 64 tasks, 8 per step
    assert trained_steps(run_dir, ".trainer") == explored
    stats = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "buffer", "stats", "--config",
         "examples/async/async_grpo.yaml"],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert_clean(json.loads(stats.stdout)["buffer/exp.db"], trained=8 * 8 * 4)


def test_two_explorers_and_a_trainer_share_one_postgresql_buffer(
    tmp_path, tiny_model_dir, cluster4, postgres_url
):
    # three processes of one run, all at once: explorers alpha and beta (3 steps each) write to
    # one sql buffer in a PostgreSQL database, the trainer (6 steps: both explorers' steps)
    # reads it. Every experience written is trained exactly once, both explorers wrote all
    # their steps, every process exits 0 and the run's actors are gone
    cfg = config(tmp_path, tiny_model_dir, "pg_split")
    buffer = f"storage_type: sql, path: '{postgres_url}'"
    cfg.write_text(cfg.read_text().replace("storage_type: queue", buffer))
    explore = ("mode=explore", "buffer.total_steps=3")
    procs = {
        "train": start(cfg, cluster4, "mode=train", "buffer.total_steps=6"),
        "alpha": start(cfg, cluster4, *explore, "explorer.name=alpha"),
        "beta": start(cfg, cluster4, *explore, "explorer.name=beta"),
    }
    outs = finish(procs, bound_s=400)
    run_dir = tmp_path / "ckpt" / "topo" / "pg_split"
    assert trained_steps(run_dir, ".trainer") == [1, 2, 3, 4, 5, 6]
    assert explored_steps(run_dir, ".explorer-alpha") == [1, 2, 3]
    assert explored_steps(run_dir, ".explorer-beta") == [1, 2, 3]
    c = counts(cfg)
    assert c["written"] == 6 * PER_STEP and c["dropped"] == 0, c
    assert_clean(c, trained=6 * PER_STEP)
    # the buffer's rows say who wrote them: half each
    from trinity.buffer.sql_url import read_only_engine

    engine = read_only_engine(postgres_url)
    with engine.connect() as conn:
        cursors = conn.exec_driver_sql(
            "SELECT explorer, step, tasks FROM trinity_cursor ORDER BY explorer"
        ).all()
    engine.dispose()
    assert [tuple(r) for r in cursors] == [("alpha", 3, 12), ("beta", 3, 12)], outs
    assert named_actors(cluster4, "trinity:topo/pg_split") == []
