"""Checkpoints are durable before their leases are acked, and a torn one is never resumed from.

`save_hf_checkpoint` is driven with stand-ins for the model (its weights writer, `save_weights`)
and tokenizer that write files the way `save_pretrained` does (a weights file, a config, tokenizer
files; the critic's weights in a subfolder), so every test runs in milliseconds and knows each file
it wrote. `save_weights` itself is tested on a real model at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from trinity.trainer import checkpoint as ckpt
from trinity.trainer.checkpoint import (
    MANIFEST,
    TRAINER_STATE,
    checkpoint_step,
    latest_resumable,
    list_checkpoints,
    save_hf_checkpoint,
    trained_leases,
)


class _Model:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def save_pretrained(self, folder: Path, safe_serialization: bool = True) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(self.tag.encode() * 1000)
        (folder / "config.json").write_text(json.dumps({"tag": self.tag}))


@pytest.fixture(autouse=True)
def _stand_in_weights(monkeypatch):
    monkeypatch.setattr(
        ckpt, "save_weights", lambda model, folder, weights=None: model.save_pretrained(folder)
    )


class _Tokenizer:
    def save_pretrained(self, folder: Path) -> None:
        (folder / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
        (folder / "tokenizer_config.json").write_text("{}")


def _critic(folder: Path) -> dict:
    (folder / "critic").mkdir()
    (folder / "critic" / "model.safetensors").write_bytes(b"c" * 512)
    return {"critic_optimizer": {}}


def _save(root: Path, step: int, tag: str, keep: int | None = None) -> Path:
    return save_hf_checkpoint(
        _Model(tag), _Tokenizer(), root, step, keep, {"step": step}, [step * 10], _critic
    )


def _write_sequence(folder: Path) -> list[str]:
    """The files of a sealed checkpoint in the order they are made durable: the manifest last."""
    listed = list(json.loads((folder / MANIFEST).read_text())["files"])
    return [*listed, MANIFEST]


def test_a_saved_checkpoint_is_complete_and_names_every_file(tmp_path):
    path = _save(tmp_path, 3, "a")
    assert path == tmp_path / "global_step_3"
    files = json.loads((path / MANIFEST).read_text())["files"]
    # 4 from the stand-ins + critic weights + trainer state + leases; not the manifest itself
    assert sorted(files) == sorted(
        [
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "critic/model.safetensors",
            TRAINER_STATE,
            "buffer_leases.json",
        ]
    )
    assert files["model.safetensors"] == 1000  # "a" * 1000
    assert files["critic/model.safetensors"] == 512
    assert latest_resumable(tmp_path) == path
    assert trained_leases(path) == [30]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def _torn_variants(good: Path) -> list[tuple[str, dict[str, bytes]]]:
    """Every way a crash can leave `good`'s folder: each proper prefix of its write sequence,
    then all files but one, and all files with one of them cut short (to half and to one byte
    less)."""
    seq = _write_sequence(good)
    content = {f: (good / f).read_bytes() for f in seq}
    out = []
    for k in range(len(seq)):  # the first k files of the sequence: the manifest is never there
        out.append((f"prefix {k}", {f: content[f] for f in seq[:k]}))
    for f in seq:
        out.append((f"all but {f}", {g: content[g] for g in seq if g != f}))
        for cut in sorted({len(content[f]) // 2, len(content[f]) - 1}):
            out.append((f"{f} cut to {cut}", {**content, f: content[f][:cut]}))
    return out


def test_a_checkpoint_torn_at_any_file_boundary_is_never_chosen(tmp_path):
    good_root = tmp_path / "good"
    first = _save(good_root, 1, "a")
    second = _save(good_root, 2, "b")
    assert latest_resumable(good_root) == second
    assert len(_write_sequence(second)) == 8  # 7 files + the manifest
    variants = _torn_variants(second)
    for label, files in variants:
        root = tmp_path / "torn"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(first, root / "global_step_1")
        for name, data in files.items():
            (root / "global_step_2" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "global_step_2" / name).write_bytes(data)
        chosen = latest_resumable(root)
        assert chosen == root / "global_step_1", label
        assert trained_leases(chosen) == [10], label  # the previous good one's leases


def test_a_checkpoint_from_before_manifests_is_not_trusted(tmp_path):
    """The old rule took any folder with a trainer_state.pt; without a manifest nothing says the
    folder is whole, so it is passed over."""
    good = _save(tmp_path, 1, "a")
    legacy = tmp_path / "global_step_2"
    shutil.copytree(good, legacy)
    (legacy / MANIFEST).unlink()
    assert (legacy / TRAINER_STATE).is_file()
    assert latest_resumable(tmp_path) == good


def test_every_file_and_folder_is_fsynced_before_the_rename_and_the_manifest_last(
    tmp_path, monkeypatch
):
    events: list[tuple[str, str]] = []
    real_file, real_dir, real_rename = ckpt._fsync_file, ckpt._fsync_dir, os.rename

    def fsync_file(p: Path) -> None:
        events.append(("file", str(p)))
        real_file(p)

    def fsync_dir(p: Path) -> None:
        events.append(("dir", str(p)))
        real_dir(p)

    def rename(a, b) -> None:
        events.append(("rename", f"{Path(a).name}->{Path(b).name}"))
        real_rename(a, b)

    monkeypatch.setattr(ckpt, "_fsync_file", fsync_file)
    monkeypatch.setattr(ckpt, "_fsync_dir", fsync_dir)
    monkeypatch.setattr(os, "rename", rename)
    final = _save(tmp_path, 5, "a")
    tmp = tmp_path / ".global_step_5.tmp"
    into_place = events.index(("rename", ".global_step_5.tmp->global_step_5"))
    before = events[:into_place]
    synced = {Path(p) for kind, p in before if kind == "file"}
    written = {tmp / p.relative_to(final) for p in final.rglob("*") if p.is_file()}
    assert synced == written  # every file, the manifest included, before the rename
    dirs = [Path(p) for kind, p in before if kind == "dir"]
    assert tmp / "critic" in dirs and tmp in dirs
    manifest_at = before.index(("file", str(tmp / MANIFEST)))
    others = [
        i for i, (kind, p) in enumerate(before) if kind == "file" and not p.endswith(MANIFEST)
    ]
    assert max(others) < manifest_at  # the manifest is made durable after every other file
    assert ("dir", str(tmp)) in before[manifest_at:]  # and its folder entry after it
    assert events[into_place + 1] == ("dir", str(tmp_path))  # the rename itself, then the ack


def test_a_replaced_checkpoint_is_kept_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    _save(tmp_path, 1, "a")
    old = _save(tmp_path, 2, "b")
    real_rename = os.rename

    def crash_on_the_second_rename(a, b) -> None:
        if Path(a).name == ".global_step_2.tmp":
            raise OSError("simulated crash between the two renames")
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", crash_on_the_second_rename)
    with pytest.raises(OSError, match="simulated crash"):
        _save(tmp_path, 2, "c")
    monkeypatch.setattr(os, "rename", real_rename)
    assert not old.exists()  # renamed away ...
    kept = latest_resumable(tmp_path)  # ... but still the checkpoint of step 2
    assert kept == tmp_path / ".global_step_2.old" and checkpoint_step(kept) == 2
    assert (kept / "model.safetensors").read_bytes() == b"b" * 1000
    # the next save finishes the replacement first: the old folder is back under its name
    _save(tmp_path, 3, "d")
    assert (tmp_path / "global_step_2" / "model.safetensors").read_bytes() == b"b" * 1000
    assert not (tmp_path / ".global_step_2.old").exists()
    assert not (tmp_path / ".global_step_2.tmp").exists()
    # a replacement that goes through leaves the new content and nothing else
    _save(tmp_path, 2, "e")
    assert (tmp_path / "global_step_2" / "model.safetensors").read_bytes() == b"e" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_1",
        "global_step_2",
        "global_step_3",
    ]


def test_pruning_keeps_the_newest_and_leaves_no_half_folder(tmp_path):
    for step in range(1, 6):
        _save(tmp_path, step, str(step), keep=2)
    assert [c.name for c in list_checkpoints(tmp_path)] == ["global_step_4", "global_step_5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_4", "global_step_5"]


def test_save_weights_writes_what_from_pretrained_reads_tied_weights_once(tmp_path, tiny_model_dir):
    """The real writer on a real model whose output embedding is tied to its input one: the file
    holds each tensor once (the tied one under its first name, as `save_pretrained` writes it),
    and the folder loads back equal, still tied."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ckpt.save_weights(model, tmp_path / "mine")
    model.save_pretrained(tmp_path / "theirs")
    with (
        safe_open(tmp_path / "mine" / "model.safetensors", "pt") as mine,
        safe_open(tmp_path / "theirs" / "model.safetensors", "pt") as theirs,
    ):
        keys = set(mine.keys())  # safe_open has keys(), no __contains__
        assert keys == set(theirs.keys()) and "lm_head.weight" not in keys
        for k in keys:
            assert torch.equal(mine.get_tensor(k), theirs.get_tensor(k)), k
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "mine")
    assert back.lm_head.weight is back.model.embed_tokens.weight
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert (tmp_path / "mine" / "generation_config.json").is_file()
