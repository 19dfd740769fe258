"""`sync_method: nccl`: weights broadcast from the trainer to every engine over a process group.

NCCL when the trainer's weights are on a GPU, gloo (the same code) when they are on the CPU, so the
method runs, and is tested, on a CPU machine too. As in Trinity-RFT it needs the trainer and the
engines in one run (`mode: both`); `resolve()` sends weights by `checkpoint` in the split modes,
and the launcher by `memory` when trainer and engines share a GPU (NCCL cannot put two ranks on
one device; `ResourcePlan.gpu_shared`).

How a sync goes (the trainer never waits for the explorer, and no weight bytes pass through Ray):

* `send` (trainer process) packs the weights into flat byte buckets, a snapshot the trainer may
  train past, and hands them to the process's `_Broadcaster`. On first use it starts a
  `TCPStore` and a thread that serves broadcasts. The payload is only the store's address, the
  version and the tensors' layout (name, dtype, shape).
* `receive` (each engine, all of one explorer's engines at once, as one call with its own id):
  each engine registers its process id under the call; engine 0 queues a request (call, version,
  world size) under the store's request counter; every engine waits for the trainer's go-ahead
  for the call, then joins the broadcast and unpacks the buckets: the bytes are bit-exact.
* The trainer's thread serves requests in order. A group of `world + 1` members (trainer rank 0)
  is kept while the same engine processes call; other processes (an engine restarted, a new
  explorer) or a failed broadcast make the next call build a new group under a new name. A
  request for a version the trainer no longer holds gets an error the engines raise.
* `discard` (synchronizer process) posts `discard/<version>`; the trainer drops that snapshot at
  its next `send` or served request.

Buffers are reused on the CPU: the trainer packs the next snapshot into the last discarded one of
the same layout, and an engine receives into the buckets of its previous call (it has copied them
into its weights since). Fresh CPU memory costs a page fault per page on first write, which made
the two allocations most of a sync's time (docs/benchmarks.md, "Async modes and weight sync"; on
a GPU the caching allocator already reuses memory, so there is nothing to keep).

Failures reach both sides at once instead of a 30-minute timeout. A failed group set-up or
broadcast on the trainer's side posts `abort/<call>` with its traceback: the engines of that call
(which run their side of the collective in a thread and watch for it) raise it, and the next call
builds a new group. Any other error ends the serving thread: its traceback goes to `broken` in the
store, so every engine waiting for a go-ahead (now or later) raises it, and the trainer's next
`send` raises it too.

One explorer at a time, as upstream: two explorers' calls would each need a group of their own.
"""

from __future__ import annotations

import datetime
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trinity.sync.method import SYNC_METHOD, Peers

BUCKET_BYTES = 256 << 20  # one broadcast moves at most this many bytes
ALIGN = 16  # every tensor starts at a multiple of this many bytes in its bucket
TIMEOUT = datetime.timedelta(minutes=30)  # a member that never joins a group or a broadcast
POLL = datetime.timedelta(seconds=1)  # how often an engine that waits looks for a failure
BROKEN = "broken"  # store key: the serving thread died; its traceback


@dataclass(frozen=True)
class Layout:
    """Where each tensor lies in the flat byte buckets: (name, dtype, shape, bucket, start)."""

    entries: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    bucket_sizes: tuple[int, ...]

    @staticmethod
    def of(state: dict[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> Layout:
        entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
        sizes: list[int] = []
        used = 0
        for name, t in state.items():
            n = t.numel() * t.element_size()
            used = -(-used // ALIGN) * ALIGN  # a view as int64 or float64 needs aligned bytes
            if not sizes or (used > 0 and used + n > bucket_bytes):
                sizes.append(0)
                used = 0
            entries.append(
                (name, str(t.dtype).removeprefix("torch."), tuple(t.shape), len(sizes) - 1, used)
            )
            used += n
            sizes[-1] = used
        return Layout(tuple(entries), tuple(sizes))


def pack(
    state: dict[str, torch.Tensor],
    layout: Layout,
    device: torch.device,
    into: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Copy the tensors' bytes into uint8 buckets on `device` (a snapshot): `into` (buckets of
    this layout that nobody reads any more) or fresh ones."""
    buckets = into if into is not None else _buckets(layout, device)
    for (_, _, _, b, start), t in zip(layout.entries, state.values(), strict=True):
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        buckets[b][start : start + flat.numel()].copy_(flat)
    return buckets


def _buckets(layout: Layout, device: torch.device | None) -> list[torch.Tensor]:
    return [torch.empty(n, dtype=torch.uint8, device=device) for n in layout.bucket_sizes]


def _fits(buckets: list[torch.Tensor] | None, layout: Layout, device: torch.device | None) -> bool:
    """Can `buckets` hold `layout` on `device` (CPU only: see the module's docstring)?"""
    return (
        buckets is not None
        and (device is None or device.type == "cpu")
        and all(b.device.type == "cpu" for b in buckets)
        and tuple(b.numel() for b in buckets) == layout.bucket_sizes
    )


def unpack(buckets: list[torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """The name -> tensor dict the buckets hold (views into them; the caller owns the buckets)."""
    out = {}
    for name, dtype, shape, b, start in layout.entries:
        dt = getattr(torch, dtype)
        n = dt.itemsize * _numel(shape)
        out[name] = buckets[b][start : start + n].view(dt).reshape(shape)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # no Ray here (a unit test): the loopback address serves this machine
        pass
    return "127.0.0.1"


def _group(store: Any, world: int, rank: int, backend: str, generation: int) -> Any:
    """A process group of `world` members outside torch's default group (the trainer may own that)."""
    prefixed = dist.PrefixStore(f"trinity_weight_sync/{generation}", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefixed, rank, world, dist.ProcessGroupNCCL.Options())
    return dist.ProcessGroupGloo(prefixed, rank, world, TIMEOUT)


def _broadcast(group: Any, buckets: list[torch.Tensor]) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    for bucket in buckets:
        group.broadcast([bucket], opts).wait()


class _Broadcaster:
    """The trainer process's half: holds snapshots by version and serves broadcast requests.

    The serving thread has its own store connection: a connection serialises its calls, and the
    thread spends its idle time blocked in `wait`.
    """

    def __init__(self) -> None:
        self.host = _node_ip()
        # listening on the node's own address alone (TCPStore's own socket takes every
        # interface): the engines reach it there, and nothing else on the network does
        self._listener = socket.create_server((self.host, 0))
        self.port = self._listener.getsockname()[1]
        self.store = dist.TCPStore(
            self.host, self.port, is_master=True, wait_for_workers=False, timeout=TIMEOUT,
            master_listen_fd=self._listener.fileno(),
        )  # fmt: skip
        self.snapshots: dict[int, list[torch.Tensor]] = {}
        self.spare: list[torch.Tensor] | None = None  # the last discarded snapshot, for reuse
        self.lock = threading.Lock()
        self.error: str | None = None  # the serving thread's traceback, once it died
        threading.Thread(target=self._serve, name="trinity-weight-broadcast", daemon=True).start()

    def raise_if_broken(self) -> None:
        """Raise the serving thread's error, if it died (the trainer's side of the report)."""
        with self.lock:
            error = self.error
        if error is not None:
            raise RuntimeError(f"the weight-broadcast thread of this trainer died:\n{error}")

    def reusable(self, layout: Layout, device: torch.device) -> list[torch.Tensor] | None:
        """A discarded snapshot to pack the next one into, if one fits `layout` on `device`."""
        self._drop_discarded(self.store)
        with self.lock:
            spare, self.spare = self.spare, None
        return spare if _fits(spare, layout, device) else None

    def hold(self, version: int, buckets: list[torch.Tensor]) -> None:
        with self.lock:
            self.snapshots[version] = buckets

    def _serve(self) -> None:
        """Serve broadcast requests for the life of the process; an error that ends it is
        reported (module docstring) instead of leaving every later sync to time out."""
        store: Any = None
        state: dict[str, str | None] = {"call": None}  # the call being served, if any
        try:
            store = dist.TCPStore(self.host, self.port, is_master=False, timeout=TIMEOUT)
            self._serve_requests(store, state)
        except BaseException:
            error = traceback.format_exc()
            with self.lock:
                self.error = error
            print(f"trinity weight broadcast: serving thread died:\n{error}", file=sys.stderr)
            report = store if store is not None else self.store
            report.set(BROKEN, error)
            if state["call"] is not None:  # the engines of the call in progress
                report.set(f"go/{state['call']}", f"error:the trainer failed:\n{error}")

    def _serve_requests(self, store: Any, state: dict[str, str | None]) -> None:
        group, members, generation = None, None, 0
        answered: list[str] = []
        k = 1
        while True:
            key = f"request/{k}"
            try:
                store.wait([key])
            except dist.DistStoreError:  # nobody asked for TIMEOUT: keep serving
                continue
            call, version, world = store.get(key).decode().split(":")
            state["call"] = call
            version, world = int(version), int(world)
            self._drop_discarded(store)
            with self.lock:
                buckets = self.snapshots.get(version)
            # the engines of this call, by their process ids: another set needs another group
            joined = tuple(store.get(f"member/{call}/{r}").decode() for r in range(world))
            if buckets is None:
                held = sorted(self.snapshots)
                store.set(
                    f"go/{call}", f"error:the trainer no longer holds v{version} (holds {held})"
                )
            else:
                backend = "nccl" if buckets and buckets[0].is_cuda else "gloo"
                if joined != members:
                    group, members, generation = None, joined, generation + 1
                store.set(f"go/{call}", f"ok:{backend}:{generation}")
                try:
                    if group is None:
                        group = _group(store, world + 1, 0, backend, generation)
                    _broadcast(group, buckets)
                except Exception:  # the group is spent: the next call builds a new one
                    group, members = None, None
                    error = traceback.format_exc()
                    print(f"trinity weight broadcast v{version}: {error}", file=sys.stderr)
                    store.set(f"abort/{call}", error)  # the engines of this call raise it
            state["call"] = None
            store.delete_key(key)
            for r in range(world):
                store.delete_key(f"member/{call}/{r}")
            answered.append(call)
            if len(answered) > 2:  # every engine has read it by now: it joined a later call
                old = answered.pop(0)
                store.delete_key(f"go/{old}")
                store.delete_key(f"abort/{old}")
            k += 1

    def _drop_discarded(self, store: Any) -> None:
        with self.lock:
            for v in list(self.snapshots):
                if store.check([f"discard/{v}"]):
                    self.spare = self.snapshots.pop(v)
                    store.delete_key(f"discard/{v}")


class _Receiver:
    """An engine process's half for one trainer store: its identity and its current group."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.store = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
        # a second connection to look for failures while the collective's set-up blocks in a
        # `wait` on the first (a connection serialises its calls)
        self.watch = dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT)
        self.uid = uuid.uuid4().hex
        self.group: tuple[int, Any] | None = None  # (generation, group)
        self.buckets: list[torch.Tensor] | None = None  # the last call's, copied out since

    def receive(self, version: int, layout: Layout, peers: Peers) -> list[torch.Tensor]:
        call = peers.call
        self.store.set(f"member/{call}/{peers.rank}", self.uid)
        if peers.rank == 0:
            index = self.store.add("requests", 1)
            self.store.set(f"request/{index}", f"{call}:{version}:{peers.world}")
        self._wait_for_go(call, version)
        status, _, detail = self.store.get(f"go/{call}").decode().partition(":")
        if status != "ok":
            raise RuntimeError(f"weight broadcast v{version}: {detail}")
        backend, generation = detail.split(":")[0], int(detail.split(":")[1])
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        fits = _fits(self.buckets, layout, device)
        buckets = self.buckets if fits and self.buckets is not None else _buckets(layout, device)
        self.buckets = buckets if device is None else None

        def join_and_broadcast() -> None:
            if self.group is None or self.group[0] != generation:
                group = _group(self.store, peers.world + 1, peers.rank + 1, backend, generation)
                self.group = (generation, group)
            _broadcast(self.group[1], buckets)

        try:
            self._watched(join_and_broadcast, call, version)
        except BaseException:
            # the group is spent; the buckets and the store connection may still be in use by
            # a thread left waiting (an abort): the next call starts from fresh ones
            self.group, self.buckets = None, None
            self.store = dist.TCPStore(*self.address, is_master=False, timeout=TIMEOUT)
            raise
        return buckets

    def _wait_for_go(self, call: str, version: int) -> None:
        """Wait for the trainer's answer to `call`, in slices, raising its thread's death."""
        deadline = time.monotonic() + TIMEOUT.total_seconds()
        while True:
            try:
                self.store.wait([f"go/{call}"], POLL)
                return
            except dist.DistStoreError:  # a slice passed with no answer
                if self.store.check([BROKEN]):
                    raise RuntimeError(
                        f"weight broadcast v{version}: the trainer's broadcast thread died:\n"
                        + self.store.get(BROKEN).decode()
                    ) from None
                if time.monotonic() > deadline:
                    raise

    def _watched(self, fn: Any, call: str, version: int) -> None:
        """Run `fn` (this engine's side of the collective) in a thread, raising at once when the
        trainer aborts the call (its side failed: `fn` would wait out TIMEOUT) or its serving
        thread dies. On an abort the thread is left to time out; the group is not reused."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                fn()
            except BaseException as e:
                errors.append(e)

        worker = threading.Thread(target=run, name="trinity-weight-receive", daemon=True)
        worker.start()
        while True:
            worker.join(POLL.total_seconds())
            if not worker.is_alive():
                break
            for key in (f"abort/{call}", BROKEN):
                if self.watch.check([key]):
                    raise RuntimeError(
                        f"weight broadcast v{version}: the trainer's side failed:\n"
                        + self.watch.get(key).decode()
                    )
        if errors:
            raise errors[0]


_BROADCASTER: _Broadcaster | None = None
_RECEIVERS: dict[tuple[str, int], _Receiver] = {}
_SETUP = threading.Lock()


@SYNC_METHOD.register("nccl")
class CollectiveSync:
    hands_over = False  # an engine receives the next version into the same buckets: copy out
    live = False

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        global _BROADCASTER
        with _SETUP:
            if _BROADCASTER is None:
                _BROADCASTER = _Broadcaster()
        _BROADCASTER.raise_if_broken()
        layout = Layout.of(state)
        device = next(iter(state.values())).device if state else torch.device("cpu")
        reused = _BROADCASTER.reusable(layout, device)
        _BROADCASTER.hold(version, pack(state, layout, device, into=reused))
        return [
            {
                "host": _BROADCASTER.host,
                "port": _BROADCASTER.port,
                "version": version,
                "layout": layout,
            }
        ]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        p = payload[0]
        with _SETUP:
            key = (p["host"], p["port"])
            if key not in _RECEIVERS:
                _RECEIVERS[key] = _Receiver(*key)
            receiver = _RECEIVERS[key]
        buckets = receiver.receive(p["version"], p["layout"], peers or Peers())
        return unpack(buckets, p["layout"])

    def discard(self, payload: list[Any]) -> None:
        p = payload[0]
        with _SETUP:
            key = (p["host"], p["port"])
            if key not in _RECEIVERS:
                _RECEIVERS[key] = _Receiver(*key)
            store = _RECEIVERS[key].store
        store.set(f"discard/{p['version']}", "1")
