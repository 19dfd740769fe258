"""Reward fns that cannot freeze training (trinity/rewards/guard.py, limits.py): a call that hangs,
raises or returns NaN fails its task's try within the timeout, is never a reward of 0, and the
explorer drops and counts the task with its id; the step's reward-time percentiles."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reward_fixtures import FOREVER_S
from trinity.common.rollout import Sample
from trinity.config import ConfigError, TrinityConfig, load_config
from trinity.config.preflight import preflight
from trinity.explorer import explorer as explorer_module
from trinity.explorer.evaluation import evaluation_report
from trinity.explorer.explorer import Explorer
from trinity.explorer.ledger import LedgerStats
from trinity.rewards.guard import (
    RewardFailed,
    RewardLog,
    quantile,
    reward_log,
    score_responses,
)
from trinity.rewards.limits import RewardLimits, limit_problems, split_reward_args
from trinity.tasks import Task

FIX = "tests.reward_fixtures."


def task(index: int = 3, reply: str = "4", truth: str = "4", **limits: Any) -> Task:
    return Task(
        index=index,
        raw={"question": reply, "answer": truth},
        prompt=reply,
        truth=truth,
        taskset_name="probe",
        reward_fn_type=FIX + "by_reply",
        reward_limits=RewardLimits(**limits),
    )


def score(t: Task, name: str, responses: list[str]) -> tuple[Any, RewardLog, float]:
    """(components or the RewardFailed raised, the calls' log, seconds taken)."""

    async def go() -> Any:
        try:
            return await score_responses(t, name, responses)
        except RewardFailed as e:
            return e

    t0 = time.perf_counter()
    with reward_log() as log:
        out = asyncio.run(go())
    return out, log, time.perf_counter() - t0


# --- failures in the explorer's process ------------------------------------------------------


@pytest.mark.parametrize("name", ["sleep_forever", "sleep_forever_async"])
def test_a_reward_that_sleeps_forever_times_out_within_its_timeout(name):
    out, log, took = score(task(timeout=0.3), FIX + name, ["4"])
    assert isinstance(out, RewardFailed) and out.kind == "timeout"
    assert out.task_id == "probe#3" and "timeout=0.3s" in str(out)
    assert 0.3 <= took < 0.3 + 2.0  # the timeout, plus a loaded machine's slack
    assert log.failures == [("timeout", "probe#3")]
    assert len(log.seconds) == 1 and log.seconds[0] >= 0.3


@pytest.mark.parametrize(
    ("name", "kind", "said"),
    [
        ("raises", "error", "ValueError: the reward code broke"),
        ("returns_nan", "nan", "format=nan"),
    ],
)
def test_a_reward_that_raises_or_returns_nan_fails_not_zero(name, kind, said):
    out, log, _ = score(task(index=7), FIX + name, ["4", "4"])
    assert isinstance(out, RewardFailed), out  # never a score (of 0 or anything else)
    assert (out.kind, out.task_id) == (kind, "probe#7") and said in str(out)
    assert log.failures == [(kind, "probe#7")]  # the try stops at its first failed call


def test_non_numeric_and_empty_results_are_errors():
    out, *_ = score(task(), FIX + "by_reply", ["4"])
    assert out == [{"accuracy": 1.0}]  # the control: a good call scores
    from trinity.rewards.guard import _checked

    assert _checked({"accuracy": "yes"})[0] == "error"
    assert _checked({})[0] == "error"
    assert _checked(0.5)[0] == "error"
    assert _checked({"accuracy": math.inf})[0] == "nan"


def test_a_hung_call_holds_no_shared_thread():
    """Four hung calls (more than a 2-core machine's default executor would hold for long) and
    then a good one: each timed-out call holds only its own thread."""

    async def go() -> list[Any]:
        hung = task(timeout=0.2)
        for _ in range(4):
            with pytest.raises(RewardFailed):
                await score_responses(hung, FIX + "sleep_forever", ["4"])
        ok = await asyncio.to_thread(lambda: "the default executor still runs")
        return [ok, await score_responses(task(timeout=5), FIX + "by_reply", ["4"])]

    assert asyncio.run(go()) == ["the default executor still runs", [{"accuracy": 1.0}]]


# --- the percentiles -------------------------------------------------------------------------


def test_reward_time_percentiles_by_hand():
    log = RewardLog()
    for s in [0.7, 0.1, 1.0, 0.3, 0.5, 0.2, 0.9, 0.4, 0.6, 0.8]:  # 0.1 .. 1.0, shuffled
        log.record(s)
    log.record(0.05, "timeout", "a#1")
    log.record(0.05, "nan", "a#2")
    log.record(0.05, "nan", "a#2")
    m = log.metrics("rollout/")
    # 13 values sorted: 0.05 x3, 0.1 .. 1.0. p50: position 0.5 * 12 = 6 -> the 7th value, 0.4.
    assert m["rollout/reward_time_p50"] == pytest.approx(0.4)
    # p99: position 0.99 * 12 = 11.88 -> 0.9 + 0.88 * (1.0 - 0.9) = 0.988
    assert m["rollout/reward_time_p99"] == pytest.approx(0.988)
    assert (m["rollout/reward_calls"], m["rollout/reward_timeouts"]) == (13.0, 1.0)
    assert (m["rollout/reward_errors"], m["rollout/reward_nans"]) == (0.0, 2.0)
    assert m["rollout/reward_failed_tasks"] == {"timeout": ["a#1"], "nan": ["a#2"]}
    assert log.summary() == "reward fn failures: 1 timeout (tasks a#1); 2 nans (tasks a#2)"
    # ten values 0.1 .. 1.0: p50 at position 4.5 = 0.55, p99 at 8.91 = 0.9 + 0.91 * 0.1 = 0.991
    ten = [0.1 * i for i in range(1, 11)]
    assert quantile(ten, 0.5) == pytest.approx(0.55)
    assert quantile(ten, 0.99) == pytest.approx(0.991)
    assert quantile([2.0], 0.99) == 2.0
    assert RewardLog().metrics("rollout/") == {}  # no calls, no metrics


# --- the explorer's drop-and-count policy ----------------------------------------------------


class EchoHandle:
    """Stands in for `TaskModelHandle`: every sample's response is the task's prompt."""

    def __init__(self, client: Any, tokenizer: Any, params: Any, *args: Any, **kw: Any) -> None:
        self.n, self.truncated_prompts = params.n, []
        self.texts: dict[int, str] = {}

    async def chat(self, messages: list[dict], tools: Any = None) -> list[Sample]:
        text = messages[-1]["content"]
        self.texts[len(self.texts) + 1] = text
        ids = [len(self.texts)]
        return [Sample([0], ids, [-0.5], "stop", 0) for _ in range(self.n)]

    def decode(self, ids: list[int]) -> str:
        return self.texts[ids[0]]

    def ledger_stats(self) -> LedgerStats:
        return LedgerStats()


def bare_explorer(monkeypatch: pytest.MonkeyPatch, retries: int) -> Explorer:
    """An Explorer with just what `_run_tasks` reads: its config, a client, one engine."""
    monkeypatch.setattr(explorer_module, "TaskModelHandle", EchoHandle)
    cfg = TrinityConfig()
    cfg.explorer.max_retry_times = retries
    cfg.explorer.max_failure_fraction = 1.0
    cfg.algorithm.repeat_times = 2
    ex = Explorer.__new__(Explorer)
    ex.cfg, ex.client, ex.engines, ex.tokenizer = cfg, object(), [object()], None
    ex.endpoint = ex.sessions = ex.auxiliary = None
    return ex


def test_failed_rewards_drop_their_tasks_which_are_counted_with_their_ids(monkeypatch):
    ex = bare_explorer(monkeypatch, retries=1)
    replies = ["4", "hang", "raise", "nan"]
    tasks = [task(index=i, reply=r, timeout=0.3) for i, r in enumerate(replies)]
    for t in tasks:
        t.workflow_type = "math_workflow"

    async def go() -> Any:
        with reward_log() as log:
            kept, counts = await ex._run_tasks(tasks, ex._train_params, train=False)
        return kept, counts, log

    t0 = time.perf_counter()
    kept, counts, log = asyncio.run(go())
    took = time.perf_counter() - t0
    assert took < FOREVER_S / 100  # two tries of the hanging task, 0.3 s each, not forever
    assert [i for i, _ in kept] == [0]  # the three failed tasks are dropped ...
    assert [e.reward for e in kept[0][1]] == [1.0, 1.0]
    assert (counts["failed_tasks"], counts["retries"]) == (3.0, 3.0)  # ... and counted
    assert log.failed_tasks() == {"timeout": ["probe#1"], "error": ["probe#2"], "nan": ["probe#3"]}
    m = log.metrics("rollout/")
    # task 0: 2 good calls; tasks 1-3: one failed call per try (a try stops there), 2 tries each
    assert m["rollout/reward_calls"] == 2 + 3 * 2
    assert (m["rollout/reward_timeouts"], m["rollout/reward_errors"]) == (2.0, 2.0)
    assert m["rollout/reward_nans"] == 2.0
    # in an evaluation the dropped tasks are in the denominator, as wrong: 2 of 8 slots correct
    metrics, _ = evaluation_report("probe", tasks, [2] * 4, kept, seed=0, detailed=False)
    assert metrics["eval/probe/avg@2"] == pytest.approx(2 / 8)
    assert metrics["eval/probe/failed_tasks"] == 3.0


# --- configuration -----------------------------------------------------------------------------


def test_split_reward_args_takes_the_limits_out():
    args, limits = split_reward_args(
        {"format_score": 0.1, "timeout": 2, "sandbox": "subprocess", "cpu_seconds": 1.5}
    )
    assert args == {"format_score": 0.1}
    assert limits == RewardLimits(timeout=2.0, sandbox="subprocess", cpu_seconds=2)
    with pytest.raises(ValueError, match=r"reward_fn_args\.timeout: must be a number > 0"):
        split_reward_args({"timeout": -1})


@pytest.mark.parametrize(
    ("args", "key", "said"),
    [
        ({"timeout": -1}, "timeout", "must be a number > 0, got -1"),
        ({"timeout": 0}, "timeout", "must be a number > 0"),
        ({"timeout": "10s"}, "timeout", "must be a number > 0"),
        ({"sandbox": "docker"}, "sandbox", "unknown sandbox 'docker'; valid: none, subprocess"),
        ({"cpu_seconds": 5}, "cpu_seconds", "set sandbox: subprocess"),
        ({"sandbox": "subprocess", "memory_mb": 0.5}, "memory_mb", "an integer > 0"),
        ({"sandbox": "subprocess", "sandbox_workers": True}, "sandbox_workers", "an integer"),
    ],
)
def test_bad_limits_are_refused_naming_the_key(args, key, said):
    assert [(k, why) for k, why in limit_problems(args) if said in why] == [
        (key, next(why for k, why in limit_problems(args) if said in why))
    ]


def limits_config(tmp_path: Path, reward_fn_args: str, reward: str = "math_with_format") -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {model_path: 'tiny://1m'}\n"
        "buffer:\n  explorer_input:\n"
        f"    default_reward_fn_type: {reward}\n"
        "    taskset:\n"
        "      {storage_type: synthetic, path: arithmetic, generator_args: {num_tasks: 8},\n"
        "       format: {prompt_key: question, response_key: answer},\n"
        f"       reward_fn_args: {reward_fn_args}}}\n"
    )
    return path


def test_validate_refuses_bad_limits_and_passes_good_ones(tmp_path: Path):
    where = "buffer.explorer_input.taskset.reward_fn_args."
    with pytest.raises(ConfigError) as info:
        load_config(limits_config(tmp_path, "{timeout: -2, sandbox: docker}"))
    bad = {p.path: p.message for p in info.value.problems}
    assert "must be a number > 0, got -2" in bad[where + "timeout"]
    assert "unknown sandbox 'docker'" in bad[where + "sandbox"]
    # good limits beside the fn's own argument: neither is an "unknown argument" of the fn
    good = "{format_score: 0.1, timeout: 5, sandbox: subprocess, cpu_seconds: 5, memory_mb: 512}"
    assert preflight(load_config(limits_config(tmp_path, good))).problems == []
    typo = preflight(load_config(limits_config(tmp_path, "{timeout: 5, format_scor: 0.1}")))
    assert [p.path for p in typo.problems] == [where + "format_scor"]


def test_a_fn_with_an_argument_named_like_a_limit_is_told(tmp_path: Path):
    cfg = load_config(limits_config(tmp_path, "{timeout: 5}", reward=FIX + "own_timeout"))
    (problem,) = preflight(cfg).problems
    assert problem.path == "buffer.explorer_input.taskset.reward_fn_args.timeout"
    assert "argument 'timeout' of its own" in problem.message
