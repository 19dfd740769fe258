"""The Explorer: runs workflows on tasks against the rollout engines and fills the buffer.

It never calls the trainer. It meets it through the buffer (experiences out) and the synchronizer
(weights in), on the schedule of `trinity.sync.schedule`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import itertools
import json
import math
import statistics
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trinity.algorithm.algorithms import lookup_algorithm, record_flag
from trinity.algorithm.sample_strategy import max_staleness
from trinity.buffer.storage import BufferClosed, Cursor
from trinity.common import heartbeat
from trinity.common.experience import EID, Experience
from trinity.common.keys import stable_key
from trinity.common.remote_errors import cause_of
from trinity.common.resources import ResourcePlan, Share
from trinity.common.rollout import SamplingParams, engine_class, takes_messages
from trinity.common.startup import StartupMarks
from trinity.common.turns import EnginesTurn
from trinity.config import seeds
from trinity.config.resolved import chat_template_kwargs, engines_in_explorer, resolve
from trinity.data.checks import data_juicer_users
from trinity.data.dj_server import DataJuicerServer
from trinity.data.pipeline import ExperiencePipeline, StepGroups
from trinity.data.task_ops import OpContext
from trinity.explorer import workflow_env
from trinity.explorer.auxiliary import (
    AuxiliaryModels,
    auxiliary_model,
    why_not_served,
)
from trinity.explorer.collapse import CollapseWatch
from trinity.explorer.engine_pools import EnginePools, in_explorer_engines, start_engine_pools
from trinity.explorer.evaluation import evaluation_report
from trinity.explorer.in_process import InThread
from trinity.explorer.ledger import LedgerStats
from trinity.explorer.model_client import BatchingClient, TaskModelHandle, mask_prompt_truncated
from trinity.explorer.rollout_stats import rollout_metrics
from trinity.explorer.tool_call_policy import apply_configured_policy
from trinity.models import load_tokenizer, resolve_model_path
from trinity.rewards.guard import RewardLog, reward_log
from trinity.sync.fingerprint import split as split_fingerprint
from trinity.sync.method import sync_method
from trinity.sync.schedule import (
    admission_version,
    explorer_syncs_after,
    weights_version_after_explore_step,
)
from trinity.sync.synchronizer import TrainingFinished
from trinity.tasks import Task, load_taskset, make_selector
from trinity.tasks.mix import TaskMix, mix_weights
from trinity.tasks.selector import TaskStream
from trinity.workflows import WORKFLOW

if TYPE_CHECKING:
    from trinity.endpoint.server import EndpointServer, WorkflowSessions
    from trinity.explorer.serve import ServeMode

SHARE_WAIT_S = 120.0  # longest wait for a part of a split run's cores (`_take_share`)


class WorkflowFailed(RuntimeError):
    """A task failed on every allowed try (`explorer.max_retry_times`)."""


class Explorer:
    def __init__(
        self,
        config: Any,
        model_path: str,
        buffer: Any,
        synchronizer: Any,
        hub: Any,
        step_offset: int = 0,
        engine_share: Share | None = None,
        engine_nodes: list[str] | None = None,
        run_shares: Any = None,
        engines: EnginePools | None = None,
        turns: Any = None,
    ) -> None:
        """`engine_share`: what each engine reserves and its threads (the launcher's resource
        plan); None = no reservation, every core. `engine_nodes`: engine i runs on node i mod N
        (`common.placement`); None or empty: wherever Ray places it. `run_shares`: in a process
        of a split run, the run's `RunName` actor; this explorer claims its part of the run's
        cores from it before each step and sets its engines' threads to it
        (`common.resources.RunShares`). `engines`: the engine actors, started by the caller
        with `start_engine_pools` and the same share and nodes (None: started here). `turns`:
        colocation's baton (`common.turns.DeviceTurns`), shared with the trainer: the engines
        hold it from their first call of a step to the step's end, and sleep outside it."""
        # the modules above name torch lazily (`common.lazy`): the driver imports this one
        # to start the actor; the actor imports torch here, before its `imports` mark
        importlib.import_module("torch")
        workflow_env.apply(config)  # explorer.env_vars, for the workflows run here
        self.startup = StartupMarks("explorer")  # its process start, its imports done
        self._started_at: float | None = None  # the driver's start: marks count from it
        self.cfg = config
        heartbeat.start(resolve(config).run_dir)  # what it waits on, for the stall doctor
        self.sync_method = resolve(config).sync_method  # the stage's weight transport, derived once
        self.engine_share = engine_share
        self.run_shares = run_shares
        self._held: int | None = None  # this explorer's part of a split run's cores
        self.engine_nodes = list(engine_nodes or [])
        # the launcher starts them beside this actor (`engines`), so they load while this
        # process imports and sets itself up; otherwise started first thing here
        pools = (
            engines
            if engines is not None
            else start_engine_pools(config, model_path, engine_share, engine_nodes)
        )
        # explorer.rollout_model.in_explorer_process: threads of this process, loading now
        self.engines: list[Any] = (
            in_explorer_engines(config, model_path, engine_share)
            if engines_in_explorer(config)
            else pools.rollout
        )
        # explorer.auxiliary_models (served ones) by position: engines never trained
        self.aux_engines: dict[int, list[Any]] = pools.auxiliary
        self.own_pools = pools if engines is None else None  # released at shutdown
        self.auxiliary: AuxiliaryModels | None = None  # their clients, after `prepare`
        self.aux_endpoints: list[EndpointServer] = []
        self.model_path = resolve_model_path(model_path)
        self.buffer = buffer
        self.synchronizer = synchronizer
        self.hub = hub
        self.step_offset = step_offset
        self.client: BatchingClient | None = None
        self.tokenizer = None
        self.train_tasks: list[Task] = []  # every training taskset's, end to end
        self.train_sets: list[list[Task]] = []  # each training taskset's
        self.eval_tasksets: dict[str, list[Task]] = {}
        self.last_eval: dict[str, float] = {}
        self.eval_samples: list[dict[str, Any]] = []
        self._stream: TaskStream | TaskMix | None = (
            None  # the run's tasks, counting what it handed out
        )
        self._token: int | None = None  # this process's writer token (`register_writer`)
        self.weights_digest: str | None = None  # the fingerprint of the weights loaded last
        mon = config.monitor
        self._collapse = CollapseWatch(mon.collapse_threshold, mon.collapse_patience)
        # the OpenAI-compatible endpoint workflows call (explorer.rollout_model.enable_openai_api)
        self.endpoint: EndpointServer | None = None
        self.sessions: WorkflowSessions | None = None
        self.serve_mode: ServeMode | None = None  # mode serve's endpoint, sessions, rewards
        # DAPO's dynamic sampling: tasks tried per step at most this many times batch_size
        fg = config.algorithm.filter_groups
        self.max_gen = (
            fg.max_num_gen_batches if record_flag(config.algorithm, "filter_groups") else 0
        )
        # ReMax: each task's greedy answer is scored as its samples' baseline
        self.greedy_baseline = lookup_algorithm(config.algorithm.algorithm_type).greedy_baseline
        # data_processor.experience_pipeline: operators over each step's experiences
        pcfg = config.data_processor.experience_pipeline
        self.pipeline = ExperiencePipeline(pcfg.operators if pcfg is not None else [])
        # service.data_juicer: the run's Data-Juicer server, where a recipe needs Data-Juicer;
        # started now, so it imports Data-Juicer while the engines load; ready before the
        # first recipe (`prepare`)
        self.data_juicer = (
            DataJuicerServer.from_config(
                config.service.data_juicer, Path(resolve(config).run_dir) / "data_juicer"
            )
            if data_juicer_users(config)
            else None
        )
        if self.data_juicer is not None:
            self.data_juicer.spawn()
        self.pipeline_batches = pcfg.max_num_gen_batches if pcfg is not None else 0
        # the engines hold the trainer's live weights (sync_method shared): a step's evaluation
        # runs before its experiences are written, while the trainer still waits for them
        self.live_weights = sync_method(self.sync_method).live
        self.turns = turns

    # -- set-up --------------------------------------------------------------------------------

    async def _serve_auxiliary(self) -> AuxiliaryModels:
        """Wait for the auxiliary engines; a client, tokenizer and sampling defaults per served
        model, and an endpoint of its own where it has `enable_openai_api`."""
        cfg = self.cfg
        await asyncio.gather(*(e.get_stats.remote() for p in self.aux_engines.values() for e in p))
        served = []
        for i, engines in self.aux_engines.items():
            aux = cfg.explorer.auxiliary_models[i]
            tokenizer = load_tokenizer(resolve_model_path(seeds.model_path(cfg, aux.model_path)))
            model = auxiliary_model(cfg, i, BatchingClient(engines), tokenizer)
            if aux.enable_openai_api:
                from trinity.endpoint.app import build_app
                from trinity.endpoint.server import EndpointServer, WorkflowSessions

                model.sessions = WorkflowSessions(
                    aux.model_path, len(tokenizer), model.defaults.max_tokens, model.client
                )
                server = EndpointServer(
                    build_app(
                        model.sessions,
                        tool_call_parser=aux.tool_call_parser or "hermes",
                        reasoning_parser=aux.reasoning_parser,
                    )
                )
                model.url = await server.start()
                self.aux_endpoints.append(server)
                print(
                    f"explorer {self._name}: OpenAI-compatible endpoint of auxiliary_models[{i}] "
                    f"for workflows at {model.url}"
                )
            served.append(model)
        configured = list(cfg.explorer.auxiliary_models)
        return AuxiliaryModels(served, configured, why_not_served(cfg))

    async def prepare(
        self, with_train_tasks: bool = True, started_at: float | None = None
    ) -> dict[str, int]:
        """Load the tokenizer and the tasksets, then wait for the engines (started by
        the launcher or `__init__`, they load meanwhile). Returns task counts (for step planning).
        `started_at`: the driver's process start, when this stage's first step is the run's
        (the start-up timeline, `common.startup`, goes into that step's record)."""
        cfg = self.cfg
        marks = None
        if any(isinstance(e, InThread) for e in self.engines):
            # engines building in this process import transformers; importing it from two
            # threads at once races in its lazy module: ours come after theirs
            marks = await asyncio.gather(*(e.startup_marks.remote() for e in self.engines))
        self.tokenizer = load_tokenizer(
            self.model_path, custom_chat_template=cfg.model.custom_chat_template
        )
        inp = cfg.buffer.explorer_input
        # a task pipeline writes the taskset once the auxiliary models (its judges) are served
        pipeline_first = with_train_tasks and cfg.data_processor.task_pipeline is not None
        if with_train_tasks and not pipeline_first:
            self._load_train_tasks()
        for i, ts in enumerate(inp.eval_tasksets):
            name = ts.name or f"eval{i}"
            self.eval_tasksets[name] = load_taskset(
                ts,
                is_eval=True,
                default_workflow_type=inp.default_eval_workflow_type or inp.default_workflow_type,
                default_reward_fn_type=inp.default_reward_fn_type,
                default_seed=cfg.seed,
            )
        if marks is None:
            marks = await asyncio.gather(*(e.startup_marks.remote() for e in self.engines))
        for phase in ("engine_process", "engine_ready") if marks else ():  # the last engine's
            self.startup.mark(phase, max(m[phase] for m in marks))
        engine_cls = engine_class(resolve(cfg).engine_type)
        self.client = BatchingClient(self.engines, messages=takes_messages(engine_cls, cfg))
        self.client.service = self._beat
        if self.turns is not None:  # colocated: built awake, they sleep until their first turn
            self.client.turn = EnginesTurn(self.turns, self.engines)
            await self.client.turn.rest(always=True)
        rm = cfg.explorer.rollout_model
        if rm.enable_openai_api and self.endpoint is None:
            from trinity.endpoint.server import rollout_model_endpoint  # only when asked

            self.sessions, self.endpoint = rollout_model_endpoint(cfg, self.tokenizer, self.client)
            url = await self.endpoint.start()
            print(f"explorer {self._name}: OpenAI-compatible endpoint for workflows at {url}")
        if self.aux_engines and self.auxiliary is None:
            self.auxiliary = await self._serve_auxiliary()
        if self.data_juicer is not None and self.data_juicer.pid is None:
            with heartbeat.waiting(self._beat, "data_juicer", "its server's start"):
                await asyncio.to_thread(self.data_juicer.wait_ready)
            print(
                f"explorer {self._name}: Data-Juicer server (pid {self.data_juicer.pid}) at "
                f"{self.data_juicer.url}"
            )
        if pipeline_first:
            self._load_train_tasks(await self._run_task_pipeline())
        self.startup.mark("explorer_ready")
        self._started_at = started_at
        sizes = {"train_tasks": len(self.train_tasks)}
        if len(self.train_sets) > 1:  # a mix's length is not the sets' size times the epochs
            sizes["explore_tasks"] = self._task_stream().length()
        return sizes

    def _load_train_tasks(self, pipeline_output: str | None = None) -> None:
        """The training tasksets' tasks, each set's (`train_sets`) and all (`train_tasks`);
        `pipeline_output`: the task pipeline's file, read in place of the first training
        taskset (its format, workflow and selector kept)."""
        cfg, inp = self.cfg, self.cfg.buffer.explorer_input
        configs = [inp.taskset] if inp.taskset is not None else list(inp.tasksets)
        if pipeline_output is not None:
            configs[0] = configs[0].model_copy(
                update={"path": pipeline_output, "storage_type": "file", "subset_name": None}
            )
        self.train_sets = [
            load_taskset(
                ts,
                is_eval=False,
                default_workflow_type=inp.default_workflow_type,
                default_reward_fn_type=inp.default_reward_fn_type,
                default_seed=cfg.seed,
            )
            for ts in configs
        ]
        self.train_tasks = [t for tasks in self.train_sets for t in tasks]

    async def _run_task_pipeline(self) -> str:
        """`data_processor.task_pipeline` (trinity/data/task_pipeline.py): its output file."""
        from trinity.config import resolve
        from trinity.data.task_ops import OpContext
        from trinity.data.task_pipeline import run_task_pipeline

        ctx = OpContext(
            models=self.auxiliary, pass_rates=self._row_pass_rates, data_juicer=self.data_juicer
        )
        out, metrics = await run_task_pipeline(self.cfg, resolve(self.cfg).run_dir, ctx)
        summary = ", ".join(f"{k.removeprefix('task_pipeline/')}={v:g}" for k, v in metrics.items())
        print(f"explorer {self._name}: task pipeline wrote {out} ({summary})")
        return str(out)

    async def _row_pass_rates(self, rows: list[dict]) -> list[float | None]:
        """Each row run as a task of the training taskset (its format and workflow, its
        `repeat_times` samples) with the current weights: the mean reward of its samples, None
        when its workflow failed (`pass_rate_filter`)."""
        import tempfile

        inp = self.cfg.buffer.explorer_input
        base = inp.taskset if inp.taskset is not None else inp.tasksets[0]
        with tempfile.TemporaryDirectory(prefix="trinity-pass-rates-") as tmp:
            path = Path(tmp) / "rows.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            storage = base.model_copy(
                update={"path": str(path), "storage_type": "file", "subset_name": None}
            )
            tasks = load_taskset(
                storage,
                default_workflow_type=inp.default_workflow_type,
                default_reward_fn_type=inp.default_reward_fn_type,
                default_seed=self.cfg.seed,
            )
        kept, _ = await self._run_tasks(
            tasks,
            self._train_params,
            "task pipeline pass rates",
            budget=math.inf,  # a failed task has no pass rate; the filter counts it
            key=self._sampling_key("task_pipeline"),
            train=False,
        )
        rates: list[float | None] = [None] * len(rows)
        for i, exps in kept:
            rewards = [e.reward for e in exps if e.reward is not None and not math.isnan(e.reward)]
            rates[i] = sum(rewards) / len(rewards) if rewards else None
        return rates

    def _task_stream(self) -> TaskStream | TaskMix:
        """The selector's order, task by task (steps take `batch_size`, refills take more);
        several tasksets: each in its own selector's order, mixed by ratio (`tasks.mix`)."""
        inp, b = self.cfg.buffer.explorer_input, self.cfg.buffer
        configs = [inp.taskset] if inp.taskset is not None else list(inp.tasksets)
        streams = [
            TaskStream(
                make_selector(ts.data_selector, default_seed=self.cfg.seed),
                tasks,
                b.batch_size,
                b.total_epochs,
            )
            for ts, tasks in zip(configs, self.train_sets, strict=True)
        ]
        self._positions = {id(t): i for i, t in enumerate(self.train_tasks)}
        if len(streams) == 1:
            return streams[0]
        weights = mix_weights(inp.taskset_ratios, [len(t) for t in self.train_sets])
        return TaskMix(streams, weights)

    # -- the loop ------------------------------------------------------------------------------

    async def run(
        self,
        total_steps: int,
        sync: str = "schedule",
        resume: bool = False,
        weights: tuple[str, int] | None = None,
    ) -> dict[str, Any]:
        """Explore `total_steps` steps, syncing weights at the schedule's points; release the buffer.

        `sync` (`schedule.explorer_sync`): "schedule" (mode both, sync_style fixed): after explore
        step s the explorer waits for exactly the version the schedule names. "latest"
        (trainer_driven, or mode explore: the trainer, if any, is another process): at the same
        points it takes whatever newer weights were published, never waits. "request"
        (explorer_driven): at the same points it asks the trainer for its current weights.

        1. register with the buffer (superseding a dead process of this explorer) and the
           synchronizer; `resume`: read this explorer's cursor and report its step again
           (`MetricsHub.replay`); evaluate at start (`explorer.eval_on_startup`)
        2. per step: sync weights if the schedule says so, run the batch's workflows, write the
           experiences, report metrics, evaluate every `eval_interval` steps
        3. release the buffer: when its last writer has, the trainer drains it and stops

        The trainer's step budget ends exploring too: once it has finished, a write (or a wait
        for weights it will never publish) tells this explorer so, and it stops after the steps
        it wrote (`stopped_by_trainer` in the result).

        Resuming (`resume`, with this explorer's cursor in the buffer): the task stream skips the
        tasks it handed out, steps continue after the cursor's step, and there is no start-up
        evaluation; `weights` (a checkpoint and its version: the trainer's resumed one) are
        loaded first.
        """
        if sync not in ("schedule", "latest", "request"):
            raise ValueError(f"sync must be 'schedule', 'latest' or 'request', got {sync!r}")
        ecfg = self.cfg.explorer
        bound = max_staleness(
            self.cfg.algorithm.sample_strategy, self.cfg.algorithm.sample_strategy_args
        )
        # 1.
        self._token = await self.buffer.register_writer.remote(ecfg.name)
        await self.synchronizer.register_reader.remote(ecfg.name, self._version())
        start = await self.buffer.cursor.remote(ecfg.name) if resume else None
        if start is not None:
            print(
                f"explorer {ecfg.name!r} continues after explore step {start.step} "
                f"({start.tasks} tasks handed out)",
                flush=True,
            )
            if start.metrics is not None:
                # that step's report, kept with its experiences: its process may have died
                # before reporting it (the monitor drops it if a record holds it already)
                await self.hub.replay.remote(
                    "explorer", self.step_offset + start.step, start.metrics
                )
        if ecfg.eval_on_startup and self.eval_tasksets and start is None:
            await self.evaluate(step=0)
        if weights is not None:
            await self.load_weights(*weights)
        if self.live_weights and sync == "schedule":
            await self.share_trainer_weights()
        stream = self._stream = self._task_stream()
        first = 1
        if start is not None:
            stream.resume(start.tasks, start.selector)
            first = start.step + 1
        step, written, stopped = first - 1, first - 1, ""
        try:
            for step in range(first, total_steps + 1):
                # 2.
                await self._take_share()
                metrics = await self._step(step, total_steps, stream, sync, bound)
                if metrics is None:
                    break  # the tasks ran out
                written = step
                heartbeat.step(self._beat)
                self.startup.mark("first_rollout")
                metrics.update(self.startup.as_metrics(self._started_at))  # first step only
                await self.hub.put.remote("explorer", self.step_offset + step, metrics)
        except (BufferClosed, TrainingFinished) as e:
            stopped = str(cause_of(e))
            print(
                f"explorer {ecfg.name!r}: {stopped}; stopping after explore step {written}",
                flush=True,
            )
        # 3. only after success: a failed explorer has not finished writing, and a trainer
        # waiting on it must not take its failure for the end of the data (and checkpoint)
        await self.buffer.release_writer.remote(ecfg.name)
        await self.synchronizer.release_reader.remote(ecfg.name)
        return {"explore_steps": written, "stopped_by_trainer": stopped}

    # -- mode serve ----------------------------------------------------------------------------

    async def start_serving(self) -> str:
        """Mode serve (`explorer.serve.ServeMode`): start the endpoint; returns its URL."""
        from trinity.explorer.serve import ServeMode

        self.serve_mode = ServeMode(self)
        return await self.serve_mode.start()

    async def serve(self, poll_s: float = 0.2) -> dict[str, Any]:
        """Mode serve, after `start_serving`: write rewarded sessions until the trainer ends."""
        assert self.serve_mode is not None, "start_serving() first"
        return await self.serve_mode.run(poll_s)

    async def _take_share(self, wait_s: float = SHARE_WAIT_S) -> None:
        """Before a step of a split run: claim this explorer's part of the run's cores
        (`common.resources.RunShares`) and set its engines' threads to it (rollout and auxiliary
        engines of pools without their own `num_threads`; every step, so an engine that Ray
        restarted with its first threads follows too); say so when it changes.

        A claim of 0 (other explorers hold the explorers' half until their next step) is tried
        again every second, saying what it waits for; after `wait_s` (a holder that never comes
        back: killed and not started again) it takes one thread per engine anyway.
        """
        ecfg = self.cfg.explorer
        pools = [(ecfg.rollout_model, self.engines)]
        pools += [(ecfg.auxiliary_models[i], p) for i, p in self.aux_engines.items()]
        # engines whose threads follow the ledger: those of pools without their own num_threads
        following = [e for pool, engines in pools if pool.num_threads is None for e in engines]
        if self.run_shares is None or not following:
            return
        role, k = f"explorer/{self._name}", len(following)
        t0 = time.monotonic()
        got, run = await self.run_shares.claim_cpus.remote(role, k)
        notice = 0.0
        while got == 0:
            waited = time.monotonic() - t0
            if waited >= wait_s:
                got, run = await self.run_shares.claim_cpus.remote(role, k, None, k)
                print(
                    f"explorer {self._name!r}: no part of the run's cores came free in "
                    f"{wait_s:.0f} s (an explorer killed and not started again keeps its "
                    f"part): one thread per engine ({run})",
                    flush=True,
                )
                break
            if waited >= notice:
                print(
                    f"explorer {self._name!r}: waits for its part of the run's cores, which "
                    f"the other explorers give back at their next step ({run}; "
                    f"{waited:.0f} s so far)",
                    flush=True,
                )
                notice += 30.0
            await asyncio.sleep(1.0)
            got, run = await self.run_shares.claim_cpus.remote(role, k)
        threads = max(1, got // k)
        await asyncio.gather(*(e.set_num_threads.remote(threads) for e in following))
        if got != self._held:
            self._held = got
            share = Share(0.0, self.engine_share.num_gpus if self.engine_share else 0.0, threads)
            print(ResourcePlan(None, share, run).describe(), flush=True)

    async def _step(
        self, step: int, total_steps: int, stream: Iterator[Task], sync: str, bound: int | None
    ) -> dict[str, float] | None:
        """Explore step `step`: sync on schedule, admission, run and write the batch (None:
        no task left)."""
        scfg, ecfg = self.cfg.synchronizer, self.cfg.explorer
        synced: dict[str, float] = {}
        if step > 1 and explorer_syncs_after(step - 1, scfg.sync_interval, scfg.sync_offset):
            if sync == "schedule":
                synced = await self.sync_to(
                    weights_version_after_explore_step(
                        step - 1, scfg.sync_interval, scfg.sync_offset
                    )
                )
            elif sync == "latest":
                synced = await self.sync_to_latest()
            else:
                synced = await self.sync_on_request()
        # admission (staleness_control): no step starts with weights older than its bound
        oldest = admission_version(step, bound)
        if self.client is not None and self.client.model_version < oldest:
            admitted = await self.admit(oldest, newest=sync != "schedule", ask=sync == "request")
            synced = {k: synced.get(k, 0.0) + v for k, v in admitted.items()}
        tasks = list(itertools.islice(stream, self.cfg.buffer.batch_size))
        if not tasks:
            await self._rest()  # a sync above may have woken the engines
            return None
        due = ecfg.eval_interval > 0 and step % ecfg.eval_interval == 0 and step < total_steps
        if due and self.live_weights:
            return await self.explore_step(
                step, tasks, stream, synced, then=lambda: self.evaluate(step, report=False)
            )
        metrics = await self.explore_step(step, tasks, stream, synced)
        if due:  # while the trainer trains this step, on the weights the step sampled with
            metrics.update(await self.evaluate(step, report=False))
        return {**metrics, **await self._rest()}

    async def _rest(self) -> dict[str, float]:
        """Colocation: the engines sleep and give the device back (`common.turns`); their
        turn's `colocation/*` metrics."""
        if self.client is None or self.client.turn is None:
            return {}
        return await self.client.turn.rest()

    @property
    def _name(self) -> str:
        return self.cfg.explorer.name

    @property
    def _beat(self) -> str:
        """This explorer's name in the heartbeat registry (`common.heartbeat`)."""
        return heartbeat.service_name("explorer", self._name)

    def _version(self) -> int:
        return self.client.model_version if self.client is not None else 0

    async def explore_step(
        self,
        step: int,
        tasks: list[Task],
        refill: Iterator[Task] | None = None,
        before: dict[str, float] | None = None,
        then: Callable[[], Awaitable[dict[str, float]]] | None = None,
    ) -> dict[str, float]:
        """Run one step's tasks and write their experiences to the buffer.

        A task dropped after failing every try is replaced by the next task of `refill` (the
        selector's stream), so every step hands the trainer the same number of experiences:
        a trainer reading `batch_size * repeat_times` never waits for a short step.

        The step's report (`before`: what the step measured before its tasks ran, such as its
        weight sync, then its rollout metrics) goes to the buffer with the experiences, in one
        transaction (`Cursor.metrics`); the returned metrics add the write's time, and those of
        `then`, run after the rollouts and before the write (the evaluation of a step whose
        engines hold the trainer's live weights).
        """
        t0 = time.perf_counter()
        key = self._sampling_key("train", step)
        rewards = RewardLog()  # the step's reward fn calls: times, failures with task ids
        with reward_log(rewards):
            kept, counts = await self._run_tasks(tasks, self._train_params, key=key)
        target = len(tasks)
        budget = self.cfg.explorer.max_failure_fraction * target
        groups = StepGroups(self.pipeline, drop_flat=bool(self.max_gen))
        kept = groups.keep(await self._prepared(self._grouped(step, tasks, kept)))
        limit = self.max_gen or (self.pipeline_batches if self.pipeline else 0)
        while refill is not None and len(kept) < target:
            if limit and len(tasks) >= limit * target:
                break  # the filters' budget is spent: the step is completed below
            more = list(itertools.islice(refill, target - len(kept)))
            if not more:
                break  # the data ran out: a short last step
            base = len(tasks)
            tasks = tasks + more
            with reward_log(rewards):
                extra, extra_counts = await self._run_tasks(
                    more,
                    self._train_params,
                    budget=math.inf,  # counted against the step's budget
                    key=key,
                    first=base,
                )
            extra = [(base + i, exps) for i, exps in extra]
            extra = await self._prepared(self._grouped(step, tasks, extra))
            kept += groups.keep(extra, refill=True)
            counts = {k: counts[k] + extra_counts[k] for k in counts}
            if counts["failed_tasks"] > budget:
                raise WorkflowFailed(
                    f"explore step {step}: {int(counts['failed_tasks'])} tasks failed counting "
                    "their replacements, more than explorer.max_failure_fraction="
                    f"{self.cfg.explorer.max_failure_fraction} of the step's {target}"
                )
        if self.max_gen:
            counts["filtered_groups"] = float(len(groups.flat))
            counts["sampled_tasks"] = float(len(tasks))
            short = max(0, target - len(kept))
            counts["filter_exhausted"] = float(short > 0 and len(groups.flat) > 0)
        # the step keeps its size (the trainer reads a fixed count): held-back groups complete it
        kept = groups.complete(kept, target)
        if self.greedy_baseline:
            await self._greedy_baselines([tasks[i] for i, _ in kept], [e for _, e in kept], key)
        experiences: list[Experience] = []
        for pos, (i, exps) in enumerate(kept):
            task = tasks[i]
            for e in exps:
                # the explorer's name in the id: groups of two explorers' step s never mix; a
                # sample a filter took out of its kept task is a group of its own (untrained)
                alone = f"/filtered{e.eid.run}" if e.info.get("own_group") else ""
                if sub := e.info.get("subgroup"):  # a second group of the task's (a judge's)
                    alone = f"/{sub}{alone}"
                if self.weights_digest is not None:  # which weights sampled it (sync.fingerprint)
                    e.info["weights_fingerprint"] = self.weights_digest
                e.eid = EID(
                    batch=step,
                    task=pos,
                    run=e.eid.run,
                    step=e.eid.step,
                    suffix=f"{self.cfg.explorer.name}/{task.taskset_name}{alone}",
                )
                experiences.append(e)
        if not experiences:
            raise RuntimeError(f"explore step {step}: the workflows returned no experiences")
        # kept out of training by their workflow (`exclude_from_training`): masked, counted
        counts["excluded"] = float(sum(1 for e in experiences if e.info.get("excluded")))
        counts["excluded_groups"] = float(
            sum(1 for _, exps in kept if exps and all(e.info.get("excluded") for e in exps))
        )
        elapsed = time.perf_counter() - t0  # the step's rollouts, not the write's wait
        # rollout/* describe the policy: every sample of the step, also those dynamic sampling
        # dropped (the trainer's batch alone is biased toward mixed groups; train/* reports it)
        sampled = experiences + groups.unused()
        report = {
            **(before or {}),
            **rollout_metrics(sampled, prefix="rollout/"),
            **groups.metrics(),
            "rollout/tasks": float(len(kept)),
            **{f"rollout/{k}": v for k, v in counts.items()},
            "rollout/tokens_per_s": sum(e.response_length for e in sampled) / elapsed,
            "rollout/model_version": float(self.client.model_version),
            "rollout/engine_restarts": float(self.client.restarts),  # over the run so far
            "timing/explore_step": elapsed,
            **self._per_taskset(tasks, kept, sampled),
            **rewards.metrics("rollout/"),  # reward time p50/p99, failures and their task ids
        }
        if (failures := rewards.summary()) is not None:
            print(f"explorer {self._name}: explore step {step}: {failures}", flush=True)
        watched, warning = self._collapse.observe(report, step)
        report.update(watched)
        if warning is not None:
            print(f"explorer {self._name}: {warning}", flush=True)
        after = await then() if then is not None else {}
        stream = self._stream
        cursor = None
        if stream is not None:
            stream.feedback(*self._pass_rates(tasks, sampled))  # an adaptive selector learns
            cursor = Cursor(self._name, step, stream.taken, report, stream.state_dict())
        t_write = time.perf_counter()
        await self._write(experiences, cursor)
        return {**report, **after, "timing/buffer_write": time.perf_counter() - t_write}

    def _per_taskset(
        self, tasks: list[Task], kept: list[Any], sampled: list[Experience]
    ) -> dict[str, float]:
        """Mixed tasksets: each set's tasks in the step and rollout metrics of its samples, as
        `rollout/taskset/<name>/...` (nothing for one taskset)."""
        if len(self.train_sets) < 2:
            return {}
        out: dict[str, float] = {}
        for tasks_of_set in self.train_sets:
            name = tasks_of_set[0].taskset_name if tasks_of_set else ""
            prefix = f"rollout/taskset/{name}/"
            mine = [e for e in sampled if e.info["task_index"]["taskset_id"] == name]
            out[f"{prefix}tasks"] = float(sum(tasks[i].taskset_name == name for i, _ in kept))
            out.update(rollout_metrics(mine, prefix=prefix) if mine else {})
        return out

    def _pass_rates(
        self, tasks: list[Task], sampled: list[Experience]
    ) -> tuple[list[int], list[float]]:
        """Each of the step's tasks' pass rate (the mean valid reward of its samples, as
        sampled, kept or not) by its position in the run's tasks, for the selector."""
        by_task: dict[int, list[float]] = {}
        for e in sampled:
            if e.reward is not None and not math.isnan(e.reward):
                by_task.setdefault(e.info["step_task"], []).append(e.reward)
        indices = [self._positions[id(tasks[i])] for i in by_task]
        return indices, [sum(r) / len(r) for r in by_task.values()]

    async def _prepared(self, groups: list[Any]) -> list[Any]:
        """`groups`, after the experience operators' `prepare` (an LLM operator's scoring)."""
        if self.pipeline:
            ctx = OpContext(models=self.auxiliary, data_juicer=self.data_juicer)
            await self.pipeline.prepare([e for _, exps in groups for e in exps], ctx)
        return groups

    def _grouped(self, step: int, tasks: list[Task], groups: list[Any]) -> list[Any]:
        """`groups` ((position in `tasks`, experiences)) with each experience's id naming its
        task's group in this step (what the operators group by; the written id comes later)
        and `info["task_index"]` its task (Trinity-RFT's key: taskset and index)."""
        for i, exps in groups:
            for e in exps:
                e.eid = EID(batch=step, task=i, run=e.eid.run, step=e.eid.step, suffix="step")
                e.info["task_index"] = {
                    "taskset_id": tasks[i].taskset_name,
                    "index": tasks[i].index,
                }
                e.info["step_task"] = i  # its task's position in the step (`_pass_rates`)
        return groups

    async def _greedy_baselines(
        self, tasks: list[Task], samples: list[list[Experience]], key: int
    ) -> None:
        """ReMax's baseline: each task answered once greedily (not trained); its reward goes
        into `info["reward_baseline"]` of every sample of the task."""

        def greedy(task: Task) -> SamplingParams:
            return dataclasses.replace(self._train_params(task), n=1, temperature=0.0)

        got, _ = await self._run_tasks(
            tasks, greedy, what="greedy baseline", budget=0, key=stable_key(key, "greedy")
        )
        for (_, exps), task_samples in zip(got, samples, strict=True):
            baseline = statistics.fmean(e.reward or 0.0 for e in exps)
            for e in task_samples:
                e.info["reward_baseline"] = baseline

    async def evaluate(
        self, step: int, report: bool = True, source: str = "explorer", keep_samples: bool = False
    ) -> dict[str, float]:
        """One pass over every eval set at once (their tasks in one batch of workflow runs),
        greedy unless a set's `rollout_args` / `repeat_times` say otherwise (`task_sampling`);
        each set's metrics from `evaluation.evaluation_report` (avg@n, pass@k, maj@k with
        intervals; failed samples count as wrong). `keep_samples`: keep a record per sample
        slot for `take_eval_samples` (mode bench)."""
        t0 = time.perf_counter()
        sets = list(self.eval_tasksets.items())
        tasks = [t for _, ts in sets for t in ts]
        if not tasks:  # no eval sets (eval_interval set, eval_tasksets emptied): nothing to run
            if report:
                await self._rest()
            return {}
        with reward_log() as rewards:
            kept, counts = await self._run_tasks(
                tasks,
                self._eval_params,
                "evaluation",
                key=self._sampling_key("eval", step),
                train=False,
            )
        if (failures := rewards.summary()) is not None:
            print(f"explorer {self._name}: evaluation at step {step}: {failures}", flush=True)
        if not kept:
            raise RuntimeError(
                f"evaluation: the workflows returned no experiences for {len(tasks)} tasks"
            )
        metrics: dict[str, Any] = {"eval/timeouts": counts["timeouts"], **rewards.metrics("eval/")}
        self.eval_samples = []
        first = 0
        for name, ts in sets:
            mine = [(i - first, es) for i, es in kept if first <= i < first + len(ts)]
            m, samples = evaluation_report(
                name,
                ts,
                [self._eval_params(t).n for t in ts],
                mine,
                seed=stable_key(self.cfg.seed, "eval bootstrap", name),
                detailed=self.cfg.monitor.detailed_stats,
                decode=self._decode if keep_samples else None,
            )
            metrics.update(m)
            self.eval_samples += samples
            first += len(ts)
        metrics["timing/eval"] = time.perf_counter() - t0
        # the weights evaluated (an asynchronous run's step s may evaluate an older version)
        metrics["eval/model_version"] = float(self._version())
        self.last_eval = {k: v for k, v in metrics.items() if k.endswith("/accuracy")}
        if report:  # an evaluation of its own (not a step's): the engines' turn ends here
            metrics.update(await self._rest())
            await self.hub.put.remote(source, self.step_offset + step, metrics)
        return metrics

    def take_eval_samples(self) -> list[dict[str, Any]]:
        """The per-sample records of the last `evaluate(keep_samples=True)` (then forgotten)."""
        samples, self.eval_samples = self.eval_samples, []
        return samples

    def _decode(self, e: Experience) -> tuple[str, str]:
        """An experience's prompt and response text (decoded from its tokens where not kept)."""
        prompt = e.prompt_text
        if prompt is None:
            prompt = self.tokenizer.decode(e.tokens[: e.prompt_length].tolist())
        response = e.response_text
        if response is None:
            response = self.tokenizer.decode(e.tokens[e.prompt_length :].tolist())
        return prompt, response

    async def _write(self, experiences: list[Experience], cursor: Cursor | None) -> None:
        """Write to the buffer (with the cursor after this step); while it is full (nobody
        reads), say so."""
        await self._waiting(
            self.buffer.write.remote(experiences, cursor, self._token),
            lambda: (
                f"the experience buffer is full (capacity {self._capacity()}); waiting for "
                "a trainer to read"
            ),
        )

    async def _waiting(self, ref: Any, what: Any, notice_s: float = 30.0) -> Any:
        """The result of the actor call `ref`, a wait on the trainer (for weights, or for
        room in the buffer): every `notice_s` s it takes, print `what()` (why this explorer
        waits) with the time waited so far."""
        future = asyncio.wrap_future(ref.future())
        waited = 0.0
        with heartbeat.waiting(self._beat, "trainer", what()):
            while True:
                done, _ = await asyncio.wait([future], timeout=notice_s)
                if done:
                    return done.pop().result()
                waited += notice_s
                print(f"explorer {self._name!r}: {what()} ({waited:.0f} s so far)", flush=True)

    def _capacity(self) -> int:
        eb = self.cfg.buffer.trainer_input.experience_buffer
        return eb.capacity if eb is not None else 10000

    async def load_weights(self, path: str, version: int) -> None:
        """Load a saved checkpoint (a Hugging Face folder) into every engine as `version`."""
        assert self.client is not None, "prepare() first"
        await self.client.update_weights("checkpoint", [path], version)

    async def sync_to_latest(self) -> dict[str, float]:
        """Load the newest published weights if they are newer than the engines' (never waits)."""
        if self.client is None:
            return {}
        t0 = time.perf_counter()
        found = await self.synchronizer.latest.remote(self.client.model_version, reader=self._name)
        if found is None:
            return {}
        got, payload = found
        checked = await self._load(payload, got)
        return {"sync/load_s": time.perf_counter() - t0, "sync/pause_s": time.perf_counter() - t0,
                **checked}  # fmt: skip

    async def admit(self, oldest: int, newest: bool, ask: bool) -> dict[str, float]:
        """Wait until weights of train step >= `oldest` are published and load them (the newest
        published when `newest`); `ask` the trainer to publish (explorer_driven)."""
        assert self.client is not None
        t0 = time.perf_counter()
        timeout = self.cfg.synchronizer.sync_timeout
        got, payload = await self._waiting(
            self.synchronizer.wait_for.remote(oldest, timeout, ask, reader=self._name),
            lambda: (
                f"admission (max_staleness) waits for the trainer's weights v{oldest} "
                f"(synchronizer.sync_timeout={timeout} s)"
            ),
        )
        if newest:
            found = await self.synchronizer.latest.remote(got - 1, reader=self._name)
            got, payload = found or (got, payload)
        t1 = time.perf_counter()
        checked = await self._load(payload, got)
        t2 = time.perf_counter()
        return {"sync/admission_wait_s": t1 - t0, "sync/load_s": t2 - t1, "sync/pause_s": t2 - t0,
                **checked}  # fmt: skip

    async def sync_on_request(self) -> dict[str, float]:
        """explorer_driven: ask the trainer for its current weights; go on with ours when it has
        trained nothing newer (`SynchronizerActor.request`)."""
        if self.client is None:
            return {}
        t0 = time.perf_counter()
        have, timeout = self.client.model_version, self.cfg.synchronizer.sync_timeout
        found = await self._waiting(
            self.synchronizer.request.remote(have, timeout, reader=self._name),
            lambda: (
                f"asked the trainer for weights newer than v{have}; waiting for it to "
                f"publish (synchronizer.sync_timeout={timeout} s)"
            ),
        )
        if found is None:
            return {"sync/pause_s": time.perf_counter() - t0}
        t1 = time.perf_counter()
        got, payload = found
        checked = await self._load(payload, got)
        t2 = time.perf_counter()
        return {"sync/wait_s": t1 - t0, "sync/load_s": t2 - t1, "sync/pause_s": t2 - t0,
                **checked}  # fmt: skip

    async def sync_to(self, version: int) -> dict[str, float]:
        """Wait for the trainer's weights of `version` and load them into every engine.

        Returns the pause it caused to rollouts: waiting for the version, then loading it.
        """
        if version <= 0 or self.client is None or self.client.model_version >= version:
            return {}
        return await self._wait_and_load(version)

    async def share_trainer_weights(self) -> dict[str, float]:
        """A live sync method (`shared`): map the trainer's weights of the version the engines
        hold (the trainer publishes its start weights at once), so the engines drop the copy
        they loaded instead of holding it through the first train step."""
        if self.client is None:
            return {}
        return await self._wait_and_load(self.client.model_version)

    async def _wait_and_load(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        timeout = self.cfg.synchronizer.sync_timeout
        got, payload = await self._waiting(
            self.synchronizer.wait_for.remote(version, timeout, reader=self._name),
            lambda: (
                f"waiting for the trainer's weights v{version} "
                f"(synchronizer.sync_timeout={timeout} s)"
            ),
        )
        t1 = time.perf_counter()
        checked = await self._load(payload, got)
        t2 = time.perf_counter()
        return {"sync/wait_s": t1 - t0, "sync/load_s": t2 - t1, "sync/pause_s": t2 - t0,
                **checked}  # fmt: skip

    async def _load(self, payload: list[Any], version: int) -> dict[str, float]:
        """Every engine loads `payload` as `version`; each checks what it received against the
        trainer's fingerprint (`sync.fingerprint`: a mismatch raises, failing the step).
        Returns `sync/fingerprint_ok` (1: checked and equal) when the payload had one."""
        assert self.client is not None
        await self.client.update_weights(self.sync_method, payload, version)
        _, stamp = split_fingerprint(payload)
        if stamp is None:
            return {}
        self.weights_digest = stamp.digest
        return {"sync/fingerprint_ok": 1.0}

    # -- running workflows ---------------------------------------------------------------------

    def _sampling_key(self, *what: object) -> int:
        """The key of a batch of tasks' samples: seed, explorer, what and when (`_run_tasks`
        adds the task's position and try), so samples repeat with the seed whatever the timing."""
        return stable_key(seeds.rollout_seed(self.cfg), self._name, *what)

    def _train_params(self, task: Task) -> SamplingParams:
        return task_sampling(self.cfg, task, evaluating=False)

    def _eval_params(self, task: Task) -> SamplingParams:
        return task_sampling(self.cfg, task, evaluating=True)

    async def _run_tasks(
        self,
        tasks: list[Task],
        params_fn: Any,
        what: str = "explore step",
        budget: float | None = None,
        key: int | None = None,
        first: int = 0,
        train: bool = True,
    ) -> tuple[list[tuple[int, list[Experience]]], dict[str, float]]:
        """Run every task's workflow concurrently (bounded by `runner_per_model` per engine).

        `key`: the batch's sampling key; task i's try a samples with stable_key(key, first + i,
        a) (`TaskModelHandle`).

        A task that fails every try (`max_retry_times` retries, each bounded by `max_timeout`)
        is dropped and counted. When more than `max_failure_fraction` of the tasks fail (or
        more than `budget` tasks, when given), the step raises with the first failure's tracebacks: a
        broken workflow fails loudly, a flaky environment does not end a long run. Returns
        ([(position in `tasks`, its experiences) for each task kept], counts). `train`: the
        experiences are trained (`explorer.malformed_tool_calls` applies), not evaluated.
        """
        assert self.client is not None
        ecfg = self.cfg.explorer
        limit = asyncio.Semaphore(max(1, ecfg.runner_per_model * len(self.engines)))
        counts = {"retries": 0, "timeouts": 0, "prompt_truncated": 0, **LedgerStats().metrics()}

        async def one(i: int, task: Task) -> list[Experience] | WorkflowFailed:
            async with limit:
                try:
                    task_key = None if key is None else stable_key(key, first + i)
                    return await self._run_with_retry(
                        task, params_fn(task), counts, task_key, train
                    )
                except WorkflowFailed as e:
                    return e

        results = list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))
        failed = [r for r in results if isinstance(r, WorkflowFailed)]
        if budget is None:
            budget = ecfg.max_failure_fraction * len(tasks)
        if len(failed) > budget:
            raise WorkflowFailed(
                f"{what}: {len(failed)} of {len(tasks)} tasks failed, more than "
                f"explorer.max_failure_fraction={ecfg.max_failure_fraction}. First failure:\n"
                f"{failed[0]}"
            )
        stats = {
            "failed_tasks": float(len(failed)),
            "retries": float(counts["retries"]),
            "timeouts": float(counts["timeouts"]),
            # experiences built on a prompt cut to max_prompt_tokens: zero action mask
            "prompt_truncated": float(counts["prompt_truncated"]),
            # the exact-token ledgers of the tasks kept: calls, segments opened, drift, forks
            **{k: float(counts[k]) for k in LedgerStats().metrics()},
        }
        kept = [(i, r) for i, r in enumerate(results) if not isinstance(r, WorkflowFailed)]
        return kept, stats

    async def _run_with_retry(
        self,
        task: Task,
        params: SamplingParams,
        counts: dict[str, int],
        key: int | None = None,
        train: bool = True,
    ) -> list[Experience]:
        ecfg = self.cfg.explorer
        name = task.workflow_type or self.cfg.buffer.explorer_input.default_workflow_type
        workflow_cls = WORKFLOW.get(name)
        errors = []
        m = self.cfg.model
        cut_to = m.max_prompt_tokens if m.enable_prompt_truncation else None
        heartbeat.CURRENT.set(self._beat)  # this task's context: its workflow's waits are ours
        for attempt in range(ecfg.max_retry_times + 1):
            if attempt > 0:
                counts["retries"] += 1
            publisher = None  # each session of this try (the task's, and those it opens)
            if self.endpoint is not None and self.sessions is not None:
                from trinity.endpoint.server import SessionPublisher  # imported by `prepare`

                publisher = SessionPublisher(self.sessions, self.endpoint.url)
            try_key = None if key is None else stable_key(key, attempt)
            session = uuid.uuid4().hex  # this try's session on the auxiliary models' endpoints
            auxiliary = None
            if self.auxiliary is not None:  # the try's handles, keyed by the try
                auxiliary = (self.auxiliary, self.auxiliary.handles(try_key, session))
                for model in self.auxiliary:
                    if model.sessions is not None:
                        model.sessions.sessions[session] = auxiliary[1][model.index]
            handle = TaskModelHandle(
                self.client,
                self.tokenizer,
                params,
                chat_template_kwargs(self.cfg),
                key=try_key,
                max_prompt_tokens=cut_to,
                auxiliary=auxiliary,
                publish=publisher,
                reasoning_parser=ecfg.rollout_model.reasoning_parser,
            )
            try:
                workflow = workflow_cls(**task.workflow_args)
                exps = await asyncio.wait_for(workflow.run(task, handle), ecfg.max_timeout)
                heartbeat.progress(self._beat)
                counts["prompt_truncated"] += finish_experiences(self.cfg, exps, handle, train)
                for k, v in handle.ledger_stats().metrics().items():
                    counts[k] += v
                return exps
            except TimeoutError:
                counts["timeouts"] += 1
                errors.append(f"try {attempt + 1}: timed out after {ecfg.max_timeout}s")
            except Exception:
                errors.append(f"try {attempt + 1}:\n{traceback.format_exc()}")
            finally:
                if publisher is not None:
                    publisher.close()
                for model in self.auxiliary or ():
                    if model.sessions is not None:
                        model.sessions.sessions.pop(session, None)
        raise WorkflowFailed(
            f"workflow {name!r} failed on task {task.index} of {task.taskset_name!r} "
            f"after {ecfg.max_retry_times + 1} tries:\n" + "\n".join(errors)
        )

    async def shutdown(self) -> None:
        if self.data_juicer is not None:
            self.data_juicer.stop()
        if self.serve_mode is not None:
            await self.serve_mode.stop()
        if self.endpoint is not None:
            await self.endpoint.stop()
            self.endpoint = None
        for server in self.aux_endpoints:
            await server.stop()
        self.aux_endpoints = []
        for e in [*self.engines, *(e for pool in self.aux_engines.values() for e in pool)]:
            if isinstance(e, InThread):
                e.close()
            else:
                ray.kill(e)
        self.engines, self.aux_engines = [], {}
        if self.own_pools is not None:  # tensor-parallel engines' placement groups
            self.own_pools.release()


def finish_experiences(
    cfg: Any, experiences: list[Experience], handle: TaskModelHandle, train: bool
) -> int:
    """What the explorer does to a task's experiences when its workflow returns them: zero the
    action mask of those built on a truncated prompt (`mask_prompt_truncated`; returns how
    many) and, when they are to be trained, apply `explorer.malformed_tool_calls`."""
    cut = (
        mask_prompt_truncated(experiences, handle.truncated_prompts)
        if handle.truncated_prompts
        else 0
    )
    if train:
        apply_configured_policy(cfg, experiences)
    return cut


def task_sampling(cfg: Any, task: Task, evaluating: bool) -> SamplingParams:
    """How a task is sampled: its taskset's `rollout_args` over `model.*`; training draws
    `repeat_times` samples at the model's temperature; evaluation draws `rollout_args.n` (else
    the eval set's `repeat_times`, else 1) samples, greedy when one (n identical greedy answers
    would measure nothing: several are drawn at `model.temperature` unless the set names one)."""
    m, ra = cfg.model, task.rollout_args
    if evaluating:
        n = ra.get("n") or task.repeat_times or 1
        temperature = _first(ra.get("temperature"), 0.0 if n == 1 else m.temperature)
    else:
        n = ra.get("n") or task.repeat_times or cfg.algorithm.repeat_times
        temperature = _first(ra.get("temperature"), m.temperature)
    return SamplingParams(
        n=n,
        temperature=temperature,
        top_p=_first(ra.get("top_p"), m.top_p),
        top_k=_first(ra.get("top_k"), m.top_k),
        max_tokens=_first(ra.get("max_tokens"), m.max_response_tokens, 64),
        logprobs=_first(ra.get("logprobs"), m.logprobs, 0),
    )


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)
