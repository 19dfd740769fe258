"""A run without Ray: the ServiceHost on a thread of this process (`common.local_host`) behind
the actor-handle shape, its LocalRefs (`common.refs`), and a stop that names the newest
checkpoint only once no newer one can be sealed."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from trinity.common import refs, seals
from trinity.common.local_host import LocalHost
from trinity.common.service_host import hosted
from trinity.trainer import checkpoint


class Store:  # an async class: its calls run on the host's loop
    def __init__(self) -> None:
        self.items: list[int] = []

    async def add(self, x: int) -> int:
        self.items.append(x)
        return len(self.items)

    async def slow(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slow"

    async def fail(self) -> None:
        raise ValueError("bad input, from the store")


class Writer:  # an async object that calls another hosted object, as the explorer calls the buffer
    def __init__(self, store: object) -> None:
        self.store = store

    async def write(self, xs: list[int]) -> list[int]:
        return [await self.store.add.remote(x) for x in xs]

    async def thread(self) -> str:
        return threading.current_thread().name


class Reader:  # a plain class: on threads of its own, waiting with refs.get, as the trainer does
    def __init__(self, store: object) -> None:
        self.store = store

    def add_twice(self, x: int) -> list[int]:
        return [refs.get(self.store.add.remote(x)) for _ in range(2)]

    def thread(self) -> str:
        return threading.current_thread().name


@pytest.fixture
def host():
    h = LocalHost()
    yield h
    h.close()


def test_hosted_objects_call_each_other_on_the_host_s_loop_and_threads(host):
    store = hosted(host, "store", Store, max_concurrency=8)
    writer = hosted(host, "writer", Writer, store, max_concurrency=8)
    reader = hosted(host, "reader", Reader, store, max_concurrency=2)
    assert refs.get(writer.write.remote([7, 8])) == [1, 2]
    assert refs.get(reader.add_twice.remote(9)) == [3, 4]
    assert refs.get(writer.thread.remote()) == "service-host"  # the loop's own thread
    assert refs.get(reader.thread.remote()).startswith("service")
    assert refs.get(reader.thread.remote()) != "service-host"


def test_a_ref_argument_arrives_resolved_and_errors_keep_their_type(host):
    store = hosted(host, "store", Store, max_concurrency=8)
    n = store.add.remote(5)
    # the count the first call returned is the value the second one stores, as Ray resolves a
    # top-level ObjectRef argument before the actor's method runs
    assert refs.get(store.add.remote(n)) == 2
    with pytest.raises(ValueError, match="bad input, from the store"):
        refs.get(store.fail.remote())


def test_wait_returns_the_first_done_and_get_times_out(host):
    store = hosted(host, "store", Store, max_concurrency=8)
    slow, fast = store.slow.remote(0.5), store.add.remote(1)
    done, pending = refs.wait([slow, fast], num_returns=1)
    assert done == [fast] and pending == [slow]
    with pytest.raises(TimeoutError):
        refs.get(store.slow.remote(5.0), timeout=0.05)
    assert refs.wait([slow], timeout=0.01)[0] in ([], [slow])
    assert refs.get([slow, fast]) == ["slow", 1]


def test_a_local_ref_is_awaitable_from_another_loop(host):
    store = hosted(host, "store", Store, max_concurrency=8)

    async def main() -> int:
        return await store.add.remote(3)

    assert asyncio.run(main()) == 1


def test_close_shuts_every_object_down_and_ends_the_thread():
    h = LocalHost()
    shut: list[str] = []

    class Part:
        def shutdown(self) -> None:
            shut.append("part")

    refs.get(hosted(h, "part", Part).shutdown.remote())  # built, and callable
    shut.clear()
    h.close()
    assert shut == ["part"] and not h._thread.is_alive()


class _Config:
    def save_pretrained(self, folder: Path) -> None:
        (folder / "config.json").write_text("{}")


class Model(torch.nn.Linear):  # what save_hf_checkpoint asks of a model
    def __init__(self) -> None:
        super().__init__(2, 2)
        self.config = _Config()


class Tokenizer:
    def save_pretrained(self, folder: Path) -> None:
        (folder / "tokenizer.json").write_text("{}")


def test_after_stop_sealing_no_checkpoint_is_sealed_in_the_run_folder(tmp_path: Path):
    """The stop of a run without Ray: the trainer's thread may go on, but a checkpoint it saves
    after the stop is never sealed, so the one the run named stays the newest; a new run in the
    same folder may seal again."""

    run_dir = tmp_path / "run"
    stage = run_dir / "stage0"
    first = checkpoint.save_hf_checkpoint(Model(), Tokenizer(), stage, 2, None, {"step": 2})
    host = LocalHost()
    host.halt(run_dir)
    with pytest.raises(seals.CheckpointsStopped):
        checkpoint.save_hf_checkpoint(Model(), Tokenizer(), stage, 4, None, {"step": 4})
    assert checkpoint.latest_resumable(stage) == first
    host.close()
    assert host._thread.is_alive()  # halted: stragglers still get their errors from the loop
    seals.allow_sealing(run_dir)
    again = checkpoint.save_hf_checkpoint(Model(), Tokenizer(), stage, 4, None, {"step": 4})
    assert checkpoint.latest_resumable(stage) == again


def test_a_stop_waits_for_a_checkpoint_being_sealed(tmp_path: Path, monkeypatch):
    """`stop_sealing` while a checkpoint takes its name returns after it has: the run then
    names that checkpoint, the newest there will be."""
    entered, release = threading.Event(), threading.Event()
    real = checkpoint._fsync_dir
    final = tmp_path / "global_step_1"

    def slow_fsync(path: Path) -> None:
        if path == tmp_path and final.exists():  # the parent's fsync after the rename
            entered.set()
            release.wait(5)
        real(path)

    monkeypatch.setattr(checkpoint, "_fsync_dir", slow_fsync)
    args = (Model(), Tokenizer(), tmp_path, 1, None, {"step": 1})
    sealer = threading.Thread(target=checkpoint.save_hf_checkpoint, args=args)
    sealer.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=seals.stop_sealing, args=(tmp_path,))
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # waits for the seal under way
    release.set()
    stopper.join(5)
    sealer.join(5)
    assert not stopper.is_alive() and checkpoint.latest_resumable(tmp_path) == final
    seals.allow_sealing(tmp_path)
