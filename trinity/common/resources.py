"""How a stage's compute actors share the machine: what each reserves from Ray, and its threads.

The trainer and the rollout engines are the actors that compute; the explorer, buffer,
synchronizer and metrics hub wait on them and reserve nothing.

CPU. Cores are those Ray has free when the stage starts. Engines and a trainer that exist
together reserve half each (the engines split theirs); alone, one side reserves them all. A run
split over processes (`mode: explore` / `mode: train` from a queue, any number of explorers)
cannot know which process starts first, and a reservation made on a count the other process
has not yet taken could wait forever; each process there plans for half the cluster's cores and
reserves no CPU. Torch threads follow the reservation, except in
lockstep: on-policy `mode: both` (`sync_interval: 1`, `sync_offset: 0`) alternates strictly,
explore step k waiting for train step k-1's weights and train step k for explore step k's
experiences, and in a train stage the engines only evaluate before or after training; there,
each side runs alone and uses every free core. `trainer.num_threads` and
`explorer.rollout_model.num_threads` override the threads of their actor.

GPU. GPUs are those Ray has free, at most `cluster.gpu_per_node`. The trainer uses one device;
with one GPU for the trainer and one per engine each gets a whole one, with fewer they share
them in equal fractions (Ray makes a fractional GPU visible to the actor, which then runs on
it; `_gpu_shares`). No GPU: everything runs on CPU. Sharing puts two of them on one device,
where NCCL cannot run a group: `sync_method: nccl` then sends weights by `memory`
(`ResourcePlan.gpu_shared`, the launcher).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Share:
    num_cpus: float  # reserved from Ray
    num_gpus: float  # reserved from Ray; > 0 makes a GPU visible to the actor
    threads: int  # torch threads while it runs


@dataclass(frozen=True)
class ResourcePlan:
    trainer: Share | None
    engine: Share | None  # each of the engines

    def gpu_shared(self) -> bool:
        """Whether trainer and engines run on GPUs and some of them share one: their fractions
        mean fewer GPUs than members, so at least two sit on one device (a collective such as
        NCCL cannot have two ranks there)."""
        return (
            self.trainer is not None
            and self.engine is not None
            and 0 < min(self.trainer.num_gpus, self.engine.num_gpus) < 1
        )

    def describe(self) -> str:
        parts = []
        for name, s in (("trainer", self.trainer), ("each engine", self.engine)):
            if s is not None:
                gpu = f", {s.num_gpus:g} GPU" if s.num_gpus else ""
                parts.append(f"{name} {s.num_cpus:g} CPU{gpu} ({s.threads} threads)")
        return "resources: " + "; ".join(parts)


def plan_resources(
    cpus: float,
    gpus: float,
    trainer: bool,
    engines: int,
    lockstep: bool,
    trainer_threads: int | None = None,
    engine_threads: int | None = None,
    reserve_cpus: bool = True,
) -> ResourcePlan:
    """Each compute actor's share of `cpus` free cores and `gpus` free GPUs (module docstring).

    `engines` is the number of rollout engines (0 when the stage has none), `lockstep` whether
    trainer and engines never run at the same time, `reserve_cpus` False for a process of a
    split run (its threads still follow the plan).
    """
    if not trainer and engines == 0:
        return ResourcePlan(None, None)
    cores = max(0.0, float(cpus))
    both = trainer and engines > 0
    trainer_cpus = cores / 2 if both else cores
    engine_cpus = (cores - trainer_cpus if trainer else cores) / engines if engines else 0.0

    def threads(reserved: float, alone: float, explicit: int | None) -> int:
        if explicit is not None:
            return explicit
        return max(1, int(alone if lockstep else reserved))

    t_gpu, e_gpu = _gpu_shares(gpus, trainer, engines)
    plan_trainer = plan_engine = None
    keep = 1.0 if reserve_cpus else 0.0
    if trainer:
        plan_trainer = Share(
            _round(keep * trainer_cpus), t_gpu, threads(trainer_cpus, cores, trainer_threads)
        )
    if engines:
        plan_engine = Share(
            _round(keep * engine_cpus),
            e_gpu,
            threads(engine_cpus, cores / engines, engine_threads),
        )
    return ResourcePlan(plan_trainer, plan_engine)


def _gpu_shares(gpus: float, trainer: bool, engines: int) -> tuple[float, float]:
    """(trainer's, each engine's) GPUs: whole ones when there are enough, else equal fractions.

    Ray places a fraction below 1 on one GPU, so with several GPUs the fraction is 1 / (members
    per GPU, rounded up): 3 members on 2 GPUs get 0.5 each (two on one, one on the other), not
    0.6667, of which no GPU holds two and the third would wait forever. Fewer than one GPU (a
    process of a split run plans for half the cluster): that part split in equal fractions.
    """
    users = int(trainer) + engines
    if gpus <= 0 or users == 0:
        return 0.0, 0.0
    if gpus >= users:
        each = 1.0
    elif gpus >= 1:
        each = _round(1.0 / math.ceil(users / math.floor(gpus)))
    else:
        each = _round(gpus / users)
    return (each if trainer else 0.0), (each if engines else 0.0)


def _round(x: float) -> float:
    """Ray takes resource requests in units of 1/10000."""
    return float(int(x * 10000) / 10000)
