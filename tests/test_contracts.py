"""The runtime's contracts: Protocols in neutral modules, registries keyed by config names."""

import subprocess
import sys

import pytest
import torch

from trinity.buffer.storage import ExperienceStorage, storage_class
from trinity.common.rollout import RolloutEngine, engine_class
from trinity.sync.fingerprint import split
from trinity.sync.method import SyncMethod, state_nbytes, sync_method


def test_registries_resolve_config_names_and_list_valid_ones_on_a_miss():
    from trinity.buffer.queue import QueueStorage
    from trinity.explorer.engine import HFRolloutEngine

    assert engine_class("transformers") is HFRolloutEngine
    assert storage_class("queue") is QueueStorage
    checkpoint = sync_method("checkpoint")  # fingerprinted (sync.fingerprint) around its method
    assert type(checkpoint.method).__name__ == "CheckpointSync" and checkpoint.name == "checkpoint"
    with pytest.raises(KeyError, match="Valid names: external, transformers, vllm"):
        engine_class("vllm_typo")
    with pytest.raises(KeyError, match="Valid names: file, queue, sql"):
        storage_class("sqll")
    with pytest.raises(KeyError, match=r"Did you mean 'memory'.*Valid names: checkpoint, memory"):
        sync_method("memroy")


def test_registered_implementations_satisfy_their_protocols(tiny_model_dir):
    assert isinstance(storage_class("queue")(None), ExperienceStorage)
    assert isinstance(sync_method("memory"), SyncMethod)
    assert isinstance(sync_method("checkpoint"), SyncMethod)
    assert isinstance(engine_class("transformers")(str(tiny_model_dir)), RolloutEngine)


def test_workflow_contract_does_not_import_an_engine():
    code = (
        "import sys, trinity.workflows, trinity.explorer.model_client\n"
        "assert 'trinity.explorer.engine' not in sys.modules, 'workflows import the HF engine'\n"
        "assert 'transformers' not in sys.modules, 'workflows import transformers'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_checkpoint_method_round_trip_and_discard(tmp_path):
    state = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    state["tied"] = state["a"]  # shared storage (tied embeddings): safetensors needs a copy
    m = sync_method("checkpoint")
    payload = m.send(state, 3, tmp_path / "sync")
    own, stamp = split(payload)  # the method's payload, then the weights' fingerprint
    assert own == [str(tmp_path / "sync" / "weights_v3.safetensors")] and stamp.version == 3
    got = m.receive(payload)
    assert set(got) == {"a", "b", "tied"}
    torch.testing.assert_close(got["tied"], state["a"])
    assert not list((tmp_path / "sync").glob("*.tmp"))  # written under a temporary name, renamed
    m.discard(payload)
    assert not (tmp_path / "sync" / "weights_v3.safetensors").exists()
    assert state_nbytes(state) == (6 + 4 + 6) * 4
