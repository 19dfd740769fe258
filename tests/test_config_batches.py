"""Batch arithmetic (issue 18, finding 2): every combination of batch sizes either runs exactly or
is refused by validate with the reason and the numbers.

The expected verdict comes from a step-by-step simulation of the experience queue (a loop oracle
independent of the rule in `checks._batches_run_exactly`): explore steps write `batch_size`
groups of `g` experiences, the trainer reads `train_batch_size` of them per step.
"""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from trinity.config import ConfigError, resolve, validate_config

BATCH_SIZES = (1, 2, 3)
REPEATS = (1, 2, 4)
TRAIN_BATCHES = (0, 1, 2, 3, 4, 6, 8, 12)
SETUPS = (  # (mode, sync_style)
    ("both", "fixed"),
    ("both", "trainer_driven"),
    ("both", "explorer_driven"),
    ("train", "fixed"),  # reading a queue that mode explore processes fill
)
ALGORITHMS = ("grpo", "dapo", "ppo")  # two that normalise per group, one per sample (GAE)


def simulate(tasks: int, g: int, train: int, fixed: bool, groups: bool, steps: int = 24) -> bool:
    """True when `steps` explore/train steps run exactly: the fixed schedule finds exactly one
    train batch in each explore step (no wait, nothing left behind), and (for group algorithms)
    no train batch holds part of a task's samples."""
    train = train or tasks * g
    queue: deque[int] = deque()  # group id of each experience waiting in the buffer
    trained: set[int] = set()  # groups (partly) trained already
    group = 0
    for _ in range(steps):
        for _ in range(tasks):  # one explore step: `tasks` groups of g samples
            queue.extend([group] * g)
            group += 1
        if fixed and len(queue) != train:
            return False  # the trainer would wait (fewer) or leave experiences behind (more)
        while len(queue) >= train:
            batch = [queue.popleft() for _ in range(train)]
            # a group is split when it goes on in the queue or began in an earlier batch
            split = (bool(queue) and queue[0] == batch[-1]) or batch[0] in trained
            trained.update(batch)
            if groups and split:
                return False
            if fixed:
                break
    return True


def config(mode: str, style: str, algo: str, tasks: int, g: int, train: int) -> dict:
    buffer: dict = {"batch_size": tasks, "train_batch_size": train}
    if mode == "both":
        buffer["explorer_input"] = {"taskset": {"path": "t"}}
    else:
        buffer["trainer_input"] = {"experience_buffer": {"storage_type": "queue"}}
        buffer["total_steps"] = 10
    return {
        "mode": mode,
        "model": {"model_path": "m", "max_response_tokens": 64},  # DAPO's overlong penalty
        "algorithm": {"algorithm_type": algo, "repeat_times": g},
        "buffer": buffer,
        "synchronizer": {"sync_style": style},
    }


CASES = list(itertools.product(SETUPS, ALGORITHMS, BATCH_SIZES, REPEATS, TRAIN_BATCHES))


@pytest.mark.parametrize(("setup", "algo", "tasks", "g", "train"), CASES)
def test_every_combination_runs_exactly_or_is_refused(setup, algo, tasks, g, train) -> None:
    mode, style = setup
    fixed = mode == "both" and style == "fixed"
    exact = simulate(tasks, g, train, fixed, groups=algo != "ppo")
    try:
        cfg = validate_config(config(mode, style, algo, tasks, g, train))
    except ConfigError as e:
        assert not exact, f"refused, but it runs exactly: {e}"
        [problem] = e.problems
        assert problem.path == "buffer.train_batch_size"
        assert str(train or tasks * g) in problem.message  # the numbers are named
        return
    assert exact, "accepted, but the simulation stalls, leaves experiences or splits a group"
    if mode == "both":  # derived or written, a train step takes whole explore steps' groups
        assert resolve(cfg).train_batch_size == (train or tasks * g)


def test_fixed_schedule_message_says_why() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(config("both", "fixed", "grpo", 2, 4, 12))
    message = info.value.problems[0].message
    # 2 tasks × 4 samples = 8 per explore step; 12 > 8 would wait for the next sync
    assert "2 × 4 = 8" in message and "wait" in message
    with pytest.raises(ConfigError) as info:
        validate_config(config("both", "fixed", "grpo", 2, 4, 6))
    assert "2 experiences of every explore step would be left behind" in str(info.value)


def test_group_split_message_and_stages() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(config("train", "fixed", "grpo", 2, 4, 6))
    assert "not a multiple of the 4 samples per task" in str(info.value)
    # a staged config is checked per stage: the SFT stage's 6 rows per step are fine, the GRPO
    # stage inherits train_batch_size 6 and 4 samples per task from the base and is refused
    data = config("both", "fixed", "grpo", 2, 4, 0)
    data["stages"] = [
        {"stage_name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
        {"stage_name": "rl", "buffer": {"train_batch_size": 6}},
    ]
    data["buffer"]["trainer_input"] = {"experience_buffer": {"path": "d.jsonl"}}
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert [p.path for p in info.value.problems] == ["stages[1].buffer.train_batch_size"]


def test_tasksets_with_different_group_sizes_under_the_fixed_schedule() -> None:
    data = config("both", "fixed", "grpo", 2, 4, 0)
    data["buffer"]["explorer_input"] = {
        "tasksets": [{"path": "a"}, {"path": "b", "repeat_times": 2}]
    }
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert "different samples per task ([4, 2])" in str(info.value)
    data["synchronizer"]["sync_style"] = "trainer_driven"  # 8 per step: a multiple of 4 and 2
    validate_config(data)


def test_mix_chord_counts_its_expert_rows_in_train_batch_size_as_trinity_rft_does():
    """Trinity-RFT's mix_chord example: train_batch_size 320 = 256 rollouts (32 tasks × 8
    samples) + ceil(0.2 × 320) = 64 expert rows; it validates (no stall) and says so."""
    from test_e2e import ROOT

    from trinity.config import load_config
    from trinity.config.resolved import format_batch_table

    cfg = load_config(ROOT / "tests/data/trinity_configs/mix_chord.yaml")
    r = resolve(cfg)
    assert (r.train_batch_size, r.expert_rows) == (256, 64)
    assert cfg.algorithm.policy_loss_fn_args["sft_loss_agg_mode"] == "token-mean"
    table = format_batch_table(r)
    assert (
        "expert rows per train step" in table and "ceil(0.2 × buffer.train_batch_size 320)" in table
    )
    derived = resolve(
        cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"train_batch_size": 0})})
    )
    assert (derived.train_batch_size, derived.expert_rows) == (256, 64)  # ceil(0.25 × 256)
    with pytest.raises(ConfigError, match="256 experiences per train step"):
        load_config(ROOT / "tests/data/trinity_configs/mix_chord.yaml", ["buffer.batch_size=40"])
