"""Tests of the key states (field metadata on the schema, read by trinity/config/support.py)."""

from __future__ import annotations

import re
from pathlib import Path

from trinity.config import TrinityConfig
from trinity.config.base import NotApplicable, NotBuilt, Refused, walk
from trinity.config.support import (
    KEY_STATES,
    not_applicable_notes,
    not_built_markdown,
    not_built_problems,
    schema_paths,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_states_are_field_metadata_read_by_one_walker() -> None:
    by_path = {k.path: k for k in KEY_STATES}
    # declared on the field itself
    assert by_path["model.tinker"].state == "not_built"
    assert by_path["model.tinker"].reason == "the Tinker training backend"
    assert not any(p.startswith("model.external_model") for p in by_path)  # built (bench)
    # a section reused in several places gets its states at each place (Inside)
    assert by_path["buffer.explorer_input.taskset.capacity"].state == "not_applicable"
    assert "buffer.trainer_input.experience_buffer.capacity" not in by_path  # acted there
    assert "buffer.trainer_input.experience_buffer.storage_type" not in by_path  # sql is built
    assert by_path["buffer.explorer_input.taskset.storage_type"].refused == ("queue",)
    # every declared state comes from a marker on the walked schema
    marked = {p for p, _, marks in walk(TrinityConfig) if marks}
    assert marked == set(by_path)
    for _, _, marks in walk(TrinityConfig):
        assert all(isinstance(m, NotBuilt | NotApplicable | Refused) for m in marks)


def test_each_state_says_why() -> None:
    seen = [k.path for k in KEY_STATES]
    assert len(seen) == len(set(seen))
    for k in KEY_STATES:
        assert k.reason.strip() or k.refused, k.path
        assert bool(k.refused) == bool(k.refused_reason), k.path


def test_walk_reaches_list_and_mapping_items() -> None:
    paths = set(schema_paths())
    assert "buffer.explorer_input.tasksets[*].data_selector.seed" in paths
    assert "explorer.auxiliary_models[*].enforce_eager" in paths
    assert "buffer.trainer_input.auxiliary_buffers[*].path" in paths
    assert "data_processor.experience_pipeline.inputs[*].format.prompt_key" in paths


def test_defaults_are_neither_refused_nor_noted() -> None:
    cfg = TrinityConfig()
    assert not_built_problems(cfg) == []
    assert not_applicable_notes(cfg) == []


def test_refusals_name_the_key_and_feature() -> None:
    cfg = TrinityConfig.model_validate(
        {
            "model": {"tinker": {"enable": True}, "logprobs": 0},
            "explorer": {
                "rollout_model": {"tensor_parallel_size": 2, "reasoning_parser": "deepseek_r1"},
                "auxiliary_models": [{"model_path": "judge", "reasoning_parser": "qwen3"}],
            },
            "data_processor": {"experience_pipeline": {"input_save_path": "x.jsonl"}},
            "cluster": {"node_num": 1},
            "monitor": {"monitor_type": ["jsonl", "swanlab"], "detailed_stats": True},  # built
            "trainer": {"trainer_strategy": "fsdp2"},
        }
    )
    probs = {p.path: p.message for p in not_built_problems(cfg)}
    assert set(probs) == {
        "model.tinker",
        "data_processor.experience_pipeline.input_save_path",
    }  # logprobs 0 and node_num 1 are inert; tensor and sequence parallelism, reasoning parsers
    # and external models are built
    assert "Tinker" in probs["model.tinker"]
    assert "pipeline's input" in probs["data_processor.experience_pipeline.input_save_path"]


def test_not_applicable_keys_are_noted_when_set_with_reason() -> None:
    cfg = TrinityConfig.model_validate(
        {
            "explorer": {"rollout_model": {"gpu_memory_utilization": 0.9}},
            "buffer": {
                "explorer_input": {
                    "tasksets": [
                        {"path": "a", "data_selector": {"selector_type": "shuffle"}},
                        {"path": "b", "data_selector": {"selector_type": "random"}},
                    ]
                }
            },
            "trainer": {"trainer_config": {"critic": {"ppo_epochs": 2}}},
        }
    )
    notes = not_applicable_notes(cfg)
    assert not_built_problems(cfg) == []
    joined = "\n".join(notes)
    # set to its default value, still noted: the key has no effect either way
    assert "explorer.rollout_model.gpu_memory_utilization: not applicable here (vLLM" in joined
    assert "data_selector" not in joined  # each mixed taskset's selector is acted upon
    assert "trainer.trainer_config.critic.ppo_epochs: not applicable" in joined


def test_stage_keys_are_checked_in_each_stage() -> None:
    cfg = TrinityConfig.model_validate(
        {
            "model": {"model_path": "m"},
            "buffer": {"explorer_input": {"taskset": {"path": "t"}}},
            "stages": [
                {"stage_name": "a", "algorithm": {"repeat_times": 2}},
                {
                    "stage_name": "b",
                    "data_processor": {"experience_pipeline": {"input_save_path": "x.jsonl"}},
                },
            ],
        }
    )
    probs = [str(p) for p in not_built_problems(cfg)]
    assert probs == [
        "stages[1].data_processor.experience_pipeline.input_save_path: not built yet: saving "
        "the experience pipeline's input to a file or table; remove the key (or set its "
        "default) to run"
    ]


def test_architecture_doc_matches_the_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("<!-- not-built:start -->\n", 1)[1].split("\n<!-- not-built:end -->", 1)[0]
    assert block == not_built_markdown(), (
        "regenerate docs/architecture.md from not_built_markdown()"
    )
    listed = set(re.findall(r"`([a-z_.\[\]*]+)`", block))
    assert {"model.tinker", "data_processor.experience_pipeline.input_save_path"} <= listed
    # every not-built key is listed, or lies under a listed or declared section
    declared = {k.path for k in KEY_STATES}
    for k in KEY_STATES:
        if k.state == "not_built" or k.refused:
            assert k.path in listed or any(k.path.startswith(p) for p in declared - {k.path})
