"""The collective (`nccl`, gloo on CPU) weight-sync method: engines in their own processes get the
trainer's bytes exactly, in order, and errors reach them instead of a hang."""

from __future__ import annotations

import io
import multiprocessing as mp
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from trinity.common.rollout import Peers
from trinity.sync.collective import Layout, pack, unpack
from trinity.sync.method import sync_method


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(5, 3, generator=g)
    return {
        "embed.weight": w,
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "steps": torch.tensor([seed, 2**40], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(float("nan")),
        "lm_head.weight": w,  # tied: the same storage as embed.weight
    }


def _engine(rank: int, world: int, payloads: list, run: str, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    m = sync_method("nccl")
    got = []
    for i, p in enumerate(payloads):
        call = f"{run}-{i}"  # the same for every engine loading payload i, new for each load
        try:
            buf = io.BytesIO()  # bytes, not tensors: a queue shares tensors by fd
            torch.save(
                {k: v.clone() for k, v in m.receive(p, Peers(rank, world, call)).items()}, buf
            )
            got.append(buf.getvalue())
        except RuntimeError as e:
            got.append(str(e))
    out.put((rank, got))


def _run_engines(payloads: list, world: int) -> dict[int, list]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    run = uuid.uuid4().hex
    procs = [ctx.Process(target=_engine, args=(r, world, payloads, run, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for rank, got in results.items():
        results[rank] = [g if isinstance(g, str) else torch.load(io.BytesIO(g)) for g in got]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)  # a safetensors file lists names sorted
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        a = got[k].reshape(-1).view(torch.uint8) if got[k].dtype != torch.bool else got[k]
        b = want[k].reshape(-1).view(torch.uint8) if want[k].dtype != torch.bool else want[k]
        assert torch.equal(a, b), k


def test_layout_buckets_and_round_trip():
    state = _state(0)
    # 60, 6, 16, 3, 4 and 60 bytes, each starting at a multiple of 16, in 64-byte buckets: a
    # tensor never straddles two. 60 fills bucket 0; 6 at 0, 16 at 16, 3 at 32, 4 at 48 end at 52;
    # the tied 60 does not fit after 64 and opens bucket 2.
    layout = Layout.of(state, bucket_bytes=64)
    assert layout.bucket_sizes == (60, 52, 60)
    assert [e[3:] for e in layout.entries] == [(0, 0), (1, 0), (1, 16), (1, 32), (1, 48), (2, 0)]
    assert_bit_exact(unpack(pack(state, layout, torch.device("cpu")), layout), state)


def test_two_engines_get_every_version_bit_exactly_and_an_error_for_a_discarded_one(tmp_path):
    m = sync_method("nccl")
    states = {v: _state(v) for v in (1, 2, 3)}
    payloads = [m.send(states[v], v, tmp_path) for v in (1, 2, 3)]
    m.discard(payloads[1])  # v2 dropped by the synchronizer before anyone asked for it
    snapshot_of_v3 = {k: t.clone() for k, t in states[3].items()}
    states[3]["embed.weight"].add_(1.0)  # the trainer trains on: the engines get the snapshot
    results = _run_engines([payloads[0], payloads[1], payloads[2]], world=2)
    for rank in (0, 1):
        v1, v2, v3 = results[rank]
        assert_bit_exact(v1, states[1])
        assert isinstance(v2, str) and "no longer holds v2" in v2
        assert_bit_exact(v3, snapshot_of_v3)
    # new engine processes (a restart): the trainer sees other members and builds a new group
    again = _run_engines([payloads[2]], world=3)
    for rank in (0, 1, 2):
        assert_bit_exact(again[rank][0], snapshot_of_v3)


def test_the_next_snapshot_is_packed_into_a_discarded_one_and_still_arrives_exactly(tmp_path):
    from trinity.sync import collective

    m = sync_method("nccl")
    p1 = m.send(_state(101), 101, tmp_path)  # versions of its own: the broadcaster is shared
    assert collective._BROADCASTER is not None
    held = list(collective._BROADCASTER.snapshots[101])  # alive: its memory is not reallocated
    first = [b.data_ptr() for b in held]
    m.discard(p1)
    p2 = m.send(_state(102), 102, tmp_path)
    assert 101 not in collective._BROADCASTER.snapshots
    assert [b.data_ptr() for b in collective._BROADCASTER.snapshots[102]] == first
    p3 = m.send(_state(103), 103, tmp_path)  # nothing discarded: fresh buffers
    assert [b.data_ptr() for b in collective._BROADCASTER.snapshots[103]] != first
    # one engine receives v102 then v103 into the same buckets: each arrives whole
    got = _run_engines([p1, p2, p3], world=1)[0]
    assert isinstance(got[0], str) and "no longer holds v101" in got[0]
    assert_bit_exact(got[1], _state(102))
    assert_bit_exact(got[2], _state(103))


def test_a_failed_rendezvous_on_the_trainer_side_reaches_the_engines_at_once(tmp_path, monkeypatch):
    """The trainer's side of a group set-up fails: both engines of the call raise its
    traceback within seconds (they would wait 30 minutes for rank 0), and the next call builds
    a new group and arrives exactly."""
    from trinity.sync import collective

    monkeypatch.setattr(collective, "_BROADCASTER", None)  # a broadcaster of this test's own
    real_group, failures = collective._group, []

    def group_failing_once(store, world, rank, backend, generation):
        if not failures:
            failures.append(generation)
            raise RuntimeError("injected rendezvous failure")
        return real_group(store, world, rank, backend, generation)

    monkeypatch.setattr(collective, "_group", group_failing_once)
    m = sync_method("nccl")
    payloads = [m.send(_state(v), v, tmp_path) for v in (1, 2)]
    t0 = time.monotonic()
    results = _run_engines(payloads, world=2)
    assert time.monotonic() - t0 < 90  # engine start-up included; the timeout is 1800 s
    for rank in (0, 1):
        first, second = results[rank]
        assert isinstance(first, str), rank
        assert "the trainer's side failed" in first and "injected rendezvous failure" in first
        assert "Traceback" in first  # the trainer's traceback, not only its message
        assert_bit_exact(second, _state(2))


def test_a_dead_broadcast_thread_reaches_the_engines_and_the_trainer(tmp_path, monkeypatch):
    """An error outside a broadcast ends the trainer's serving thread: the engines waiting for
    it, and those that come later, raise its traceback at once; the trainer's next send too."""
    from trinity.sync import collective

    monkeypatch.setattr(collective, "_BROADCASTER", None)
    real_drop = collective._Broadcaster._drop_discarded

    def drop_failing_in_the_thread(self, store):
        if threading.current_thread().name == "trinity-weight-broadcast":
            raise RuntimeError("injected failure in the serving thread")
        return real_drop(self, store)

    monkeypatch.setattr(collective._Broadcaster, "_drop_discarded", drop_failing_in_the_thread)
    m = sync_method("nccl")
    payload = m.send(_state(1), 1, tmp_path)
    for _ in range(2):  # the engines of the call it died on, then engines of a later call
        t0 = time.monotonic()
        got = _run_engines([payload], world=2)
        assert time.monotonic() - t0 < 90
        for rank in (0, 1):
            assert isinstance(got[rank][0], str), rank
            assert "injected failure in the serving thread" in got[rank][0]
    with pytest.raises(RuntimeError, match=r"(?s)thread of this trainer died.*injected failure"):
        m.send(_state(2), 2, tmp_path)


def test_payload_is_small_and_names_the_store(tmp_path):
    from trinity.sync.fingerprint import split

    payload, stamp = split(sync_method("nccl").send(_state(7), 7, tmp_path))
    assert len(payload) == 1 and payload[0]["version"] == 7 and payload[0]["port"] > 0
    assert stamp is not None and stamp.version == 7 and len(stamp.hashes) == len(_state(7))
    assert not list(Path(tmp_path).iterdir())  # nothing written to disk


def test_the_store_listens_only_on_the_address_the_engines_use(tmp_path):
    """Not on every interface (TCPStore's own socket binds 0.0.0.0): here, without Ray, the
    loopback address the payload names."""
    payload = sync_method("nccl").send(_state(3), 3, tmp_path)
    assert _listening_on(payload[0]["port"]) == [payload[0]["host"]] == ["127.0.0.1"]


def _listening_on(port: int) -> list[str]:
    """The IPv4 addresses with a socket listening on `port` (from /proc/net/tcp: state 0A), and
    "any" for an IPv6 socket on it (which takes every interface)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state != "0A" or int(hex_port, 16) != port:
                continue
            if table.endswith("6"):
                found.append("any")
            else:
                found.append(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="sync-methods")
    yield
    ray.shutdown()


@pytest.mark.parametrize("method", ["memory", "checkpoint", "nccl"])
def test_every_method_moves_weights_bit_exactly(method, tmp_path, ray_local):
    """The same check for the three methods, engines in Ray actors as in a run."""
    import ray

    @ray.remote(num_cpus=0)
    class Engine:
        def load(self, payload, rank, world, call):
            torch.set_num_threads(1)
            got = sync_method(method).receive(payload, Peers(rank, world, call))
            return {k: v.clone() for k, v in got.items()}

    state = _state(11)
    sent = {k: v.clone() for k, v in state.items()}
    payload = sync_method(method).send(state, 1, tmp_path / "sync")
    state["embed.weight"].add_(1.0)  # the trainer trains on: a payload is a snapshot
    engines = [Engine.remote() for _ in range(2)]
    call = uuid.uuid4().hex
    got = ray.get([e.load.remote(payload, i, 2, call) for i, e in enumerate(engines)])
    for g in got:  # every dtype arrives as itself (bfloat16 too, numpy has none)
        assert_bit_exact(g, sent)
