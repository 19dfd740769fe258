"""`storage_type: file` as an experience buffer in the config: which file is experiences and which
a dataset, and what `validate` refuses (a missing file for a reader, a name that is not JSONL, a
file of dataset rows read as experiences)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from storages import exp

from trinity.config import ConfigError, load_config
from trinity.config.preflight import preflight
from trinity.config.run_folder import reads_experiences, trains_from_queue

WHERE = "buffer.trainer_input.experience_buffer.path"


def cfg_file(tmp_path: Path, mode: str, algorithm: str, path: Path | str) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        mode: {mode}
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: "tiny://1m"}}
        algorithm: {{algorithm_type: {algorithm}}}
        buffer:
          batch_size: 4
          train_batch_size: 4
          total_steps: 2
          explorer_input:
            taskset:
              {{name: add, storage_type: synthetic, path: arithmetic,
               format: {{prompt_key: question, response_key: answer}}}}
            default_reward_fn_type: arithmetic_reward
          trainer_input:
            experience_buffer: {{name: exp, storage_type: file, path: "{path}"}}
        """)
    )
    return cfg


def messages(cfg) -> list[str]:
    return [p.message for p in preflight(cfg).problems if p.path == WHERE]


def test_a_rollout_algorithm_reads_a_file_as_experiences_sft_as_a_dataset(tmp_path):
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"prompt": "1+1=", "response": "2"}) + "\n")
    grpo = load_config(cfg_file(tmp_path, "train", "grpo", tmp_path / "e.jsonl"))
    assert reads_experiences(grpo) and trains_from_queue(grpo)
    as_sft = load_config(cfg_file(tmp_path, "train", "sft", sft))
    assert not reads_experiences(as_sft) and not trains_from_queue(as_sft)
    assert messages(as_sft) == []  # the dataset checks as before


def test_a_train_run_needs_the_file_written_a_writer_creates_it(tmp_path):
    missing = tmp_path / "nowhere" / "e.jsonl"
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", missing)))
    assert f"no experience file at {missing}" in problem and "mode explore" in problem
    assert messages(load_config(cfg_file(tmp_path, "explore", "grpo", missing))) == []


def test_a_file_of_dataset_rows_is_not_read_as_experiences(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "1+1=", "response": "2"}) + "\n")
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", rows)))
    assert f"{rows}:1: not an experience" in problem and "'grpo' trains on rollouts" in problem
    # Trinity-RFT's experience JSONL: text and lengths, nothing to train on
    theirs = {"eid": {"batch": 0}, "prompt_length": 3, "response_length": 2, "reward": 1.0}
    rows.write_text(json.dumps(theirs) + "\n")
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", rows)))
    assert "Trinity-RFT's experience JSONL" in problem
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(exp(0).to_dict()) + "\n")
    assert messages(load_config(cfg_file(tmp_path, "train", "grpo", good))) == []


@pytest.mark.parametrize("name", ["e.parquet", "e.json", "rollouts"])
def test_an_experience_file_must_be_jsonl(tmp_path, name):
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file(tmp_path, "explore", "grpo", tmp_path / name))
    assert WHERE in str(info.value) and "JSONL" in str(info.value)
