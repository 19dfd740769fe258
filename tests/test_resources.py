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
    from trinity.launcher.run import _sync_by_memory

    cfg = TrinityConfig.model_validate({"synchronizer": {"sync_method": "nccl"}})
    assert resolve(cfg).sync_method == "nccl"
    plan = plan_resources(16, 1, trainer=True, engines=1, lockstep=True)
    switched, note = _sync_by_memory(cfg, plan)
    assert resolve(switched).sync_method == "memory"
    assert cfg.synchronizer.sync_method == "nccl"  # the user's config is not touched
    assert "NCCL cannot put two ranks on one device" in note and "0.5 GPU each" in note
