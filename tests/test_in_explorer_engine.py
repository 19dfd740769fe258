"""`explorer.rollout_model.in_explorer_process`: the rollout engines run on threads of the
explorer's process (`trinity.explorer.in_process.InThread`) instead of as Ray actors.

By hand: an `InThread` engine is built before its first call, runs its calls one at a time in
the order they were made (as a Ray actor with `max_concurrency` 1), hands each call's exception
to its caller, and leaves the caller's event loop free while it works. The config checks refuse
what is not built (nccl weight sync, auxiliary models). End to end: a run with the engine in the
explorer's process trains, bit for bit, what the same run with an engine process trains, and no
engine process is ever started.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
from test_e2e import (
    ROOT,
    assert_same_on_policy_training,
    descendants,
    grpo_config,
    grpo_outcome,
)

from trinity.config.checks import check_config
from trinity.config.schema import TrinityConfig
from trinity.explorer.in_process import InThread


class _Recorder:
    """Records (method, argument, thread) of every call; `slow` sleeps, `fail` raises."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.log.append(("built", None, threading.get_ident()))

    def slow(self, x: int, seconds: float) -> int:
        time.sleep(seconds)
        self.log.append(("slow", x, threading.get_ident()))
        return x * 10

    def fail(self) -> None:
        raise ValueError("engine said no")


def test_calls_run_one_at_a_time_in_order_on_the_engines_thread():
    log: list = []
    engine = InThread(lambda: _Recorder(log))

    async def main() -> list[int]:
        # made in order 0, 1, 2; the first is the slowest: a pool of threads would finish it last
        return await asyncio.gather(*(engine.slow.remote(i, 0.05 * (3 - i)) for i in range(3)))

    assert asyncio.run(main()) == [0, 10, 20]
    assert [(what, x) for what, x, _ in log] == [
        ("built", None),
        ("slow", 0),
        ("slow", 1),
        ("slow", 2),
    ]
    threads = {t for *_, t in log}
    assert len(threads) == 1 and threads != {threading.get_ident()}
    engine.close()


def test_an_engines_exception_reaches_the_caller_and_the_engine_goes_on():
    engine = InThread(lambda: _Recorder([]))

    async def main() -> int:
        with pytest.raises(ValueError, match="engine said no"):
            await engine.fail.remote()
        return await engine.slow.remote(4, 0)

    assert asyncio.run(main()) == 40
    engine.close()


def test_a_failed_build_fails_every_call_with_its_error():
    def broken() -> None:
        raise FileNotFoundError("no model at /nowhere")

    engine = InThread(broken)

    async def main() -> None:
        with pytest.raises(FileNotFoundError, match="/nowhere"):
            await engine.slow.remote(1, 0)

    asyncio.run(main())
    engine.close()


def test_the_event_loop_runs_while_the_engine_works():
    engine = InThread(lambda: _Recorder([]))

    async def main() -> tuple[int, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        result = await engine.slow.remote(1, 0.3)
        ticker.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result == 10 and ticks >= 10  # the loop ticked through the engine's 0.3 s call
    engine.close()


def test_closing_lets_the_engine_go():
    engine = InThread(lambda: _Recorder([]))

    async def main() -> None:
        await engine.slow.remote(1, 0)
        engine.close()
        with pytest.raises(RuntimeError, match="cannot schedule new futures"):
            await engine.slow.remote(2, 0)

    asyncio.run(main())


def _cfg(**rollout: object) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "model": {"model_path": "m"},
            "buffer": {
                "total_steps": 1,
                "explorer_input": {"taskset": {"path": "t", "storage_type": "file"}},
            },
            "explorer": {"rollout_model": rollout},
        }
    )


def test_what_is_not_built_is_refused_by_the_checks():
    assert not [p for p in check_config(_cfg(in_explorer_process=True)) if "in_explorer" in p.path]
    cfg = _cfg(in_explorer_process=True)
    cfg.synchronizer.sync_method = "nccl"
    (p,) = [p for p in check_config(cfg) if "in_explorer" in p.path]
    assert p.path == "explorer.rollout_model.in_explorer_process" and "nccl" in p.message
    cfg = _cfg()
    cfg.explorer.auxiliary_models = [
        type(cfg.explorer.rollout_model)(model_path="judge", in_explorer_process=True)
    ]
    (p,) = [p for p in check_config(cfg) if "in_explorer" in p.path]
    assert p.path == "explorer.auxiliary_models[0].in_explorer_process"


def test_max_restarts_with_engines_in_the_explorer_is_said_not_to_apply():
    from trinity.config.support import not_applicable_notes

    said = "explorer.rollout_model.max_restarts: not applicable here"
    assert not [n for n in not_applicable_notes(_cfg(in_explorer_process=True)) if said in n]
    assert not [n for n in not_applicable_notes(_cfg(max_restarts=5)) if said in n]
    (note,) = [
        n for n in not_applicable_notes(_cfg(in_explorer_process=True, max_restarts=5)) if said in n
    ]
    assert "in_explorer_process" in note


def _run(cfg, sets: list[str], cache) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`trinity run`, watching its process tree: (the result, every process title seen)."""
    env = {**os.environ, "TRINITY_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "trinity.cli", "run", "--config", str(cfg)]
    cmd += [a for s in sets for a in ("--set", s)]
    seen: set[str] = set()
    with subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as p:
        reader = threading.Thread(target=lambda: setattr(p, "out", p.stdout.read()))
        reader.start()
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline:
            seen |= {args.split()[0] for args in descendants(p.pid).values() if args}
            time.sleep(0.2)
        if p.poll() is None:
            p.kill()
        p.wait()
        reader.join()
    return subprocess.CompletedProcess(cmd, p.returncode, p.out, ""), seen


def memory_sync_runs(
    tmp_path, model_dir, variants: dict[str, list[str]]
) -> tuple[dict[str, dict], dict[str, set[str]]]:
    """The same on-policy `grpo_config` run (weights by `memory`, one thread each for the trainer
    and the engines) once per variant's `--set`s: ({variant: `grpo_outcome`}, {variant: every
    process title seen})."""
    pinned = ["trainer.num_threads=1", "explorer.rollout_model.num_threads=1"]
    runs, titles = {}, {}
    for name, sets in variants.items():
        d = tmp_path / name
        d.mkdir()
        cfg = grpo_config(d, model_dir, extra="synchronizer: {sync_method: memory}\n")
        r, titles[name] = _run(cfg, [*pinned, *sets], d / "cache")
        assert r.returncode == 0, r.stdout[-4000:]
        runs[name] = grpo_outcome(d / "ckpt" / "e2e" / "grpo")
    return runs, titles


@pytest.mark.long  # two whole runs (about 50 s on 2 cores)
def test_an_engine_in_the_explorers_process_trains_what_an_engine_process_trains(
    tmp_path, tiny_model_dir
):
    """The same on-policy run (evaluation at step 2 of 3, weights by `memory`), the engine in a
    process of its own and then in the explorer's: the same rollouts, losses, evaluation and
    final weights, bit for bit; the second run never starts an engine process."""
    runs, titles = memory_sync_runs(
        tmp_path,
        tiny_model_dir,
        {
            "own_process": ["explorer.rollout_model.in_explorer_process=false"],
            "in_explorer": ["explorer.rollout_model.in_explorer_process=true"],
        },
    )
    assert_same_on_policy_training(runs["own_process"], runs["in_explorer"])
    assert any("RolloutEngine" in t for t in titles["own_process"])  # the watch sees them
    assert not any("RolloutEngine" in t for t in titles["in_explorer"]), titles["in_explorer"]
