"""The resource plan: what trainer and engines reserve from Ray, and how many threads they use."""

from trinity.common.resources import ResourcePlan, Share, plan_resources


def test_lockstep_sides_reserve_half_each_and_use_every_core():
    # on-policy mode both on 2 cores: each reserves 1 (so Ray can place both) and, since they
    # take turns, each computes with both cores
    plan = plan_resources(2, 0, trainer=True, engines=1, lockstep=True)
    assert plan == ResourcePlan(Share(1.0, 0.0, 2), Share(1.0, 0.0, 2))
    assert plan.describe() == "resources: trainer 1 CPU (2 threads); each engine 1 CPU (2 threads)"


def test_overlapping_sides_divide_the_cores():
    # off-policy on 16 cores, 4 engines: trainer 16/2 = 8; engines (16 - 8) / 4 = 2 each
    plan = plan_resources(16, 0, trainer=True, engines=4, lockstep=False)
    assert plan == ResourcePlan(Share(8.0, 0.0, 8), Share(2.0, 0.0, 2))
    # 2 cores, 3 engines: (2 - 1) / 3 = 0.3333 reserved each (Ray's 1/10000 units), 1 thread
    plan = plan_resources(2, 0, trainer=True, engines=3, lockstep=False)
    assert plan.trainer == Share(1.0, 0.0, 1)
    assert plan.engine == Share(0.3333, 0.0, 1)
    total = plan.trainer.num_cpus + 3 * plan.engine.num_cpus
    assert total <= 2  # never more than the machine has
    # in lockstep the 3 engines split every core while they run: 2 // 3 -> at least 1 thread
    assert plan_resources(2, 0, True, 3, lockstep=True).engine.threads == 1
    assert plan_resources(12, 0, True, 3, lockstep=True).engine.threads == 4


def test_one_side_alone_takes_everything_free():
    assert plan_resources(6, 0, trainer=True, engines=0, lockstep=False) == ResourcePlan(
        Share(6.0, 0.0, 6), None
    )
    # mode explore: 6 cores over 2 engines
    assert plan_resources(6, 0, trainer=False, engines=2, lockstep=False) == ResourcePlan(
        None, Share(3.0, 0.0, 3)
    )
    assert plan_resources(6, 1, trainer=False, engines=0, lockstep=True) == ResourcePlan(None, None)


def test_nothing_free_still_runs_with_one_thread():
    # a second process of the run, after the first reserved every core
    plan = plan_resources(0, 0, trainer=False, engines=2, lockstep=False)
    assert plan.engine == Share(0.0, 0.0, 1)


def test_explicit_threads_win():
    plan = plan_resources(8, 0, True, 2, lockstep=False, trainer_threads=3, engine_threads=1)
    assert plan.trainer == Share(4.0, 0.0, 3)
    assert plan.engine == Share(2.0, 0.0, 1)


def test_gpus_whole_when_enough_else_shared_in_equal_fractions():
    # 1 trainer + 2 engines on 4 GPUs: one whole GPU each
    plan = plan_resources(16, 4, trainer=True, engines=2, lockstep=False)
    assert (plan.trainer.num_gpus, plan.engine.num_gpus) == (1.0, 1.0)
    # on 1 GPU: a third each, all on the same device
    plan = plan_resources(16, 1, trainer=True, engines=2, lockstep=False)
    assert (plan.trainer.num_gpus, plan.engine.num_gpus) == (0.3333, 0.3333)
    assert "0.3333 GPU" in plan.describe()
    # a trainer alone uses one device however many there are
    assert plan_resources(16, 8, trainer=True, engines=0, lockstep=False).trainer.num_gpus == 1.0
    # no GPU: nothing requested, everything on CPU
    plan = plan_resources(16, 0, trainer=True, engines=2, lockstep=False)
    assert (plan.trainer.num_gpus, plan.engine.num_gpus) == (0.0, 0.0)


def test_a_process_of_a_split_run_reserves_no_cpu_but_keeps_its_threads():
    # mode explore on half of a 2-core cluster: 1 core for its one engine, nothing reserved
    plan = plan_resources(1, 0, trainer=False, engines=1, lockstep=False, reserve_cpus=False)
    assert plan.engine == Share(0.0, 0.0, 1)


def test_fractions_fit_on_whole_gpus_so_every_member_can_be_placed():
    # 3 members on 2 GPUs: 1 / ceil(3 / 2) = 0.5 each (two on one GPU, one on the other);
    # 0.6667 each would leave no GPU able to hold two and the third waiting forever
    plan = plan_resources(16, 2, trainer=True, engines=2, lockstep=False)
    assert (plan.trainer.num_gpus, plan.engine.num_gpus) == (0.5, 0.5)
    # 5 members on 2 GPUs: 1 / ceil(5 / 2) = 1/3 each, three on one GPU, two on the other
    plan = plan_resources(16, 2, trainer=True, engines=4, lockstep=False)
    assert plan.engine.num_gpus == 0.3333


def test_gpu_shared_when_trainer_and_engines_hold_fractions():
    # one GPU for a trainer and an engine: 0.5 each, the two ranks on one device
    assert plan_resources(16, 1, trainer=True, engines=1, lockstep=False).gpu_shared()
    assert plan_resources(16, 2, trainer=True, engines=2, lockstep=False).gpu_shared()
    # a whole GPU each, or no GPU (gloo on CPU has no such limit), or no trainer: not shared
    assert not plan_resources(16, 2, trainer=True, engines=1, lockstep=False).gpu_shared()
    assert not plan_resources(16, 0, trainer=True, engines=1, lockstep=False).gpu_shared()
    assert not plan_resources(16, 1, trainer=False, engines=2, lockstep=False).gpu_shared()


def test_nccl_on_a_shared_gpu_sends_by_memory_with_a_note():
    from trinity.config import resolve
    from trinity.config.schema import TrinityConfig
    from trinity.launcher.placement import sync_by_memory

    cfg = TrinityConfig.model_validate({"synchronizer": {"sync_method": "nccl"}})
    assert resolve(cfg).sync_method == "nccl"
    plan = plan_resources(16, 1, trainer=True, engines=1, lockstep=True)
    switched, note = sync_by_memory(cfg, plan)
    assert resolve(switched).sync_method == "memory"
    assert cfg.synchronizer.sync_method == "nccl"  # the user's config is not touched
    assert "NCCL cannot put two ranks on one device" in note and "0.5 GPU each" in note


def _threads(got: int, role: str, engines: int) -> int:
    """All torch threads of a process holding `got` cores (reserve_cpus=False: split run)."""
    trainer = role == "trainer"
    plan = plan_resources(got, 0, trainer, 0 if trainer else engines, False, reserve_cpus=False)
    return plan.trainer.threads if trainer else engines * plan.engine.threads


class _Run:
    """A split run's processes against its `RunName` ledger (the plain class, no Ray)."""

    def __init__(self, cpus: int) -> None:
        from trinity.common.shared import RunName

        self.actor, self.cpus, self.threads = RunName("run"), cpus, {}

    def start(self, role: str, engines: int = 1) -> int:
        self.actor.attach(role)
        return self.step(role, engines)

    def step(self, role: str, engines: int = 1) -> int:
        """The process claims (at start, and an explorer before each step); returns what it
        holds and records the threads it then runs (1 per engine while it waits on 0)."""
        got, _ = self.actor.claim_cpus(role, engines, self.cpus)
        self.threads[role] = _threads(got, role, engines) if got else engines
        return got

    def stop(self, role: str) -> None:
        self.actor.detach(role)
        self.threads.pop(role)


def test_split_run_trainer_first_then_a_second_explorer_joins_later():
    # 4 CPUs: the trainer's half is 4 - 4 // 2 = 2, the explorers share 4 // 2 = 2
    run = _Run(4)
    assert run.start("trainer") == 2
    assert run.start("explorer/alpha") == 2  # alone: the explorers' whole half
    assert sum(run.threads.values()) == 4
    # beta joins: its fair part is 2 // 2 = 1, but alpha holds both until its next step
    assert run.start("explorer/beta") == 0  # it waits (its engine loads on 1 thread)
    assert run.step("explorer/alpha") == 1  # alpha gives one back at its next step
    assert run.step("explorer/beta") == 1  # and beta takes it: 2 + 1 + 1 = 4
    assert run.threads == {"trainer": 2, "explorer/alpha": 1, "explorer/beta": 1}
    # alpha finishes: beta takes the whole explorers' half at its next step
    run.stop("explorer/alpha")
    assert run.step("explorer/beta") == 2
    assert sum(run.threads.values()) == 4


def test_split_run_explorers_first_keep_the_trainer_s_half_back():
    run = _Run(4)
    assert run.start("explorer/alpha") == 2  # not 4: the trainer's 2 are kept back
    _, ledger = run.actor.claim_cpus("explorer/alpha", 1)
    assert (
        ledger
        == "explorer/alpha holds 2 of the run's 4 CPUs (trainer 2 kept back, explorer/alpha 2)"
    )
    assert run.start("explorer/beta") == 0
    assert run.step("explorer/alpha") == 1 and run.step("explorer/beta") == 1
    assert run.start("trainer") == 2  # arrives last, its half is free
    assert sum(run.threads.values()) == 4
    _, ledger = run.actor.claim_cpus("trainer", 0)
    assert ledger.endswith("(trainer 2, explorer/alpha 1, explorer/beta 1)")


def test_split_run_explorers_that_start_together_split_at_once():
    # both attached before either claims: 2 // 2 = 1 each, nobody waits
    run = _Run(4)
    run.actor.attach("explorer/alpha")
    run.actor.attach("explorer/beta")
    assert run.step("explorer/alpha") == 1 and run.step("explorer/beta") == 1
    assert run.start("trainer") == 2


def test_split_run_an_explorer_started_again_takes_its_own_place():
    # alpha (alone, 2 cores) is SIGKILLed: its role keeps its part; started again under the same
    # role it claims anew (its old part is not counted against it) and gets the same 2
    run = _Run(4)
    run.start("explorer/alpha")
    assert run.start("explorer/alpha") == 2
    assert run.start("explorer/beta") == 0  # then as a late joiner: one step of alpha's later
    assert run.step("explorer/alpha") == 1 and run.step("explorer/beta") == 1


def test_split_run_shares_are_whole_threads_per_engine():
    # 16 CPUs: trainer 16 - 8 = 8; 3 explorers of 2 engines: 8 // 3 = 2 cores each (1 thread per
    # engine, 2 cores left idle rather than an engine with a fraction); alone: 8 (4 per engine)
    run = _Run(16)
    assert run.start("explorer/a", engines=2) == 8
    assert run.threads["explorer/a"] == 8  # 2 engines x 4 threads
    run.actor.attach("explorer/b")
    run.actor.attach("explorer/c")
    assert run.step("explorer/b", engines=2) == 0  # a holds the explorers' half
    assert run.step("explorer/a", engines=2) == 2
    assert run.step("explorer/b", engines=2) == 2 and run.step("explorer/c", engines=2) == 2
    assert run.start("trainer") == 8
    assert sum(run.threads.values()) == 8 + 3 * 2 <= 16
    # an odd count: 5 CPUs, trainer 5 - 2 = 3, one explorer 2
    odd = _Run(5)
    assert odd.start("trainer") == 3 and odd.start("explorer/a") == 2


def test_split_run_on_too_few_cpus_runs_one_thread_per_engine_and_says_so():
    # 2 CPUs, two explorers of one engine: the explorers' half is 1 core, 1 // 2 = 0 per
    # explorer: each runs its engine on 1 thread (the floor), 1 + 1 + 1 = 3 > 2
    run = _Run(2)
    assert run.start("trainer") == 1
    assert run.start("explorer/alpha") == 1
    assert run.start("explorer/beta") == 1
    assert sum(run.threads.values()) == 3
    _, ledger = run.actor.claim_cpus("explorer/beta", 1)
    assert ledger.endswith("oversubscribed: 3)")


def test_split_run_a_claim_at_least_takes_what_a_dead_holder_keeps():
    # alpha holds the explorers' half and never comes back: beta, after waiting, takes 1 anyway
    run = _Run(4)
    run.start("explorer/alpha")
    run.actor.attach("explorer/beta")
    assert run.actor.claim_cpus("explorer/beta", 1, None, 1)[0] == 1


def test_in_lockstep_is_on_policy_mode_both_or_a_train_stage_from_a_dataset():
    """`config.resolved.in_lockstep`: the trainer and engines never compute at once (the plan's
    `lockstep`, and a one-process run's engines on the compute lane)."""
    from trinity.config.resolved import in_lockstep
    from trinity.config.schema import TrinityConfig

    def cfg(**over) -> TrinityConfig:
        return TrinityConfig.model_validate(over)

    assert in_lockstep(cfg(mode="both"))  # sync_interval 1, sync_offset 0 by default
    assert not in_lockstep(cfg(mode="both", synchronizer={"sync_offset": 1}))
    assert not in_lockstep(cfg(mode="both", synchronizer={"sync_interval": 2}))
    assert not in_lockstep(cfg(mode="both", synchronizer={"sync_style": "explorer_driven"}))
    assert not in_lockstep(cfg(mode="explore"))
    assert in_lockstep(cfg(mode="train"))  # an SFT stage: engines only evaluate around it
    queue = {"trainer_input": {"experience_buffer": {"name": "q", "storage_type": "queue"}}}
    assert not in_lockstep(cfg(mode="train", buffer=queue))  # beside mode explore processes
