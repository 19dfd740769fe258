"""How a stage's compute actors share the machine: what each reserves from Ray, and its threads.

The trainer and the rollout engines are the actors that compute; the explorer, buffer,
synchronizer and metrics hub wait on them and reserve nothing.

CPU. Cores are those Ray has free when the stage starts. Engines and a trainer that exist
together reserve half each (the engines split theirs); alone, one side reserves them all. A run
split over processes (`mode: explore` / `mode: train` from a queue, any number of explorers)
divides the cluster's cores by the run's ledger (`RunShares`, below) and reserves no CPU.
Torch threads follow the reservation (or the ledger), except in
lockstep: on-policy `mode: both` (`sync_interval: 1`, `sync_offset: 0`) alternates strictly,
explore step k waiting for train step k-1's weights and train step k for explore step k's
experiences, and in a train stage the engines only evaluate before or after training; there,
each side runs alone and uses every free core. `trainer.num_threads` and
`explorer.rollout_model.num_threads` override the threads of their actor.

GPU. GPUs are those Ray has free, at most `cluster.gpu_per_node`. The trainer uses one device;
with one GPU for the trainer and one per engine each gets a whole one, with fewer they share
them in equal fractions (Ray makes a fractional GPU visible to the actor, which then runs on
it; `_gpu_shares`). No GPU: everything runs on CPU. A tensor-parallel engine
(`explorer.rollout_model.tensor_parallel_size` t) counts t GPU users, one GPU per rank (rollout
GPUs = engine_num × t, Trinity-RFT's rule; a plan that would put two of its ranks on one GPU is
refused); on CPUs it has one engine's share of the cores, divided between its ranks. Sharing puts two of them on one device,
where NCCL cannot run a group: `sync_method: nccl` then sends weights by `memory`
(`ResourcePlan.gpu_shared`, the launcher).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Share:
    num_cpus: float  # reserved from Ray
    num_gpus: float  # reserved from Ray; > 0 makes a GPU visible to the actor
    threads: int  # torch threads while it runs


@dataclass(frozen=True)
class ResourcePlan:
    trainer: Share | None
    engine: Share | None  # each of the engines (GPUs: each of its ranks', below)
    run_share: str = ""  # a process of a split run: what it holds of the run's cores
    engine_ranks: int = 1  # processes per rollout engine (`tensor_parallel_size`)

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
                ranks = self.engine_ranks if s is self.engine else 1
                gpu = f", {s.num_gpus * ranks:g} GPU" if s.num_gpus else ""
                over = f" over {ranks} tensor-parallel ranks" if ranks > 1 else ""
                parts.append(f"{name} {s.num_cpus:g} CPU{gpu} ({s.threads} threads){over}")
        if self.run_share:
            parts.append(self.run_share)
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
    engine_ranks: int | None = None,
    tensor_parallel: int = 1,
) -> ResourcePlan:
    """Each compute actor's share of `cpus` free cores and `gpus` free GPUs (module docstring).

    `engines` is the number of rollout engines (0 when the stage has none), `lockstep` whether
    trainer and engines never run at the same time, `reserve_cpus` False for a process of a
    split run (its threads still follow the plan). `engine_ranks`: the engines' processes
    (None: one each), where a tensor-parallel engine counts its `tensor_parallel_size` ranks:
    on GPUs each rank takes a GPU of its own (Trinity-RFT's engine_num × tensor_parallel_size),
    and `Share.num_gpus` of the engines is each rank's; on CPUs an engine's share is the same
    whatever its ranks, which divide it. `tensor_parallel`: the rollout engines' ranks (what
    `describe` says). Raises ValueError when tensor-parallel ranks would share a GPU.
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

    ranks = engines if engine_ranks is None else engine_ranks
    t_gpu, e_gpu = _gpu_shares(gpus, trainer, ranks)
    if ranks > engines and 0 < e_gpu < 1:
        need = ranks + int(trainer)
        raise ValueError(
            "explorer.rollout_model.tensor_parallel_size: each rank of a tensor-parallel "
            f"engine needs a GPU of its own (NCCL puts one rank on a device): {ranks} engine "
            f"ranks{' and the trainer' if trainer else ''} need {need} GPUs, and {gpus:g} are "
            "free (lower engine_num or tensor_parallel_size, or add GPUs)"
        )
    plan_trainer = plan_engine = None
    keep = 1.0 if reserve_cpus else 0.0
    if trainer:
        plan_trainer = Share(
            round_resource(keep * trainer_cpus),
            t_gpu,
            threads(trainer_cpus, cores, trainer_threads),
        )
    if engines:
        plan_engine = Share(
            round_resource(keep * engine_cpus),
            e_gpu,
            threads(engine_cpus, cores / engines, engine_threads),
        )
    return ResourcePlan(plan_trainer, plan_engine, engine_ranks=tensor_parallel)


def _gpu_shares(gpus: float, trainer: bool, engines: int) -> tuple[float, float]:
    """(trainer's, each engine's) GPUs: whole ones when there are enough, else equal fractions.

    Ray places a fraction below 1 on one GPU, so with several GPUs the fraction is 1 / (members
    per GPU, rounded up): 3 members on 2 GPUs get 0.5 each (two on one, one on the other), not
    0.6667, of which no GPU holds two and the third would wait forever. Fewer than one GPU (a
    process of a split run plans for half the cluster's GPUs): that part split in equal fractions.
    """
    users = int(trainer) + engines
    if gpus <= 0 or users == 0:
        return 0.0, 0.0
    if gpus >= users:
        each = 1.0
    elif gpus >= 1:
        each = round_resource(1.0 / math.ceil(users / math.floor(gpus)))
    else:
        each = round_resource(gpus / users)
    return (each if trainer else 0.0), (each if engines else 0.0)


def round_resource(x: float) -> float:
    """Ray takes resource requests in units of 1/10000."""
    return float(int(x * 10000) / 10000)


@dataclass
class RunShares:
    """The cores of one run split over processes, held per process role (`trainer`,
    `explorer/<name>`), kept by the run's shared `RunName` actor (`common.shared`).

    The rule: the trainer's half (`cpus - cpus // 2`) is kept back for it whether or not it has
    started; the explorers share the other half (`cpus // 2`). An explorer's fair part is that
    half divided by the explorers in the run now (every role attached, a killed one too until it
    is started again or the run ends), in whole threads per engine; it is granted only what the
    other explorers do not hold (`claim` returns 0: wait). Each explorer claims again before each
    of its steps (`Explorer._take_share`): one that holds more than its fair part gives the rest
    back there, and one that waited takes it. So the ledger never holds more than `cpus` (the
    trainer's half plus at most the explorers' half), the threads of every compute actor of the
    run follow what its process holds, whatever order the processes start in, and a later
    explorer gets its fair part one step of the others later (nobody keeps more than a fair part
    past its next step). A process that leaves (`release`, when it detaches) frees its part for
    the others' next steps.

    Why not Ray's own accounting (reserve each process's cores, the trainer's kept back until it
    registers): a reservation is fixed for the actor's life, so the first explorer either
    reserves the explorers' whole half, leaving nothing to a second one, or a fixed fraction of
    what is free, which halves again for each later explorer; neither lets a later explorer have
    an equal part, and an actor's torch threads can change between steps where its reservation
    cannot. Split processes therefore reserve no CPU (as before); the ledger is the account.

    One floor: every engine runs at least one thread. When the explorers' half has fewer cores
    than the run's explorers have engines, each explorer holds one core per engine anyway and
    the ledger holds more than `cpus` (`describe` says "oversubscribed"): a cluster too small for
    the run, not a rule that could do better.
    """

    cpus: int
    held: dict[str, int] = field(default_factory=dict)

    @property
    def explorers_part(self) -> int:
        return self.cpus // 2

    @property
    def trainer_part(self) -> int:
        return self.cpus - self.explorers_part

    def fair(self, explorers: int, engines: int) -> int:
        """An explorer's fair part with `explorers` in the run, whole threads for its
        `engines` (at least one each: the floor)."""
        unit = max(1, engines)
        return max(unit, self.explorers_part // max(1, explorers) // unit * unit)

    def claim(self, role: str, explorers: int, engines: int, at_least: int = 0) -> int:
        """The cores `role` holds from now on (recorded). The trainer: its half. An explorer
        (`explorers` in the run, itself included, `engines` of its own): its fair part, at most
        what the other explorers leave free; 0 when that is less than one thread per engine
        (it waits, and claims again). `at_least`: take that many whatever is free (an explorer
        that waited too long for a holder that never came back)."""
        if role == "trainer":
            got = self.trainer_part
        else:
            unit = max(1, engines)
            fair = self.fair(explorers, engines)
            others = sum(v for r, v in self.held.items() if r not in (role, "trainer"))
            if self.explorers_part // max(1, explorers) < unit:
                got = unit  # the floor: fewer cores than engines (see the class docstring)
            else:
                got = min(fair, max(0, self.explorers_part - others)) // unit * unit
            got = max(got, at_least)
        self.held[role] = got
        return got

    def release(self, role: str) -> None:
        self.held.pop(role, None)

    def total(self) -> int:
        """What the ledger holds, the trainer's half counted whether it claimed or not."""
        return self.trainer_part + sum(v for r, v in self.held.items() if r != "trainer")

    def describe(self, role: str) -> str:
        """`<role> holds N of the run's C CPUs (trainer T, explorer/a A, ...)`."""
        kept = "" if "trainer" in self.held else " kept back"
        parts = [f"trainer {self.trainer_part}{kept}"]
        parts += [f"{r} {v}" for r, v in sorted(self.held.items()) if r != "trainer"]
        over = f", oversubscribed: {self.total()}" if self.total() > self.cpus else ""
        return (
            f"{role} holds {self.held.get(role, 0)} of the run's {self.cpus} CPUs "
            f"({', '.join(parts)}{over})"
        )
