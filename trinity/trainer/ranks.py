"""A sharded trainer: its ranks as Ray actors in one placement group, driven through the
`Trainer`'s own interface (`ShardedTrainer`), so the trainer's loop (`runner.py`) drives one
process and many alike.

    trainer: {trainer_strategy: fsdp2, world_size: 2}

1. a placement group of `world_size` bundles (each rank's cores, and one GPU on GPUs): packed on
   one node, or spread over the run's nodes (`cluster.node_num` > 1: one rank per node when
   there are as many nodes as ranks, `STRICT_SPREAD`), one process per rank;
2. rank 0 picks a rendezvous address; every rank joins one process group (gloo on CPU, NCCL on
   CUDA), and with `trainer.ulysses_sequence_parallel_size` > 1 its sequence-parallel group
   (`sharding.sequence_groups`), and builds its `Trainer` with its place (`parallel.Ranks`):
   rank 0 reads the weights, the others receive their shards (`sharding.build_sharded`);
3. each call (plan, train step, checkpoint, resume, publish) goes to every rank at once, with
   the same arguments (a train batch is put in the object store once): the ranks meet in their
   collectives; rank 0's answer is the answer.

The plan (which rank on which node, its cores and GPUs) is printed when the ranks are up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trinity.common import refs

PLACEMENT_TIMEOUT_S = 120.0  # waiting for the ranks' placement group: then it fails by name


class TrainerRank:
    """One rank of a sharded trainer (a Ray actor): a `Trainer` on its shards."""

    def __init__(self, rank: int, world: int, sp: int = 1) -> None:
        from trinity.trainer.parallel import Ranks

        self.ranks = Ranks(rank, world, sp)
        self.trainer: Any = None

    def address(self) -> tuple[str, int]:
        """Where the process group meets (asked of rank 0)."""
        from trinity.trainer.sharding import free_address

        return free_address()

    def build(
        self,
        address: tuple[str, int],
        config: Any,
        model_path: str,
        total_steps: int | None,
        num_threads: int | None,
    ) -> dict[str, Any]:
        """Join the process group and build this rank's trainer; returns where it runs."""
        from trinity.trainer.sharding import init_process_group, sequence_groups
        from trinity.trainer.trainer import Trainer

        device = init_process_group(self.ranks, address)
        self.ranks = sequence_groups(self.ranks)
        self.trainer = Trainer(config, model_path, total_steps, num_threads, ranks=self.ranks)
        import torch

        return {
            "rank": self.ranks.rank,
            "node": ray.get_runtime_context().get_node_id(),
            "device": device,
            "threads": torch.get_num_threads(),
            "full_sync_nbytes": self.trainer.full_sync_nbytes,
        }

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`Trainer.<method>(*args, **kwargs)` on this rank."""
        return getattr(self.trainer, method)(*args, **kwargs)

    def publish(self, method: str, step: int, sync_dir: str) -> tuple[int, list[Any]]:
        """Gather the weights (every rank) and publish them with sync method `method` (rank 0):
        (bytes sent, the payload; rank 0's)."""
        from trinity.sync.method import state_nbytes, sync_method

        state = self.trainer.sync_state()
        if self.ranks.rank != 0:
            return 0, []
        return state_nbytes(state), sync_method(method).send(state, step, Path(sync_dir))


class ShardedTrainer:
    """The `Trainer` interface over `world` rank actors (module docstring)."""

    def __init__(
        self,
        config: Any,
        model_path: str,
        total_steps: int | None,
        world: int,
        num_threads: int | None,
        num_cpus: float,
        num_gpus: float,
        nodes: list[str] | None = None,
    ) -> None:
        """`num_threads`, `num_cpus`, `num_gpus`: each rank's; `nodes`: the run's nodes (ranks
        spread over them), or none (packed)."""
        from trinity.algorithm import resolve_algorithm
        from trinity.models import load_tokenizer, resolve_model_path
        from trinity.trainer.parallel import Ranks

        self.world = world
        # ranks per sequence (`trinity.trainer.sequence_parallel`); Ranks refuses one that does
        # not divide the world, before any rank starts
        self.sp = Ranks(0, world, config.trainer.ulysses_sequence_parallel_size).sp
        self.failed: str | None = None  # why the ranks were stopped
        self.closed = False
        # 1.
        bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        strategy = "PACK"  # one node: the bundles together
        if nodes and len(nodes) > 1:  # one rank per node while there are nodes enough
            strategy = "STRICT_SPREAD" if world <= len(nodes) else "SPREAD"
        self.group = placement_group([dict(bundle) for _ in range(world)], strategy=strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(self.group)
            raise RuntimeError(
                f"trainer.world_size={world}: no room for {world} ranks of {bundle} each "
                f"({strategy}) after {PLACEMENT_TIMEOUT_S:.0f} s; the cluster has "
                f"{ray.available_resources()} free (lower trainer.world_size, or add nodes)"
            )
        actor = ray.remote(TrainerRank)
        self.ranks = [
            actor.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i
                ),
            ).remote(i, world, self.sp)
            for i in range(world)
        ]
        # 2.
        address = refs.get(self.ranks[0].address.remote())
        self.placed = self._gather(
            [
                r.build.remote(address, config, model_path, total_steps, num_threads)
                for r in self.ranks
            ]
        )
        # with LoRA: bytes a full-weights sync would move (`sync/full_bytes`)
        self.full_sync_nbytes = self.placed[0]["full_sync_nbytes"]
        self.algo = resolve_algorithm(config.algorithm)
        self.tokenizer = load_tokenizer(
            resolve_model_path(model_path), custom_chat_template=config.model.custom_chat_template
        )

    def describe(self) -> str:
        """One line: each rank's node, device and threads."""
        ranks = "; ".join(
            f"rank {p['rank']} on node {p['node'][:12]} ({p['device']}, {p['threads']} threads)"
            for p in self.placed
        )
        dp = self.world // self.sp
        groups = f"{dp} data-parallel group{'s' if dp > 1 else ''} of {self.sp} ranks"
        sp = f" ({groups}, each sequence split over a group)" if self.sp > 1 else ""
        return f"trainer: fsdp2 over {self.world} ranks{sp}: {ranks}"

    # 3.
    def _all(self, method: str, *args: Any) -> Any:
        return self._gather([r.call.remote(method, *args) for r in self.ranks])[0]

    def _gather(self, calls: list[Any]) -> list[Any]:
        """Every rank's answer, once every rank answered. A rank that fails leaves the others
        waiting in a collective (until the process group's timeout): the first failure stops
        every rank at once and is raised."""
        if self.failed is not None:
            raise RuntimeError(f"the trainer's ranks were stopped: {self.failed}")
        pending = list(calls)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                refs.get(ready[0])
            except BaseException as e:
                self.failed = f"rank {calls.index(ready[0])} failed: {type(e).__name__}"
                self.close()
                raise
        return refs.get(calls)

    def plan(self, total_steps: int | None) -> None:
        self._all("plan", total_steps)

    def train_step(self, experiences: list[Any]) -> dict[str, float]:
        return self._all("train_step", ray.put(experiences))

    def save_checkpoint(
        self,
        root: Path,
        step: int,
        extra: dict[str, Any] | None = None,
        leases: list[int] | None = None,
    ) -> Path:
        return self._all("save_checkpoint", root, step, extra, leases)

    def resume(self, checkpoint: Path) -> dict[str, Any]:
        return self._all("resume", checkpoint)

    def release_training_state(self) -> None:
        self._all("release_training_state")

    def place(self, on_device: bool) -> int:
        """Every rank's shards on its device or in host memory (colocation); bytes moved, summed."""
        calls = [r.call.remote("place", on_device) for r in self.ranks]
        return sum(self._gather(calls))

    def publish(self, method: str, step: int, sync_dir: Path) -> tuple[int, list[Any]]:
        """(bytes sent, payload) of the weights of `step` (`TrainerRank.publish`)."""
        return self._gather([r.publish.remote(method, step, str(sync_dir)) for r in self.ranks])[0]

    def close(self) -> None:
        """Stop the ranks and free their placement group (once)."""
        if self.closed:
            return
        self.closed = True
        for r in self.ranks:
            ray.kill(r)
        remove_placement_group(self.group)
