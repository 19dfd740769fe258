"""The `file` storage (`trinity/buffer/file.py`): an explore-only run's experiences in a JSONL
file, durable with each writer's cursor, a torn last write cut off by the writer and never read
by the reader, and a later `mode: train` run reading them."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from storages import exp

from trinity.buffer.file import (
    FileStorage,
    TornTail,
    is_experience_file,
    read_experiences,
    state_path,
)
from trinity.buffer.storage import BufferClosed, Cursor, Superseded, storage_class


def test_writes_are_durable_with_their_cursor_and_a_restart_continues_after_them(tmp_path):
    path = tmp_path / "out" / "exp.jsonl"

    async def main():
        s = FileStorage(path, name="exp")
        token = await s.register_writer("e")
        await s.write([exp(0), exp(1)], Cursor("e", 1, 2, {"rollout/reward_mean": 0.5}), token)
        await s.write([exp(2)], Cursor("e", 2, 3, None, {"seen": [1]}), token)
        assert await s.stats() == {"written": 3, "torn_bytes_cut": 0}
        again = FileStorage(path, name="exp")  # a restarted explore process
        assert await again.cursor("e") == Cursor("e", 2, 3, None, {"seen": [1]})
        assert await again.cursor("other") is None
        assert [e.reward for e in read_experiences(path)] == [0.0, 1.0, 2.0]

    asyncio.run(main())
    assert is_experience_file(path) and storage_class("file") is FileStorage
    assert len(path.read_text().splitlines()) == 3


def test_a_torn_last_write_is_cut_by_the_writer_and_never_read(tmp_path, capsys):
    path = tmp_path / "exp.jsonl"

    async def main():
        s = FileStorage(path)
        await s.write([exp(0)], Cursor("e", 1, 1))
        with open(path, "ab") as f:  # a process killed mid-write: bytes past the commit
            f.write(b'{"tokens": [1, 2')
        assert [e.reward for e in read_experiences(path)] == [0.0]  # the reader: committed only
        again = FileStorage(path)  # the writer: cut off, said
        assert (await again.stats())["torn_bytes_cut"] == len(b'{"tokens": [1, 2')
        await again.write([exp(1)], Cursor("e", 2, 2))
        assert [e.reward for e in read_experiences(path)] == [0.0, 1.0]

    asyncio.run(main())
    assert "cut a torn last write of 16 bytes" in capsys.readouterr().out


def test_without_a_state_file_a_torn_line_and_a_bad_line_are_named(tmp_path):
    path = tmp_path / "exp.jsonl"
    good = json.dumps(exp(0).to_dict())
    path.write_text(good + "\n" + good[:20])
    with pytest.raises(TornTail, match="last line is unfinished"):
        read_experiences(path)
    path.write_text(good + "\n" + '{"prompt": "x"}\n' + good + "\n")
    with pytest.raises(ValueError, match=r"exp\.jsonl:2: not an experience line"):
        read_experiences(path)
    # a file shorter than its state file says was committed: changed by someone else
    state_path(path).write_text(json.dumps({"size": 10**6, "written": 9, "cursors": {}}))
    with pytest.raises(ValueError, match="changed by something else"):
        FileStorage(path)


def test_a_replaced_writer_writes_nothing_and_the_file_is_not_a_queue(tmp_path):
    async def main():
        s = FileStorage(tmp_path / "exp.jsonl")
        old = await s.register_writer("e")
        await s.register_writer("e")  # the explorer was started again
        with pytest.raises(Superseded):
            await s.write([exp(0)], Cursor("e", 1, 1), old)
        with pytest.raises(TypeError, match="read by a later `mode: train` run"):
            await s.read(1)
        await s.release_writer("e")
        with pytest.raises(BufferClosed):
            await s.write([exp(0)], Cursor("e", 1, 1))

    asyncio.run(main())


def test_a_train_run_reads_the_file_as_its_experiences_in_write_order(tmp_path):
    from trinity.config.buffer_schema import StorageConfig
    from trinity.trainer.sft_data import DatasetSource

    path = tmp_path / "exp.jsonl"

    async def write():
        s = FileStorage(path)
        await s.write([exp(i) for i in range(6)], Cursor("e", 1, 6))

    asyncio.run(write())
    storage = StorageConfig(name="exp", storage_type="file", path=str(path))
    cfg = SimpleNamespace(
        buffer=SimpleNamespace(
            train_batch_size=0, batch_size=2, total_epochs=1,
            trainer_input=SimpleNamespace(experience_buffer=storage),
        ),
        algorithm=SimpleNamespace(repeat_times=2),  # batches of 2 tasks x 2 samples
        seed=0,
    )  # fmt: skip
    source = DatasetSource(cfg, tokenizer=None)
    assert [e.reward for e in source.read(4)] == [0.0, 1.0, 2.0, 3.0]
    assert [e.reward for e in source.read(4)] == [4.0, 5.0]
    assert source.read(4) is None
    with pytest.raises(ValueError, match=r"not \(chosen, rejected\) pairs"):
        DatasetSource(cfg, tokenizer=None, pairwise=True)


def test_a_run_that_explores_and_trains_at_once_is_told_to_use_a_queue(tmp_path):
    from trinity.config import ConfigError, load_config

    path = tmp_path / "cfg.yaml"
    path.write_text(
        "mode: both\nmodel: {model_path: m}\nbuffer:\n  explorer_input:\n"
        "    taskset: {path: data/t}\n  trainer_input:\n"
        "    experience_buffer: {name: e, storage_type: file, path: x.jsonl}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = [p for p in info.value.problems if "storage_type" in p.path]
    assert "use storage_type queue or sql" in problem.message


@pytest.mark.slow  # three whole runs (about 40 s on 2 cores)
def test_an_explore_only_run_feeds_a_later_train_only_run_that_resumes_exactly(
    tmp_path, tiny_model_dir
):
    """`mode: explore` writes 3 steps of 16 experiences to a file; `mode: train` (GRPO) trains
    2 steps from it, checkpoints, and a continued run with a budget of 3 trains the third batch
    only: 3 steps, each on the explore step it follows, as one uninterrupted run trains them."""
    from test_e2e import grpo_config, run_trinity

    data = tmp_path / "rollouts" / "exp.jsonl"
    config = grpo_config(tmp_path, tiny_model_dir)
    text = config.read_text().replace(
        "{name: exp, storage_type: queue}", f"{{name: exp, storage_type: file, path: '{data}'}}"
    )
    config.write_text(text)
    r = run_trinity(config, overrides=["mode=explore", "explorer.eval_interval=0"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    explored = read_experiences(data)
    assert len(explored) == 3 * 16 and [e.eid.batch for e in explored[::16]] == [1, 2, 3]

    def train(name: str, steps: int, *extra: str):
        r = run_trinity(
            config,
            overrides=["mode=train", f"name={name}", f"buffer.total_steps={steps}",
                       "trainer.save_interval=1", *extra],
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        recs = [json.loads(x) for x in (tmp_path / f"ckpt/e2e/{name}/metrics.jsonl").open()]
        return [x for x in recs if "train/loss" in x]

    whole = train("whole", 3)
    first = train("split", 2)
    rest = train("split", 3, "continue_from_checkpoint=true")
    assert len(whole) == 3 and len(first) == 2 and len(rest) == 3  # the record holds all 3
    for a, b in zip(whole, rest, strict=True):  # the same batches, the same updates
        assert a["step"] == b["step"]
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4, abs=1e-9), (a, b)
