"""`trainer.ulysses_sequence_parallel_size` in the config: its data-parallel groups resolved
once, and what cannot run refused by name (ranks that do not divide, no sharded trainer,
heads that do not split)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity.config import ConfigError, load_config, resolve, validate_config
from trinity.config.preflight import preflight
from trinity.config.resolved import format_batch_table

ROOT = Path(__file__).resolve().parents[1]
KEY = "trainer.ulysses_sequence_parallel_size"


def config(**trainer) -> dict:
    return {
        "model": {"model_path": "tiny://1m?seed=0"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 4, "explorer_input": {"taskset": {"path": "t"}}},
        "trainer": trainer,
    }


def test_sequence_parallel_groups_split_the_rows() -> None:
    """World 4, 2 ranks per sequence: 2 data-parallel groups; 16 rows give each group 8, in
    micro-batches of 2: 4 per rank; the table says both numbers and their keys."""
    trainer = {"trainer_strategy": "fsdp2", "world_size": 4, "use_dynamic_bsz": False}
    trainer |= {"ulysses_sequence_parallel_size": 2, "micro_batch_size_per_gpu": 2}
    cfg = validate_config(config(**trainer))
    r = resolve(cfg)
    assert (r.trainer_world_size, r.sequence_parallel_size, r.grad_accum_steps) == (4, 2, 4)
    table = format_batch_table(r)
    assert "ranks per sequence" in table and KEY in table
    assert "ceil(ceil(16 / 2 data-parallel groups) / 2)" in table


def test_a_trinity_rft_config_with_sequence_parallelism_loads() -> None:
    """Trinity-RFT's multi-turn agent example sets ulysses_sequence_parallel_size: 2 with no
    trainer_strategy (verl's fsdp there) and no world size: it loads, sharded by FSDP2 over
    one group of 2 ranks, each reason printed."""
    # its vLLM engines' tensor_parallel_size 2 is refused by name (docs/engines.md): one here
    one = ["explorer.rollout_model.tensor_parallel_size=1",
           "explorer.auxiliary_models[0].tensor_parallel_size=1"]  # fmt: skip
    cfg = load_config(ROOT / "tests/data/trinity_configs/agent_multi_turn.yaml", one)
    assert cfg.trainer.ulysses_sequence_parallel_size == 2
    r = resolve(cfg)
    assert (r.trainer_strategy, r.trainer_world_size, r.sequence_parallel_size) == ("fsdp2", 2, 2)
    assert KEY in r.trainer_strategy_source and KEY in r.trainer_world_size_source
    # verl's actor key lands on ours
    verl = config(
        trainer_strategy="fsdp2", world_size=2,
        trainer_config={"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 2}}},
    )  # fmt: skip
    assert resolve(validate_config(verl)).sequence_parallel_size == 2


@pytest.mark.parametrize(
    ("trainer", "words"),
    [
        # 2 ranks per sequence cannot group 3 ranks
        (
            {"trainer_strategy": "fsdp2", "world_size": 3, "ulysses_sequence_parallel_size": 2},
            "2 must divide trainer.world_size 3 (trainer.world_size)",
        ),
        # a one-process trainer has no ranks to split a sequence over
        (
            {"trainer_strategy": "torch", "ulysses_sequence_parallel_size": 2},
            "2 ranks per sequence need a sharded trainer: set trainer.trainer_strategy: fsdp2",
        ),
    ],
)
def test_sequence_parallelism_that_cannot_run_is_refused(trainer, words) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(config(**trainer))
    found = {p.path: p.message for p in info.value.problems}
    assert KEY in found and words in found[KEY], found


def test_ranks_derived_from_the_gpus_must_divide_too() -> None:
    """1 node of 4 GPUs less 1 engine: 3 trainer ranks, which 2 ranks per sequence cannot
    group; the message says where the 3 came from."""
    cfg = config(trainer_strategy="fsdp2", ulysses_sequence_parallel_size=2)
    cfg |= {
        "cluster": {"node_num": 1, "gpu_per_node": 4},
        "explorer": {"rollout_model": {"engine_num": 1}},
    }
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    found = {p.path: p.message for p in info.value.problems}
    assert "must divide trainer.world_size 3 (unset: 4 GPUs" in found[KEY], found


@pytest.mark.parametrize("model", ["tiny", "folder"])
def test_heads_that_do_not_split_are_refused_at_preflight(tmp_path, model) -> None:
    """tiny://10m has 5 attention heads over 1 key/value head; a model folder's config.json
    with 6 over 3: neither splits over 2 ranks, and pre-flight says so with the numbers."""
    path, heads, kv = "tiny://10m?seed=0", 5, 1
    if model == "folder":
        path, heads, kv = str(tmp_path / "m"), 6, 3
        (tmp_path / "m").mkdir()
        config_json = {"num_attention_heads": 6, "num_key_value_heads": 3}
        (tmp_path / "m" / "config.json").write_text(json.dumps(config_json))
    cfg = config(trainer_strategy="fsdp2", world_size=2, ulysses_sequence_parallel_size=2)
    cfg["model"]["model_path"] = path
    found = {p.path: p.message for p in preflight(validate_config(cfg)).problems}
    assert found[KEY] == (
        f"{KEY} 2 must divide the model's attention heads ({heads}) and key/value heads ({kv}): "
        f"each rank attends with heads/2 of them (model.model_path {path})"
    )
    cfg["model"]["model_path"] = "tiny://1m?seed=0"  # 4 heads over 2: splits
    assert KEY not in {p.path for p in preflight(validate_config(cfg)).problems}


def test_an_advantage_reading_token_stats_is_refused_with_sequence_parallelism() -> None:
    """clipb reads the trainer's per-token entropy, which the sequence-parallel pass does not
    compute: pre-flight says so at the key (the trainer would raise at its first step)."""
    raw = config(trainer_strategy="fsdp2", world_size=2, ulysses_sequence_parallel_size=2)
    raw["algorithm"]["advantage_fn"] = "clipb"
    messages = [p.message for p in preflight(validate_config(raw)).problems if p.path == KEY]
    assert any("reads the trainer's token statistics" in m for m in messages), messages
    raw["algorithm"]["advantage_fn"] = "grpo"
    messages = [p.message for p in preflight(validate_config(raw)).problems if p.path == KEY]
    assert not any("token statistics" in m for m in messages)
