"""A tensor-parallel rollout engine: `tensor_parallel_size` processes that sample as one engine.

    explorer.rollout_model: {engine_type: transformers, engine_num: 2, tensor_parallel_size: 2}

Each engine is t Ray actors in a placement group of its own (t bundles packed on one node: on
GPUs one GPU each, on CPUs the engine's cores divided between them), each an `HFRolloutEngine`
that holds its slices of the decoder layers (`models.tensor_parallel`: PyTorch's
`parallelize_module`) in one process group, gloo on CPUs and NCCL on GPUs. Rank 0
(`TensorParallelEngine`) is the engine the explorer holds, with the `RolloutEngine` interface
unchanged for its callers. It starts ranks 1..t-1 (`EngineRank`: actors it owns, which end with
it) and drives them in lockstep:

1. each call (generate, generate_stream, logprobs, update_weights, set_num_threads) goes to every
   other rank with the same arguments while rank 0 runs it on its compute lane;
2. the ranks meet in each forward's collectives, and at each decode step every rank continues
   with the tokens rank 0 sampled (`TensorParallel.agree`), so their batches never part;
3. rank 0's answer is the engine's; the other ranks return nothing.

Weights: every rank receives the payload itself with the run's sync method (memory: from the
object store; checkpoint: from the file; nccl: each rank is a member of the trainer's broadcast,
as in Trinity-RFT's group of engine_num × tensor_parallel_size + 1) and keeps its slices of the
full tensors (`TensorParallel.shard`): no weights pass between the ranks.

Failures. A rank that fails leaves the others waiting in a collective until the group's timeout,
so rank 0 watches the other ranks' calls while its own part runs (`_gather`) and raises the first
failure at once, naming the rank. A failure of every rank alike (a payload that does not match
the model) leaves the ranks in step and the engine usable; a failure of some ranks leaves the
engine failed, and every later call raises that first error. A rank whose process died ends rank
0's process too, so Ray restarts the whole engine (`max_restarts`: new ranks, a new group) and
the explorer reloads its weights into it, as after a one-process engine's crash.
"""

from __future__ import annotations

import inspect
import os
import queue
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trinity.common.compute import ComputeLane
from trinity.common.process_group import free_address
from trinity.common.rollout import BadPrompt, Peers, Progress, SamplingParams
from trinity.models.tensor_parallel import TPPlace

POLL_S = 0.5  # how often rank 0 looks at the other ranks' calls while its own part runs
SETTLE_S = 10.0  # after a rank's failure: how long the others have to fail alike
_END = object()


def _placed(engine: Any, rank: int) -> dict[str, Any]:
    """Where a rank runs: its node, process id, device and threads (`describe`)."""
    import torch

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    threads = torch.get_num_threads()
    return {
        "rank": rank,
        "node": node,
        "pid": os.getpid(),
        "device": engine.device,
        "threads": threads,
    }


def _finish(out: Any) -> None:
    """Run a generator method's answer to its end (a rank's `generate_stream`)."""
    if inspect.isgenerator(out):
        for _ in out:
            pass


class EngineRank:
    """Rank r ≥ 1 of a tensor-parallel engine (a Ray actor that rank 0 owns): its
    `HFRolloutEngine` runs the calls rank 0 forwards, in the order they come."""

    def __init__(self, model_path: str, place: TPPlace, kwargs: dict[str, Any]) -> None:
        from trinity.explorer.engine import HFRolloutEngine

        self.rank = place.rank
        self.engine = HFRolloutEngine(model_path, tensor_parallel=place, **kwargs)

    def placed(self) -> dict[str, Any]:
        return _placed(self.engine, self.rank)

    def run(self, method: str, args: tuple[Any, ...]) -> None:
        """`engine.<method>(*args)` to its end; the answer is rank 0's."""
        _finish(getattr(self.engine, method)(*args))


class TensorParallelEngine:
    """Rank 0 of a tensor-parallel engine, the engine its callers hold (module docstring)."""

    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int,
        placement_group: Any = None,
        rank_cpus: float = 0.0,
        rank_gpus: float = 0.0,
        **kwargs: Any,
    ) -> None:
        """`placement_group`: the engine's, with one bundle per rank (this actor in bundle 0);
        None: ranks wherever Ray puts them. `rank_cpus`, `rank_gpus`: what each other rank
        reserves. `kwargs`: each rank's `HFRolloutEngine` arguments (seed, threads, ...).

        1. a rendezvous address on this node; 2. ranks 1..t-1 started in their bundles;
        3. every rank joins the group and builds its engine, this one on its compute lane."""
        from trinity.explorer.engine import HFRolloutEngine

        t = self.world = tensor_parallel_size
        self.failed: str | None = None  # the first failure that left the ranks out of step
        self.engine: Any = None
        # 1.
        address = free_address()
        # 2.
        rank_cls = ray.remote(EngineRank)
        self.ranks = [
            rank_cls.options(
                num_cpus=rank_cpus,
                num_gpus=rank_gpus,
                max_restarts=0,  # a rank alone cannot rejoin a group: the engine restarts whole
                **_in_bundle(placement_group, r),
            ).remote(model_path, TPPlace(r, t, address), kwargs)
            for r in range(1, t)
        ]
        # 3.
        self.lane = ComputeLane("tp-rank0")
        build = self.lane.submit(
            HFRolloutEngine, model_path, tensor_parallel=TPPlace(0, t, address), **kwargs
        )
        refs = [r.placed.remote() for r in self.ranks]
        self.engine = self._gather(build, refs)
        self.placement = [self.lane.run(_placed, self.engine, 0), *ray.get(refs)]  # its threads
        print(self.describe(), flush=True)

    def describe(self) -> str:
        """One line: the engine's ranks, each with its node, device and threads."""
        ranks = "; ".join(
            f"rank {p['rank']} on node {p['node'][:12]} ({p['device']}, {p['threads']} threads)"
            for p in self.placement
        )
        return f"rollout engine: tensor-parallel over {self.world} ranks: {ranks}"

    def ranks_placed(self) -> list[dict[str, Any]]:
        """Each rank's node, process id, device and threads, rank 0 first."""
        return [dict(p) for p in self.placement]

    # -- the RolloutEngine contract, in lockstep -----------------------------------------------

    @property
    def model_version(self) -> int:
        return int(self.engine.model_version)

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
    ) -> list[list[Any] | BadPrompt]:
        return self._lockstep("generate", [(prompts, params, keys)] * self.world)

    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        watch: list[bool] | None = None,
    ) -> Iterator[Progress | list[list[Any] | BadPrompt]]:
        args = [(prompts, params, keys, watch)] * self.world
        yield from self._lockstep_stream("generate_stream", args)

    def logprobs(self, tokens: list[int]) -> list[float]:
        return self._lockstep("logprobs", [(tokens,)] * self.world)

    def update_weights(
        self, method: str, payload: list[Any], version: int, peers: Peers | None = None
    ) -> int:
        """Every rank loads the payload itself: with a collective method each rank is a member
        of the broadcast, rank r of engine i being member i·t + r of engines·t."""
        peers = peers or Peers()
        t = self.world
        args = [
            (method, payload, version, Peers(peers.rank * t + r, peers.world * t, peers.call))
            for r in range(t)
        ]
        return self._lockstep("update_weights", args)

    def set_num_threads(self, num_threads: int) -> None:
        """The engine's threads, divided between its ranks (at least one each)."""
        each = max(1, num_threads // self.world)
        self._lockstep("set_num_threads", [(each,)] * self.world)

    def weights_version(self) -> int:
        return self.model_version

    def get_stats(self) -> dict[str, float]:
        return dict(self.engine.get_stats())

    def startup_marks(self) -> dict[str, float]:
        return dict(self.engine.startup_marks())

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.engine.chat_prompt_ids(messages)

    def decode(self, ids: list[int]) -> str:
        return self.engine.decode(ids)

    # -- lockstep --------------------------------------------------------------------------------

    def _lockstep(self, method: str, args: list[tuple[Any, ...]]) -> Any:
        """`engine.<method>(*args[r])` on every rank r at once; rank 0's answer."""
        self._raise_if_failed()
        refs = [rank.run.remote(method, a) for rank, a in zip(self.ranks, args[1:], strict=True)]
        own = self.lane.submit(getattr(self.engine, method), *args[0])
        return self._gather(own, refs)

    def _lockstep_stream(self, method: str, args: list[tuple[Any, ...]]) -> Iterator[Any]:
        """`_lockstep` of a generator method: rank 0's items as it makes them."""
        self._raise_if_failed()
        refs = [rank.run.remote(method, a) for rank, a in zip(self.ranks, args[1:], strict=True)]
        items: queue.Queue = queue.Queue()

        def produce() -> None:  # on the lane: every item, then the end
            try:
                for item in getattr(self.engine, method)(*args[0]):
                    items.put(item)
            finally:
                items.put(_END)

        own = self.lane.submit(produce)
        pending = list(refs)
        while True:
            try:
                item = items.get(timeout=POLL_S)
            except queue.Empty:
                pending = self._check_ready(refs, pending, own)
                continue
            if item is _END:
                break
            yield item
        self._gather(own, pending, refs)

    def _gather(self, own: futures.Future, refs: list[Any], every: list[Any] | None = None) -> Any:
        """Rank 0's result of `own` once the other ranks' calls still running (`refs`, of
        all of them: `every`) have ended; the first failure of any rank raised at once."""
        every = every if every is not None else refs
        pending = list(refs)
        while not own.done():
            futures.wait([own], timeout=POLL_S if pending else None)
            pending = self._check_ready(every, pending, own)
        if own.exception() is not None:
            self._failure(0, own.exception(), own, every)
        while pending:
            pending = self._check_ready(every, pending, own, block=True)
        return own.result()

    def _check_ready(
        self, every: list[Any], pending: list[Any], own: futures.Future, block: bool = False
    ) -> list[Any]:
        """`pending` less the calls that have ended (`block`: at least one); a failed one is
        raised (`_failure`)."""
        if not pending:
            return pending
        n, wait_s = (1, None) if block else (len(pending), 0)
        ready, left = ray.wait(pending, num_returns=n, timeout=wait_s)
        for ref in ready:
            try:
                ray.get(ref)
            except BaseException as e:  # rank r's error, or its death
                self._failure(every.index(ref) + 1, e, own, every)
        return left

    def _failure(
        self, rank: int, error: BaseException, own: futures.Future, every: list[Any]
    ) -> None:
        """Raise rank `rank`'s `error`. When every rank failed alike within `SETTLE_S` (none is
        left waiting in a collective) the engine stays usable and rank 0's error is raised;
        otherwise the engine is failed for good, and a rank's death ends this process so that
        Ray restarts the engine."""
        where = f"tensor-parallel rank {rank} of {self.world}"
        if self.engine is None:  # building: the engine never came up
            raise RuntimeError(f"{where} failed while the engine was built: {error}") from error
        if isinstance(error, RayActorError):
            print(f"{where} died, so rank 0 ends for Ray to restart the engine: {error}",
                  file=sys.stderr, flush=True)  # fmt: skip
            os._exit(1)
        deadline = time.monotonic() + SETTLE_S
        futures.wait([own], timeout=SETTLE_S)
        left_s = max(0.0, deadline - time.monotonic())
        ended, running = ray.wait(every, num_returns=len(every), timeout=left_s)
        own_error = own.exception() if own.done() else None
        if own_error is not None and not running and all(_raises(ref) for ref in ended):
            raise own_error
        self.failed = f"{where}: {type(error).__name__}: {error}"
        raise RuntimeError(f"{where} failed, and the engine with it: {error}") from error

    def _raise_if_failed(self) -> None:
        if self.failed is not None:
            raise RuntimeError(f"this tensor-parallel engine failed earlier ({self.failed})")


def _raises(ref: Any) -> bool:
    """Whether an ended rank call failed."""
    try:
        ray.get(ref)
    except BaseException:
        return True
    return False


def _in_bundle(group: Any, index: int) -> dict[str, Any]:
    """Ray options placing an actor in bundle `index` of `group` ({} without a group)."""
    if group is None:
        return {}
    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index
        )
    }
