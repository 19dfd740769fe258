"""`trainer.malloc_mmap_threshold_mb`: glibc's mmap threshold fixed in the trainer's process
(`common.memory.set_mmap_threshold`).

The heap test runs in a fresh process each (a process's heap is its history). glibc serves an
8 MiB block with its own mapping (above the 128 KiB start threshold); freeing it raises the
threshold to 8 MiB and the heap's trim threshold to twice that, so a 4 MiB block allocated next
comes from the heap, and when it is freed its pages stay in the process. With the threshold
fixed at 1 MiB the 4 MiB block is a mapping of its own, and freeing it gives its pages back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from test_trainer import make_config

from trinity.common import memory
from trinity.config.preflight import preflight

MiB = 1024**2

WORK = textwrap.dedent("""
    import ctypes, json, re, sys
    from trinity.common.memory import set_mmap_threshold

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def rss():
        return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    def touch_and_free(n):
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)  # resident
        libc.free(p)

    if sys.argv[1] == "fixed":
        set_mmap_threshold(1024**2)
    touch_and_free(8 * 1024**2)
    start = rss()
    touch_and_free(4 * 1024**2)
    print(json.dumps({"kept": rss() - start}))
""")


def kept_after_free(mode: str) -> int:
    r = subprocess.run([sys.executable, "-c", WORK, mode], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["kept"]


@pytest.mark.skipif(not memory.can_set_mmap_threshold(), reason="glibc only")
def test_a_fixed_threshold_gives_a_freed_block_back_that_the_default_keeps():
    assert kept_after_free("default") > 3 * MiB  # the block's 4 MiB stay (less other frees)
    assert kept_after_free("fixed") < 1 * MiB  # gone with its mapping


def test_the_threshold_is_bounded_by_glibcs():
    with pytest.raises(ValueError, match="must be in"):
        memory.set_mmap_threshold(64 * MiB)


def test_the_key_sets_the_trainers_threshold(tmp_path, tiny_model_dir, monkeypatch):
    from trinity.trainer import trainer as trainer_mod

    seen: list[int] = []
    monkeypatch.setattr(trainer_mod, "set_mmap_threshold", seen.append)
    cfg = make_config(tmp_path, tiny_model_dir, malloc_mmap_threshold_mb="2")
    trainer_mod.Trainer(cfg, str(tiny_model_dir), total_steps=1)
    assert seen == [2 * MiB]
    seen.clear()
    trainer_mod.Trainer(make_config(tmp_path, tiny_model_dir), str(tiny_model_dir), total_steps=1)
    assert seen == []  # unset: glibc's own


def test_validate_refuses_the_key_without_glibc(tmp_path, tiny_model_dir, monkeypatch):
    key = "trainer.malloc_mmap_threshold_mb"
    cfg = make_config(tmp_path, tiny_model_dir, malloc_mmap_threshold_mb="1")
    for glibc in (True, False):
        monkeypatch.setattr(memory, "can_set_mmap_threshold", lambda glibc=glibc: glibc)
        found = [p for p in preflight(cfg).problems if p.path == key]
        assert len(found) == (0 if glibc else 1), found
    assert "glibc" in found[0].message


@pytest.mark.parametrize(
    ("key", "one_process", "trims"),
    [(None, False, 1), ("true", False, 1), ("false", False, 0), (None, True, 0), ("true", True, 1)],
)
def test_release_heap_after_step_decides_the_trim_once_the_trainer_idles(
    tmp_path, tiny_model_dir, monkeypatch, key, one_process, trims
):
    # the default (unset) trims: the engines of an on-policy run may use the memory meanwhile;
    # in one process with them (cluster.one_process) they reuse it untrimmed
    import time

    from test_trainer import experiences

    from trinity.common import memory
    from trinity.trainer import trainer as trainer_mod

    kw = {} if key is None else {"release_heap_after_step": key}
    cfg = make_config(tmp_path, tiny_model_dir, **kw)
    cfg.cluster.one_process = one_process
    trainer = trainer_mod.Trainer(cfg, str(tiny_model_dir), total_steps=2)
    assert (trainer.idle_trim is not None) == bool(trims)
    calls: list[None] = []
    monkeypatch.setattr(memory, "release_free_heap", lambda: calls.append(None))
    trainer.train_step(experiences(trainer.model.config.vocab_size))
    # once idle for TRIM_AFTER_IDLE_S (0.5 s; the thread looks every 0.25 s), within 10 s; a
    # trainer without the idle trim never trims (no thread to wait for)
    deadline = time.monotonic() + 10.0
    while trims and time.monotonic() < deadline and not calls:
        time.sleep(0.05)
    assert len(calls) == trims
    trainer.release_training_state()


def test_idle_trim_waits_while_busy_and_trims_once_per_idle_period(monkeypatch):
    """No trim while some work is marked busy, however long; one after it ends and the process
    idles for idle_s; none again until more work. (Back-to-back train steps never trim.)"""
    import time

    from trinity.common import memory

    calls: list[float] = []
    monkeypatch.setattr(memory, "release_free_heap", lambda: calls.append(time.monotonic()))
    trim = memory.IdleTrim(idle_s=0.1)
    try:
        for _ in range(3):  # three "steps", each 5 idle periods long, back to back
            with trim.busy():
                time.sleep(0.5)
        assert calls == []
        ended = time.monotonic()
        deadline = ended + 10.0
        while time.monotonic() < deadline and not calls:
            time.sleep(0.02)
        assert len(calls) == 1 and calls[0] - ended >= 0.1
        time.sleep(0.5)  # idle on: nothing new was freed
        assert len(calls) == 1
    finally:
        trim.close()


def test_validate_refuses_one_process_where_ray_would_give_gpus(
    tmp_path, tiny_model_dir, monkeypatch
):
    """`trinity run` refuses cluster.one_process when Ray gives the run GPUs; `validate` says so
    first from the GPUs this machine has, unless gpu_per_node: 0 keeps the run on CPUs."""
    import torch

    import trinity.config.preflight as pf

    cfg = make_config(tmp_path, tiny_model_dir)
    cfg.cluster.one_process = True
    monkeypatch.setattr(pf, "gpu_driver_present", lambda: True)  # torch is asked
    for gpus in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpus=gpus: gpus)
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: int(gpus))
        found = [p for p in preflight(cfg).problems if p.path == "cluster.one_process"]
        assert len(found) == int(gpus), found
    assert found[0].message.startswith("not built yet on GPUs: this machine has 1 CUDA GPU")
    # no GPU driver on this machine: torch is not asked (nor imported, for this check)
    monkeypatch.setattr(pf, "gpu_driver_present", lambda: False)
    assert not [p for p in preflight(cfg).problems if p.path == "cluster.one_process"]
    monkeypatch.setattr(pf, "gpu_driver_present", lambda: True)
    cfg.cluster.gpu_per_node = 0
    assert not [p for p in preflight(cfg).problems if p.path == "cluster.one_process"]
