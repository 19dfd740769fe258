"""The trainer's loop, run as a Ray actor: read a train batch, step, publish weights, checkpoint."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.buffer.replay import replay_metrics
from trinity.buffer.storage import BufferClosed
from trinity.common import heartbeat, refs
from trinity.common.compute import compute_lane
from trinity.common.core_shares import CorePart, core_shares, follow_hooks
from trinity.common.remote_errors import cause_of
from trinity.common.startup import StartupMarks
from trinity.config.resolved import overlaps_in_one_process, resolve
from trinity.models.loading import BUILD_LOCK
from trinity.sync.method import sync_method
from trinity.sync.schedule import trainer_publishes_after
from trinity.trainer.checkpoint import trained_leases

# The trainer (torch, transformers) is imported when the actor is made: the driver imports this
# module only to start the actor, and stays free of torch.
if TYPE_CHECKING:
    from trinity.trainer.ranks import ShardedTrainer
    from trinity.trainer.sft_data import DatasetSource
    from trinity.trainer.trainer import Trainer


TRAINER = "trainer"  # its name in the heartbeat registry (`common.heartbeat`)


class TrainerRunner:
    def __init__(
        self,
        config: Any,
        model_path: str,
        stage_dir: str,
        buffer: Any,
        synchronizer: Any,
        hub: Any,
        step_offset: int,
        num_threads: int | None = None,
        rank_share: tuple[float, float] = (1.0, 0.0),
        nodes: list[str] | None = None,
        turns: Any = None,
    ) -> None:
        """`num_threads`: the trainer's torch threads; with `trainer_strategy: fsdp2`, those of
        each rank, as `rank_share` is each rank's (CPUs, GPUs) and `nodes` the run's nodes the
        ranks spread over (`trinity.trainer.ranks`). `turns`: colocation's baton
        (`common.turns.DeviceTurns`), shared with the engines: the trainer holds it for a train
        step and that step's publish and checkpoint, and keeps its state in host memory
        outside it."""
        # the trainer's torch and transformers, before the start-up timeline's `imports` mark

        self.startup = StartupMarks("trainer")  # its process start, its imports done
        self._started_at: float | None = None  # the driver's start: marks count from it
        self.cfg = config
        self.resolved = resolve(config)  # the stage's derived numbers, once
        heartbeat.start(self.resolved.run_dir)  # what it waits on, for the stall doctor
        self.num_threads = num_threads
        self.rank_share, self.nodes = rank_share, nodes
        self.model_path = model_path
        self.stage_dir = Path(stage_dir)
        self.buffer = buffer
        self.synchronizer = synchronizer
        self.hub = hub
        self.step_offset = step_offset
        self.trainer: Trainer | ShardedTrainer | None = None
        self.dataset: DatasetSource | None = None
        self.unacked: list[int] = []  # buffer leases read since the last checkpoint
        self._on_request = False  # sync_style explorer_driven: publish when an explorer asks
        self._read_metrics: dict[str, float] = {}  # a publish while waiting for data
        self._reader: int | None = None  # this trainer's token with the buffer
        # the trainer's torch work runs on one thread, whichever of the actor's threads calls
        # (common.compute: one OpenMP team per process, and its thread count applies)
        self.lane = compute_lane()
        self.cores: CorePart | None = None  # lent cores (`_build`)
        self.turns = turns

    def prepare(
        self, total_steps: int | None, use_dataset: bool, started_at: float | None = None
    ) -> dict[str, int]:
        """Load the model (and the SFT dataset in train mode). Returns the dataset size.
        `started_at`: the driver's process start, when this stage's first step is the run's
        (the start-up timeline, `common.startup`, goes into that step's record).

        The model loads here, while the explorer starts its engines, not when the first step
        is due (on 2 cores this took a second core's idle time off the path to the first step);
        the optimizer waits for `total_steps`, which `run` gets once the run has planned them.
        """
        from trinity.trainer.sft_data import DatasetSource

        self.trainer = self.lane.run(self._build, total_steps)
        if self.turns is not None:  # colocated: in host memory until its first turn
            self.lane.run(self.trainer.place, False)
        size = 0
        if use_dataset:
            pairwise = self.trainer.algo.spec.pairwise
            self.dataset = DatasetSource(self.cfg, self.trainer.tokenizer, pairwise)
            size = len(self.dataset)
        self.startup.mark("trainer_ready")
        self._started_at = started_at
        return {"dataset_size": size}

    def _build(self, total_steps: int | None) -> Trainer | ShardedTrainer:
        """The trainer (on the lane), while no other model of this process builds. In a
        one-process run whose sides overlap, its threads are a part of the process's cores
        that it lends while it does not train (`common.core_shares`). A sharded trainer's
        ranks are actors of their own (`trinity.trainer.ranks`), their plan printed."""
        if self.resolved.trainer_strategy == "fsdp2":
            from trinity.trainer.ranks import ShardedTrainer

            cpus, gpus = self.rank_share
            sharded = ShardedTrainer(
                self.cfg, self.model_path, total_steps, self.resolved.trainer_world_size,
                self.num_threads, cpus, gpus, self.nodes,
            )  # fmt: skip
            print(sharded.describe(), flush=True)
            return sharded
        with BUILD_LOCK:  # engines in this process (cluster.one_process) build one at a time
            import torch

            from trinity.trainer.trainer import Trainer

            trainer = Trainer(self.cfg, self.model_path, total_steps, self.num_threads)
        if overlaps_in_one_process(self.cfg):
            self.cores = core_shares().join(torch.get_num_threads())
            follow_hooks(trainer.model, self.cores)
        return trainer

    def _train_step(self, exps: list[Any]) -> dict[str, float]:
        """One train step (on the lane), its cores marked in use (`common.core_shares`)."""
        if self.cores is None:
            return self.trainer.train_step(exps)
        with self.cores.active():
            self.cores.follow()
            return self.trainer.train_step(exps)

    def run(
        self,
        total_steps: int | None,
        publish_steps: bool = True,
        publish_final: bool = True,
        resume_from: str | None = None,
        linger: float = 0.0,
    ) -> dict[str, Any]:
        """Train up to `total_steps` steps (None: until the data runs out) or until the data runs
        out.

        Weights are published only for a consumer: `publish_steps` when an explorer syncs during
        the run (mode both), `publish_final` when someone evaluates or explores with the final
        weights. An SFT stage with no evaluation publishes nothing. `linger` (a split run's
        trainer with a step budget): when every explorer has released the buffer before the
        budget is reached, wait that long for an explorer started later before ending.

        1. read one train batch (buffer queue, or the SFT dataset)
        2. train step
        3. publish weights on schedule, checkpoint every `save_interval_for(total_steps)` steps
           (resolve(): `trainer.save_interval`, unset = a tenth of the run), report metrics
        4. at the end: finish the buffer (explorers stop; what is pending is dropped, counted)
           and the synchronizer (an explorer waiting for later weights stops), final
           checkpoint, publish the final weights for the last evaluation

        `resume_from`: a checkpoint of this stage (with its trainer state) to continue from: its
        weights, optimizer, scheduler, RNG and step; the dataset skips the batches it trained.
        Reading a buffer, the trainer first settles that checkpoint's leases and takes back
        every other lease a dead predecessor held (`reader_started`), and tells the
        synchronizer where it restarts (`trainer_started`): a trainer restarted alone in a
        split run rejoins it.
        """
        cfg = self.cfg
        style = cfg.synchronizer.sync_style
        # explorer_driven: publish when an explorer asks (polled after each step, and every
        # second while waiting for data), not on the schedule
        self._on_request = publish_steps and style == "explorer_driven"
        if self.trainer is None:
            raise RuntimeError("TrainerRunner.prepare() must come before run()")
        self.lane.run(self.trainer.plan, total_steps)
        resolved = self.resolved
        n = resolved.train_batch_size  # experiences per train step
        save_every = resolved.save_interval_for(total_steps)  # 0 = only at the end
        step, last_saved = 0, None
        if resume_from is not None:
            step = int(self.lane.run(self.trainer.resume, Path(resume_from))["step"])
            last_saved = Path(resume_from)
            if self.dataset is not None:
                self.dataset.skip(step)  # one batch per train step
        if self.dataset is None and self.buffer is not None:
            settled = trained_leases(Path(resume_from) if resume_from else None)
            started = refs.get(self.buffer.reader_started.remote(settled))
            self._reader = started["reader"]
            if started["returned"]:
                print(
                    f"trainer: {started['returned']} experiences an earlier trainer of this run "
                    "had read and not checkpointed go back to the buffer",
                    flush=True,
                )
        refs.get(self.synchronizer.trainer_started.remote(step))
        if publish_steps and sync_method(resolved.sync_method).live:
            # the engines map these weights now and drop the copy they loaded, instead of
            # holding it through the first train step (sync_method shared)
            self._publish(step)
        budget_reached = False
        try:
            while total_steps is None or step < total_steps:
                # 1.
                t0 = time.perf_counter()
                exps = self._read(n, step, linger)
                if not exps:
                    break
                wait = time.perf_counter() - t0
                # 2.
                heartbeat.progress(TRAINER)
                step += 1
                versions = [e.model_version for e in exps]
                with self._device_turn() as turn:
                    metrics = self.lane.run(self._train_step, exps)
                    if self.dataset is None:  # rollouts (a dataset's rows have no version)
                        metrics.update(staleness_metrics(versions, trained_with=step - 1))
                        metrics.update(replay_metrics(exps))
                    metrics["timing/train_wait_buffer"] = wait
                    metrics.update(self._read_metrics)
                    self._read_metrics = {}
                    # 3.
                    scheduled = trainer_publishes_after(step, cfg.synchronizer.sync_interval, style)
                    if (publish_steps and scheduled) or (
                        self._on_request and refs.get(self.synchronizer.trained_step.remote(step))
                    ):
                        metrics.update(self._publish(step))
                    self.startup.mark("first_update")
                    metrics.update(self.startup.as_metrics(self._started_at))  # first step only
                    metrics.update(turn)
                    # reported before the checkpoint: a step checkpointed is a step reported
                    # (the hub journals it), so a resumed run has the metrics of every step it
                    # skips
                    refs.get(self.hub.put.remote("trainer", self.step_offset + step, metrics))
                    if save_every > 0 and step % save_every == 0:
                        last_saved = self._checkpoint(step)
                heartbeat.step(TRAINER)
            budget_reached = total_steps is not None and step >= total_steps
        except BaseException as e:
            refs.get(self.synchronizer.fail.remote(f"{type(e).__name__}: {e}"))
            raise
        # 4.
        dropped = 0
        if self.dataset is None and self.buffer is not None:
            dropped = refs.get(self.buffer.finish.remote())
            if dropped:
                print(
                    f"trainer: step budget {total_steps} reached; {dropped} experiences written "
                    "after it are dropped (not trained)",
                    flush=True,
                )
        final = last_saved
        with self._device_turn():
            if final is None or not final.name.endswith(f"_{step}"):
                final = self._checkpoint(step)
            if publish_final:
                self._publish(step, final=True)
        self.lane.run(self.trainer.release_training_state)  # the final evaluation: weights only
        refs.get(self.synchronizer.finish.remote(step))
        return {
            "train_steps": step,
            "checkpoint": str(final),
            "budget_reached": budget_reached,
            "dropped": dropped,
        }

    @contextlib.contextmanager
    def _device_turn(self) -> Iterator[dict[str, float]]:
        """Colocation (`common.turns`): hold the device for the block, the trainer's state on
        it; then back to host memory and the baton back, whatever the block raised. Yields
        the turn's `colocation/trainer_*` metrics (the wait for the device, the move onto it)."""
        if self.turns is None:
            yield {}
            return
        assert self.trainer is not None
        waited = refs.get(self.turns.take.remote("trainer"))
        t0 = time.perf_counter()
        moved = self.lane.run(self.trainer.place, True)
        try:
            yield {
                "colocation/trainer_wait_s": waited,
                "colocation/trainer_onload_s": time.perf_counter() - t0,
                "colocation/trainer_moved_bytes": float(moved),
            }
        finally:
            try:
                self.lane.run(self.trainer.place, False)
            finally:
                refs.get(self.turns.give.remote("trainer"))

    def _checkpoint(self, step: int) -> Path:
        """Save a checkpoint, then ack the buffer leases its steps used: they are trained for good."""
        assert self.trainer is not None
        # the leases go into the checkpoint too: a crash before the ack below must not hand
        # their experiences out again (the resumed buffer acks them, `QueueStorage(settled)`)
        path = self.lane.run(
            self.trainer.save_checkpoint, self.stage_dir, step, leases=list(self.unacked)
        )
        if self.unacked:
            refs.get(self.buffer.ack.remote(self.unacked))
            self.unacked = []
        return path

    def _read(self, n: int, step: int, linger: float = 0.0) -> list[Any] | None:
        """The next train batch; None when the data is done. `step`: the last trained step.

        Waits at most `max_read_timeout` s, in slices, saying every `notice_s` s what it waits
        for; `linger`: see `run`."""
        if self.dataset is not None:
            return self.dataset.read(n)
        timeout = self.cfg.buffer.trainer_input.experience_buffer
        timeout = timeout.max_read_timeout if timeout is not None else 1800.0
        t0 = time.monotonic()
        deadline, notice_s, noticed = t0 + timeout, 30.0, t0
        while True:
            # explorer_driven: wait in 1 s slices and answer an explorer's request between them
            left = deadline - time.monotonic()
            wait = min(1.0 if self._on_request else notice_s, max(1.0, left))
            try:
                with heartbeat.waiting(TRAINER, "explorer", f"{n} experiences from the buffer"):
                    lease = refs.get(
                        self.buffer.read.remote(n, wait, linger=linger, reader=self._reader)
                    )
                self.unacked.append(lease.id)
                return lease.experiences
            except BufferClosed:
                return None
            except (TimeoutError, ray.exceptions.RayTaskError) as e:
                cause = cause_of(e)
                if isinstance(cause, BufferClosed):
                    return None
                if not isinstance(cause, TimeoutError):
                    raise
                # past the deadline, unless the buffer lingers for a late explorer: its linger
                # (at most max_read_timeout) ends the wait
                if time.monotonic() >= deadline and not (
                    linger > 0 and refs.get(self.buffer.lingering.remote())
                ):
                    raise
            now = time.monotonic()
            if now - noticed >= notice_s:
                noticed = now
                state = refs.get(self.buffer.describe.remote())
                print(
                    f"trainer: step {step + 1} waits for {n} experiences ({now - t0:.0f} s of "
                    f"buffer.trainer_input.experience_buffer.max_read_timeout={timeout:.0f} s; "
                    f"buffer: {state})",
                    flush=True,
                )
            if (
                self._on_request
                and step > 0
                and refs.get(self.synchronizer.trained_step.remote(step))
            ):
                self._read_metrics = self._publish(step)

    def _publish(self, step: int, final: bool = False) -> dict[str, float]:
        """Publish the weights of `step` with the configured sync method's trainer half (on
        the lane; a sharded trainer's ranks gather them and rank 0 sends). With LoRA,
        `sync/full_bytes` beside `sync/bytes`: what the full weights would have moved."""
        assert self.trainer is not None
        t0 = time.perf_counter()
        method = self.resolved.sync_method
        with heartbeat.waiting(TRAINER, "synchronizer", f"publishing weights v{step} ({method})"):
            nbytes, payload = self.lane.run(
                self.trainer.publish, method, step, self.stage_dir / "sync"
            )
            refs.get(self.synchronizer.publish.remote(step, payload))
        out = {
            "sync/publish_s": time.perf_counter() - t0,
            "sync/bytes": float(nbytes),
        }
        if self.trainer.full_sync_nbytes is not None:  # LoRA: what full weights would move
            out["sync/full_bytes"] = float(self.trainer.full_sync_nbytes)
        return out


def staleness_metrics(versions: list[int], trained_with: int) -> dict[str, float]:
    """How many versions older than the trainer's weights (`trained_with`) each experience's
    rollout weights were: mean, max, and a histogram (`staleness/count_<k>`, the experiences k
    versions old)."""
    if not versions:
        return {}
    ages = [trained_with - v for v in versions]
    out = {"staleness/mean": sum(ages) / len(ages), "staleness/max": float(max(ages))}
    for age in sorted(set(ages)):
        out[f"staleness/count_{age}"] = float(ages.count(age))
    return out
