"""The global `seed` reaches every random source unless a section sets its own."""

from __future__ import annotations

from trinity.config import StorageConfig, TrinityConfig, seeds
from trinity.tasks import load_taskset, make_selector


def config(**kw) -> TrinityConfig:
    return TrinityConfig.model_validate({"model": {"model_path": "tiny://1m"}, **kw})


def test_tiny_model_takes_the_global_seed_unless_the_url_names_one():
    assert seeds.model_path(config(seed=7)) == "tiny://1m?seed=7"
    cfg = config(seed=7, model={"model_path": "tiny://5m?seed=3"})
    assert seeds.model_path(cfg) == "tiny://5m?seed=3"
    assert seeds.model_path(config(seed=7, model={"model_path": "/m/q"})) == "/m/q"


def test_engine_replicas_are_seeded_from_the_global_seed_unless_set():
    assert [seeds.engine_seed(config(seed=7), i) for i in range(3)] == [7, 8, 9]
    own = config(seed=7, explorer={"rollout_model": {"seed": 100}})
    assert [seeds.engine_seed(own, i) for i in range(2)] == [100, 101]


def test_selector_uses_the_default_seed_only_when_it_has_none():
    unset = StorageConfig(data_selector={"selector_type": "shuffle"})
    assert make_selector(unset.data_selector, default_seed=5).seed == 5
    own = StorageConfig(data_selector={"selector_type": "shuffle", "seed": 2})
    assert make_selector(own.data_selector, default_seed=5).seed == 2
    # the seed decides the order: the global seed 5 here, the selector's own 2 there
    from_global = make_selector(unset.data_selector, default_seed=5).epoch_order(50, 0)
    from_own = make_selector(own.data_selector, default_seed=5).epoch_order(50, 0)
    assert from_global == make_selector("shuffle", default_seed=5).epoch_order(50, 0)
    assert from_own == make_selector("shuffle", default_seed=2).epoch_order(50, 0)
    assert from_global != from_own


def test_synthetic_generator_draws_with_the_global_seed_unless_generator_args_set_one():
    def questions(generator_args, default_seed):
        storage = StorageConfig(
            storage_type="synthetic",
            path="arithmetic",
            generator_args=generator_args,
            format={"prompt_key": "question", "response_key": "answer"},
        )
        return [t.prompt for t in load_taskset(storage, default_seed=default_seed)]

    args = {"digits": 2, "num_tasks": 20}
    assert questions(args, 1) == questions({**args, "seed": 1}, 99)
    assert questions(args, 1) != questions(args, 2)
