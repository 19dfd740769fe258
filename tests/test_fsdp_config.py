"""`trainer.trainer_strategy: fsdp2` in the config: its ranks resolved once, and the settings a
sharded trainer cannot run with refused by name at validate."""

import pytest

from trinity.config import ConfigError, resolve, validate_config
from trinity.config.resolved import format_batch_table


def config(**sections) -> dict:
    base = {
        "model": {"model_path": "m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 4, "explorer_input": {"taskset": {"path": "t"}}},
    }
    return base | sections


def test_world_size_is_the_key_or_the_gpus_beyond_the_engines() -> None:
    trainer = {"trainer_strategy": "fsdp2", "world_size": 3, "use_dynamic_bsz": False}
    r = resolve(validate_config(config(trainer={**trainer, "micro_batch_size_per_gpu": 2})))
    assert (r.trainer_strategy, r.trainer_world_size) == ("fsdp2", 3)
    # 16 rows over 3 ranks: 6 on the first, 2 per micro-batch -> 3 micro-batches per rank
    assert r.grad_accum_steps == 3
    # Trinity-RFT's rule on GPUs: 2 nodes × 4 GPUs, less 2 engines × TP 2
    cfg = config(
        trainer={"trainer_strategy": "fsdp2"},
        cluster={"node_num": 2, "gpu_per_node": 4, "ray_address": "auto"},
        explorer={"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2}},
    )
    r = resolve(validate_config(cfg))
    assert r.trainer_world_size == 4  # 8 - 2 × 2
    assert "trainer ranks" in format_batch_table(r)
    # verl's FSDP1 name: sharded by FSDP2, said so
    r = resolve(validate_config(config(trainer={"trainer_strategy": "fsdp"})))
    assert r.trainer_strategy == "fsdp2" and "FSDP2" in r.trainer_strategy_source
    assert (r.trainer_world_size, resolve(validate_config(config())).trainer_world_size) == (1, 1)


@pytest.mark.parametrize(
    ("sections", "path", "words"),
    [
        ({"trainer": {"world_size": 2}}, "trainer.world_size", "fsdp2"),
        (
            {"trainer": {"trainer_strategy": "fsdp2"}, "cluster": {"one_process": True}},
            "cluster.one_process",
            "processes of their own",
        ),
        (
            {"trainer": {"trainer_strategy": "fsdp2"}, "synchronizer": {"sync_method": "shared"}},
            "synchronizer.sync_method",
            "holds only shards",
        ),
        (
            {
                "trainer": {"trainer_strategy": "fsdp2"},
                "algorithm": {"algorithm_type": "grpo", "optimizer": {"state_dtype": "bfloat16"}},
            },
            "algorithm.optimizer.state_dtype",
            "stochastic rounding",
        ),
    ],
)
def test_what_a_sharded_trainer_cannot_run_with_is_refused(sections, path, words) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(config(**sections))
    found = {p.path: p.message for p in info.value.problems}
    assert path in found and words in found[path], found
