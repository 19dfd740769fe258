"""`storage_type: file` as an experience buffer in the config: which file is experiences and which
a dataset, and what `validate` refuses (a missing store for a reader, a writer's name that is
neither .jsonl nor .parquet, a store of dataset rows read as experiences: a JSONL line, a Parquet
part's columns, a `datasets` folder's columns)."""

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


@pytest.mark.parametrize("name", ["e.json", "rollouts"])
def test_explorers_write_a_jsonl_file_or_a_parquet_folder(tmp_path, name):
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file(tmp_path, "explore", "grpo", tmp_path / name))
    assert WHERE in str(info.value) and "JSONL file (.jsonl) or a folder of Parquet" in str(
        info.value
    )
    assert "nobody writes" in str(info.value)  # another name: a `datasets` folder, read only
    assert (
        messages(load_config(cfg_file(tmp_path, "explore", "grpo", tmp_path / "e.parquet"))) == []
    )


def test_a_train_run_on_parquet_checks_every_part_s_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "e.parquet"
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", folder)))
    assert f"no experience file at {folder}" in problem  # nothing explored there yet
    folder.mkdir()
    good = {**exp(0).to_dict(), "info": "{}", "metrics": "{}"}
    pq.write_table(pa.Table.from_pylist([good]), folder / "part-000001.parquet")
    assert messages(load_config(cfg_file(tmp_path, "train", "grpo", folder))) == []
    rows = pa.Table.from_pylist([{"prompt": "1+1=", "tokens": [1, 2]}])
    pq.write_table(rows, folder / "part-000002.parquet")  # a later part: its columns count too
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", folder)))
    assert f"{folder / 'part-000002.parquet'}: no column 'prompt_length'" in problem
    single = tmp_path / "one.parquet"
    pq.write_table(rows, single)
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", single)))
    assert "is a file: experiences in Parquet are a folder of parts" in problem


def test_a_train_run_reads_a_datasets_folder_of_experiences(tmp_path):
    import datasets

    saved = tmp_path / "exp_ds"
    good = {**exp(0).to_dict(), "info": "{}", "metrics": "{}"}
    datasets.Dataset.from_list([good]).save_to_disk(str(saved))
    assert messages(load_config(cfg_file(tmp_path, "train", "grpo", saved))) == []
    rows = tmp_path / "rows_ds"
    datasets.Dataset.from_list([{"prompt": "1+1=", "response": "2"}]).save_to_disk(str(rows))
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", rows)))
    assert f"{rows}: no column 'tokens', 'prompt_length'" in problem
    other = tmp_path / "e.json"  # neither .jsonl nor .parquet nor a folder
    other.write_text("[]")
    (problem,) = messages(load_config(cfg_file(tmp_path, "train", "grpo", other)))
    assert "an experience store is a .jsonl file, a .parquet folder of parts, or a `datasets`" in (
        problem
    )
