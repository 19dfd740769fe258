"""The experience pipeline (`trinity.data`): Trinity-RFT's operators against hand-derived values,
and what a step does with what a filter drops (refill, untrained samples in groups of their
own, completion when the refills run out)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_e2e import grpo_config, run_trinity
from test_one_process import _cfg

from trinity.algorithm.advantage import grpo_scores
from trinity.common.experience import EID, Experience
from trinity.config.preflight import preflight
from trinity.data.operators import EXPERIENCE_OPERATORS, build_operator
from trinity.data.pipeline import ExperiencePipeline, StepGroups
from trinity.trainer.batch import collate


def exp(task: int, run: int, reward: float | None, **info: float) -> Experience:
    return Experience(
        tokens=torch.tensor([1, 2, 3, 4]),
        prompt_length=2,
        reward=reward,
        eid=EID(batch=1, task=task, run=run, suffix="step"),
        info=dict(info),
    )


def group(task: int, *rewards: float | None) -> list[Experience]:
    return [exp(task, run, r) for run, r in enumerate(rewards)]


def run(name: str, exps: list[Experience], **args):
    return build_operator(name, args).process(exps)


# -- operators ---------------------------------------------------------------------------------


def test_reward_filter_keeps_rewards_at_or_above_the_threshold():
    exps = group(0, 0.0, 0.5, 1.0, None, math.nan)
    kept, m = run("reward_filter", exps, threshold=0.5)
    assert [e.reward for e in kept] == [0.5, 1.0] and m == {"filtered_count": 3.0}
    kept, _ = run("reward_filter", exps)  # Trinity-RFT's default threshold 0.0
    assert [e.reward for e in kept] == [0.0, 0.5, 1.0]


def test_reward_std_filter_keeps_groups_whose_rewards_spread_more_than_the_threshold():
    # population std: [0, 1] -> 0.5; [0, 0, 0, 1] -> sqrt(3/16) = 0.433; [1, 1] -> 0; a single
    # sample has none; a missing reward leaves the std undefined
    groups = [group(0, 0, 1), group(1, 0, 0, 0, 1), group(2, 1, 1), group(3, 1), group(4, 0, None)]
    exps = [e for g in groups for e in g]
    kept, m = run("reward_std_filter", exps)
    assert sorted({e.eid.task for e in kept}) == [0, 1] and m["filtered_count"] == 5
    kept, _ = run("reward_std_filter", exps, threshold=0.45)
    assert {e.eid.task for e in kept} == {0}  # 0.433 <= 0.45 < 0.5


def test_invalid_reward_filter_drops_missing_and_nan_rewards():
    kept, m = run("invalid_reward_filter", group(0, 1.0, None, math.nan, -2.0))
    assert [e.reward for e in kept] == [1.0, -2.0] and m == {"filtered_count": 2.0}


def test_reward_shaping_mapper_applies_each_rule_in_order():
    a = exp(0, 0, 1.0, quality=0.5, length=3.0)
    b = exp(0, 1, 2.0)  # no statistics: unchanged
    c = exp(0, 2, None, quality=1.0)  # no reward: unchanged
    d = exp(0, 3, 4.0, quality=0.0)
    rules = [
        {"stats_key": "quality", "op_type": "ADD", "weight": 2.0},  # a: 1 + 2·0.5 = 2
        {"stats_key": "length", "op_type": "MUL", "weight": 1.0},  # a: 2 · 3 = 6
        {"stats_key": "quality", "op_type": "DIV", "weight": 1.0},  # a: 6 / 0.5 = 12; d: /0 kept
        {"stats_key": "quality", "op_type": "SUB", "weight": 4.0},  # a: 12 - 2 = 10; d: 4 - 0
    ]
    kept, m = run("reward_shaping_mapper", [a, b, c, d], reward_shaping_configs=rules)
    assert [e.reward for e in kept] == [10.0, 2.0, None, 4.0]
    assert m == {"reward_diff/mean": 9 / 4, "reward_diff/min": 0.0, "reward_diff/max": 9.0}
    with pytest.raises(ValueError, match="op_type 'POW' is not one of ADD, SUB, MUL, DIV"):
        build_operator("reward_shaping_mapper", {"reward_shaping_configs": [{"op_type": "POW"}]})
    with pytest.raises(ValueError, match=r"unknown keys \['scale'\]"):
        build_operator("reward_shaping_mapper", {"reward_shaping_configs": [{"scale": 2}]})


def test_pass_rate_calculator_reports_how_the_steps_tasks_spread():
    groups = [group(0, 1, 0, 1, 1), group(1, 0, 0), group(2, 1, 1), group(3, 1, 0)]
    exps = [e for g in groups for e in g]
    kept, m = run("pass_rate_calculator", exps)
    assert kept == exps
    assert [g[0].info["pass_rate"] for g in groups] == [0.75, 0.0, 1.0, 0.5]
    assert m == {
        "selection/valid_ratio": 0.5,  # 0.75, 0.5
        "selection/strict_valid_ratio": 0.5,
        "selection/<1_ratio": 0.75,
        "selection/>0_ratio": 0.75,
        "selection/<15_16_ratio": 0.75,
        "selection/>1_16_ratio": 0.75,
    }


def test_every_trinity_rft_operator_name_is_built():
    names = {"reward_filter", "reward_std_filter", "invalid_reward_filter",
             "reward_shaping_mapper", "pass_rate_calculator", "data_juicer"}  # fmt: skip
    assert names <= set(EXPERIENCE_OPERATORS.names())


# -- the pipeline and the step ------------------------------------------------------------------


def test_the_pipeline_reports_each_operators_drops_and_time():
    pipeline = ExperiencePipeline(
        [("invalid_reward_filter", {}), ("reward_filter", {"threshold": 1})]
    )
    kept, m = pipeline.run(group(0, 1.0, None, 0.0, 2.0))
    assert [e.reward for e in kept] == [1.0, 2.0]
    assert m["experience_pipeline/0_invalid_reward_filter/dropped"] == 1.0
    assert m["experience_pipeline/1_reward_filter/dropped"] == 1.0
    assert m["experience_pipeline/filtered_count"] == 1.0  # the last operator's own
    assert {"time/experience_pipeline/0_invalid_reward_filter",
            "time/experience_pipeline/1_reward_filter"} <= set(m)  # fmt: skip


def test_a_step_keeps_its_size_untraining_what_the_filters_drop():
    """reward_filter(1): task 0 keeps its rewarded sample and its other stays untrained in a
    group of its own; task 1 loses both: a refill replaces it (task 2, kept), and when the
    refills run out a dropped task completes the step untrained."""
    steps = StepGroups(ExperiencePipeline([("reward_filter", {"threshold": 1.0})]), False)
    kept = steps.keep([(0, group(0, 1.0, 0.0)), (1, group(1, 0.0, 0.0))])
    assert [i for i, _ in kept] == [0]
    (_, task0), = kept  # fmt: skip
    assert task0[1].info["own_group"] and task0[1].info["excluded"]
    assert not task0[1].action_mask.any() and task0[0].action_mask.all()
    kept += steps.keep([(2, group(2, 1.0, 1.0))], refill=True)
    done = steps.complete(kept, target=3)
    assert [i for i, _ in done] == [0, 2, 1]
    assert all(e.info["excluded"] and not e.action_mask.any() for e in done[2][1])
    m = steps.metrics()
    assert m["experience_pipeline/refill_tasks"] == 1.0
    assert m["experience_pipeline/kept_untrained"] == 1.0
    assert m["experience_pipeline/unfilled_tasks"] == 1.0
    assert m["experience_pipeline/0_reward_filter/dropped"] == 3.0  # 1 + 2, summed over refills
    assert steps.unused() == []


def test_an_untrained_sample_in_its_own_group_leaves_the_kept_samples_advantages_as_without_it():
    """The explorer writes a filtered sample of a kept task with an id of its own group: GRPO's
    statistics of the task are those of the samples the filter kept, as Trinity-RFT's (which
    removes the sample)."""
    kept = [exp(0, r, v) for r, v in enumerate([1.0, 0.5, 0.0])]
    alone = exp(0, 3, -5.0)
    alone.eid = EID(batch=1, task=0, run=3, suffix="step/filtered3")
    batch = collate([*kept, alone], pad_id=0)
    with_it = grpo_scores(batch.rewards, batch.group_ids)[:3]
    without = grpo_scores(collate(kept, pad_id=0).rewards, collate(kept, pad_id=0).group_ids)
    assert torch.equal(with_it, without)


# -- configuration --------------------------------------------------------------------------------


def _pipeline_cfg(*operators: dict):
    return _cfg(data_processor={"experience_pipeline": {"operators": list(operators)}})


def test_preflight_checks_operator_names_and_arguments(tmp_path):
    ok = preflight(_pipeline_cfg({"name": "reward_std_filter", "args": {"threshold": 0.1}}))
    assert not [p for p in ok.problems if "experience_pipeline" in p.path], ok.problems
    bad = preflight(
        _pipeline_cfg(
            {"name": "data_juicer", "args": {}},
            {"name": "reward_filtr"},
            {"name": "reward_filter", "args": {"treshold": 1}},
            {
                "name": "reward_shaping_mapper",
                "args": {"reward_shaping_configs": [{"stats_key": "q", "op_type": "POW"}]},
            },
        )
    )
    said = {p.path: str(p) for p in bad.problems if "experience_pipeline" in p.path}
    at = "data_processor.experience_pipeline.operators"
    assert "config_path is required" in said[f"{at}[0].args"]
    assert "reward_filter" in said[f"{at}[1].name"]  # valid names listed
    assert "threshold" in said[f"{at}[2].args.treshold"]
    assert "op_type 'POW'" in said[f"{at}[3].args"]


@pytest.mark.slow  # a whole run (about 20 s on 2 cores)
def test_a_run_with_filters_trains_full_steps_and_reports_the_pipeline(tmp_path, tiny_model_dir):
    extra = (
        "data_processor:\n  experience_pipeline:\n    max_num_gen_batches: 2\n    operators:\n"
        "      - {name: pass_rate_calculator}\n"
        "      - {name: invalid_reward_filter}\n"
        "      - {name: reward_std_filter}\n"
    )
    r = run_trinity(grpo_config(tmp_path, tiny_model_dir, extra=extra))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    recs = [
        json.loads(x) for x in (tmp_path / "ckpt/e2e/grpo/metrics.jsonl").read_text().splitlines()
    ]
    steps = [x for x in recs if "experience_pipeline/refill_tasks" in x]
    assert len(steps) == 3
    for x in steps:
        assert x["rollout/tasks"] == 4  # every step its full size
        assert "time/experience_pipeline/2_reward_std_filter" in x
        assert 0 <= x["experience_pipeline/selection/valid_ratio"] <= 1
        # every task the std filter dropped was replaced: by a refill, or untrained at the end
        dropped = x["experience_pipeline/2_reward_std_filter/dropped"] / 4  # 4 samples a task
        refilled = x["experience_pipeline/refill_tasks"]
        assert dropped == refilled + x["experience_pipeline/unfilled_tasks"]
        assert refilled <= 4  # max_num_gen_batches 2: at most 8 tasks tried
