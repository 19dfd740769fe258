"""`explorer.rollout_model.tensor_parallel_size` in the config: what a tensor-parallel engine
cannot run with is refused by name, a size that does not divide the model's heads is refused
with the numbers, and the plan and the resources say how many ranks an engine runs over."""

from __future__ import annotations

import json

import pytest

from trinity.common.resources import plan_resources
from trinity.config import ConfigError, resolve, validate_config
from trinity.config.preflight import preflight
from trinity.config.resolved import format_batch_table
from trinity.config.support import not_built_problems
from trinity.models.shapes import divisibility_problem

KEY = "explorer.rollout_model.tensor_parallel_size"


def config(tp: int = 2, model: str = "tiny://1m?seed=0", **sections) -> dict:
    base = {
        "model": {"model_path": model},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {
            "batch_size": 4,
            "explorer_input": {
                "taskset": {
                    "storage_type": "synthetic",
                    "path": "arithmetic",
                    "generator_args": {"digits": 1, "num_tasks": 20},
                    "format": {"prompt_key": "question", "response_key": "answer"},
                }
            },
        },
        "explorer": {"rollout_model": {"tensor_parallel_size": tp}},
    }
    return base | sections


def test_tensor_parallel_is_built_and_shown_in_the_plan() -> None:
    cfg = validate_config(config())
    assert not [p for p in not_built_problems(cfg) if "tensor_parallel" in p.path]
    table = format_batch_table(resolve(cfg))
    assert "ranks per rollout engine" in table and KEY in table
    assert "ranks per rollout engine" not in format_batch_table(resolve(validate_config(config(1))))


@pytest.mark.parametrize(
    ("rollout", "sections", "path", "words"),
    [
        ({"in_explorer_process": True}, {}, KEY, "threads of the explorer"),
        ({}, {"cluster": {"one_process": True}}, "cluster.one_process", "processes of their own"),
        ({}, {"synchronizer": {"sync_method": "shared"}}, "synchronizer.sync_method", "slices"),
    ],
)
def test_what_a_tensor_parallel_engine_cannot_run_with_is_refused(
    rollout, sections, path, words
) -> None:
    cfg = config(**sections)
    cfg["explorer"]["rollout_model"] |= rollout
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    found = {p.path: p.message for p in info.value.problems}
    assert path in found and words in found[path], found


def test_vllm_tensor_parallelism_loads_and_is_refused_before_the_run_as_not_built() -> None:
    cfg = config()
    cfg["explorer"]["rollout_model"] |= {"engine_type": "vllm"}
    loaded = validate_config(cfg)  # Trinity-RFT's configs load (tests/data/trinity_configs)
    problems = {p.path: p.message for p in preflight(loaded).problems}
    assert "not built for engine_type vllm" in problems[KEY]


def test_heads_a_size_does_not_divide_are_refused_with_the_numbers(tmp_path) -> None:
    # the 10m preset: 5 attention heads, 1 KV head, intermediate 1024
    problems = {
        p.path: p.message for p in preflight(validate_config(config(2, "tiny://10m"))).problems
    }
    assert problems[KEY] == (
        "tensor_parallel_size=2 must divide the model's attention heads, KV heads and MLP "
        "intermediate size: attention heads (num_attention_heads) 5, KV heads "
        "(num_key_value_heads) 1 are not divisible by 2 (model tiny://10m)"
    )
    # a model folder's config.json; an auxiliary model's pool is checked with its own model
    folder = tmp_path / "judge"
    folder.mkdir()
    shape = {"num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 30}
    (folder / "config.json").write_text(json.dumps(shape))
    cfg = config(1)
    cfg["explorer"]["auxiliary_models"] = [{"model_path": str(folder), "tensor_parallel_size": 4}]
    problems = {p.path: p.message for p in preflight(validate_config(cfg)).problems}
    assert (
        "intermediate_size) 30 is not divisible by 4"
        in problems["explorer.auxiliary_models[0].tensor_parallel_size"]
    )
    assert KEY not in {p.path for p in preflight(validate_config(config(2))).problems}  # 1m: 4, 2


def test_divisibility_reads_a_transformers_config_too() -> None:
    from trinity.models.tiny import preset_config

    assert divisibility_problem(preset_config("1m"), 2) is None  # 4 heads, 2 KV, 448 inner
    assert "KV heads (num_key_value_heads) 2" in divisibility_problem(preset_config("1m"), 4)


def test_engine_ranks_take_a_gpu_each_and_share_an_engine_s_cores() -> None:
    # 5 GPUs: the trainer and 2 engines × 2 ranks each get a whole one (Trinity-RFT's rule)
    plan = plan_resources(8, 5, True, 2, False, engine_ranks=4, tensor_parallel=2)
    assert (plan.trainer.num_gpus, plan.engine.num_gpus) == (1.0, 1.0)  # the engine's: per rank
    # CPUs: an engine's share is an engine's whatever its ranks (its ranks divide it)
    assert plan.engine.num_cpus == plan_resources(8, 0, True, 2, False).engine.num_cpus == 2.0
    assert plan.describe() == (
        "resources: trainer 4 CPU, 1 GPU (4 threads); each engine 2 CPU, 2 GPU (2 threads) over "
        "2 tensor-parallel ranks"
    )
    with pytest.raises(ValueError, match=r"tensor_parallel_size: each rank .* need 5 GPUs, and 4"):
        plan_resources(8, 4, True, 2, False, engine_ranks=4, tensor_parallel=2)
