"""The Explorer: runs workflows on tasks against the rollout engines and fills the buffer.

It never calls the trainer. It meets it through the buffer (experiences out) and the synchronizer
(weights in), on the schedule of `trinity.sync.schedule`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import traceback
from collections.abc import Iterator
from typing import Any

import ray

from trinity.common.experience import EID, Experience
from trinity.config import seeds
from trinity.config.resolved import resolve
from trinity.explorer.engine import HFRolloutEngine, SamplingParams
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.models import load_tokenizer, resolve_model_path
from trinity.sync.schedule import explorer_syncs_after, weights_version_after_explore_step
from trinity.tasks import Task, load_taskset, make_selector
from trinity.workflows import WORKFLOW


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
    ) -> None:
        self.cfg = config
        self.model_path = resolve_model_path(model_path)
        self.buffer = buffer
        self.synchronizer = synchronizer
        self.hub = hub
        self.step_offset = step_offset
        self.engines: list[Any] = []
        self.client: BatchingClient | None = None
        self.tokenizer = None
        self.train_tasks: list[Task] = []
        self.eval_tasksets: dict[str, list[Task]] = {}
        self.last_eval: dict[str, float] = {}

    # -- set-up --------------------------------------------------------------------------------

    async def prepare(self, with_train_tasks: bool = True) -> dict[str, int]:
        """Start the engines, load tasksets. Returns task counts (for step planning)."""
        cfg, rm = self.cfg, self.cfg.explorer.rollout_model
        engine_type = resolve(cfg).engine_type  # unset = the best available here
        if engine_type != "transformers":
            raise ValueError(
                f"explorer.rollout_model.engine_type={engine_type!r} is not available yet; "
                "use 'transformers'"
            )
        engine_cls = ray.remote(HFRolloutEngine)
        self.engines = [
            engine_cls.options(num_cpus=0, name=None).remote(
                self.model_path,
                dtype=rm.dtype,
                seed=seeds.engine_seed(cfg, i),
                max_batch_size=rm.max_batch_size,
                max_model_len=cfg.model.max_model_len,
                num_threads=cfg.trainer.num_threads,
                custom_chat_template=cfg.model.custom_chat_template,
            )
            for i in range(rm.engine_num)
        ]
        await asyncio.gather(*(e.get_stats.remote() for e in self.engines))  # wait until loaded
        self.client = BatchingClient(self.engines)
        self.tokenizer = load_tokenizer(
            self.model_path, custom_chat_template=cfg.model.custom_chat_template
        )
        inp = cfg.buffer.explorer_input
        if with_train_tasks:
            for ts in [inp.taskset, *inp.tasksets]:
                if ts is not None:
                    self.train_tasks += load_taskset(
                        ts,
                        is_eval=False,
                        default_workflow_type=inp.default_workflow_type,
                        default_reward_fn_type=inp.default_reward_fn_type,
                        default_seed=cfg.seed,
                    )
        for i, ts in enumerate(inp.eval_tasksets):
            name = ts.name or f"eval{i}"
            self.eval_tasksets[name] = load_taskset(
                ts,
                is_eval=True,
                default_workflow_type=inp.default_eval_workflow_type or inp.default_workflow_type,
                default_reward_fn_type=inp.default_reward_fn_type,
                default_seed=cfg.seed,
            )
        return {"train_tasks": len(self.train_tasks)}

    def _batches(self) -> Iterator[list[Task]]:
        inp = self.cfg.buffer.explorer_input
        selector_cfg = (inp.taskset or inp.tasksets[0]).data_selector
        selector = make_selector(selector_cfg, default_seed=self.cfg.seed)
        return selector.batches(
            self.train_tasks, self.cfg.buffer.batch_size, self.cfg.buffer.total_epochs
        )

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, total_steps: int, sync: bool = True) -> dict[str, Any]:
        """Explore `total_steps` steps, syncing weights on schedule; then close the buffer.

        `sync=False` (mode explore: no trainer in this run) keeps the starting weights.

        1. evaluate at start (`explorer.eval_on_startup`)
        2. per step: sync weights if the schedule says so, run the batch's workflows, write the
           experiences, report metrics, evaluate every `eval_interval` steps
        3. close the buffer so the trainer drains it and stops
        """
        scfg, ecfg = self.cfg.synchronizer, self.cfg.explorer
        # 1.
        if ecfg.eval_on_startup and self.eval_tasksets:
            await self.evaluate(step=0)
        batches = self._batches()
        step = 0
        try:
            for step in range(1, total_steps + 1):
                # 2.
                if step > 1 and explorer_syncs_after(
                    step - 1, scfg.sync_interval, scfg.sync_offset
                ):
                    await self.sync_to(
                        weights_version_after_explore_step(
                            step - 1, scfg.sync_interval, scfg.sync_offset
                        )
                    )
                tasks = next(batches, None)
                if tasks is None:
                    break
                metrics = await self.explore_step(step, tasks)
                if ecfg.eval_interval > 0 and step % ecfg.eval_interval == 0 and step < total_steps:
                    metrics.update(await self.evaluate(step, report=False))
                await self.hub.put.remote("explorer", self.step_offset + step, metrics)
        finally:
            # 3.
            await self.buffer.close.remote()
        return {"explore_steps": step}

    async def explore_step(self, step: int, tasks: list[Task]) -> dict[str, float]:
        t0 = time.perf_counter()
        per_task = await self._run_tasks(tasks, self._train_params)
        experiences: list[Experience] = []
        for i, (task, exps) in enumerate(zip(tasks, per_task, strict=True)):
            for e in exps:
                e.eid = EID(
                    batch=step, task=i, run=e.eid.run, step=e.eid.step, suffix=task.taskset_name
                )
                experiences.append(e)
        if not experiences:
            raise RuntimeError(f"explore step {step}: the workflows returned no experiences")
        await self.buffer.write.remote(experiences)
        elapsed = time.perf_counter() - t0
        return {
            **rollout_metrics(experiences, prefix="rollout/"),
            "rollout/tasks": float(len(tasks)),
            "rollout/tokens_per_s": sum(e.response_length for e in experiences) / elapsed,
            "rollout/model_version": float(self.client.model_version),
            "timing/explore_step": elapsed,
        }

    async def evaluate(
        self, step: int, report: bool = True, source: str = "explorer"
    ) -> dict[str, float]:
        """Greedy (unless the eval taskset's rollout_args say otherwise) pass over each eval set."""
        metrics: dict[str, float] = {}
        for name, tasks in self.eval_tasksets.items():
            t0 = time.perf_counter()
            per_task = await self._run_tasks(tasks, self._eval_params)
            exps = [e for es in per_task for e in es]
            m = rollout_metrics(exps, prefix="")
            acc_key = "accuracy_mean" if "accuracy_mean" in m else "reward_mean"
            metrics[f"eval/{name}/accuracy"] = m[acc_key]
            metrics[f"eval/{name}/reward_mean"] = m["reward_mean"]
            metrics[f"eval/{name}/response_length"] = m["response_length"]
            metrics[f"timing/eval_{name}"] = time.perf_counter() - t0
        self.last_eval = {k: v for k, v in metrics.items() if k.endswith("/accuracy")}
        if report:
            await self.hub.put.remote(source, self.step_offset + step, metrics)
        return metrics

    async def sync_to(self, version: int) -> None:
        """Wait for the trainer's weights of `version` and load them into every engine."""
        if version <= 0 or self.client is None or self.client.model_version >= version:
            return
        got, payload = await self.synchronizer.wait_for.remote(
            version, self.cfg.synchronizer.sync_timeout
        )
        await self.client.update_weights(payload[0], got)

    # -- running workflows ---------------------------------------------------------------------

    def _train_params(self, task: Task) -> SamplingParams:
        m, ra = self.cfg.model, task.rollout_args
        return SamplingParams(
            n=ra.get("n") or task.repeat_times or self.cfg.algorithm.repeat_times,
            temperature=_first(ra.get("temperature"), m.temperature),
            top_p=_first(ra.get("top_p"), m.top_p),
            top_k=_first(ra.get("top_k"), m.top_k),
            max_tokens=_first(ra.get("max_tokens"), m.max_response_tokens, 64),
        )

    def _eval_params(self, task: Task) -> SamplingParams:
        m, ra = self.cfg.model, task.rollout_args
        return SamplingParams(
            n=ra.get("n") or 1,
            temperature=_first(ra.get("temperature"), 0.0),
            top_p=_first(ra.get("top_p"), m.top_p),
            top_k=_first(ra.get("top_k"), m.top_k),
            max_tokens=_first(ra.get("max_tokens"), m.max_response_tokens, 64),
        )

    async def _run_tasks(self, tasks: list[Task], params_fn: Any) -> list[list[Experience]]:
        assert self.client is not None
        ecfg = self.cfg.explorer
        limit = asyncio.Semaphore(max(1, ecfg.runner_per_model * len(self.engines)))

        async def one(task: Task) -> list[Experience]:
            async with limit:
                return await self._run_with_retry(task, params_fn(task))

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def _run_with_retry(self, task: Task, params: SamplingParams) -> list[Experience]:
        ecfg = self.cfg.explorer
        name = task.workflow_type or self.cfg.buffer.explorer_input.default_workflow_type
        workflow_cls = WORKFLOW.get(name)
        handle = TaskModelHandle(self.client, self.tokenizer, params)
        errors = []
        for attempt in range(ecfg.max_retry_times + 1):
            try:
                workflow = workflow_cls(**task.workflow_args)
                return await asyncio.wait_for(workflow.run(task, handle), ecfg.max_timeout)
            except TimeoutError:
                errors.append(f"try {attempt + 1}: timed out after {ecfg.max_timeout}s")
            except Exception:
                errors.append(f"try {attempt + 1}:\n{traceback.format_exc()}")
        raise WorkflowFailed(
            f"workflow {name!r} failed on task {task.index} of {task.taskset_name!r} "
            f"after {ecfg.max_retry_times + 1} tries:\n" + "\n".join(errors)
        )

    async def shutdown(self) -> None:
        for e in self.engines:
            ray.kill(e)
        self.engines = []


def rollout_metrics(experiences: list[Experience], prefix: str) -> dict[str, float]:
    """Mean/std reward, mean of every reward component, length, truncation, flat-group share."""
    rewards = [e.reward or 0.0 for e in experiences]
    out = {
        f"{prefix}reward_mean": statistics.fmean(rewards),
        f"{prefix}reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        f"{prefix}response_length": statistics.fmean(e.response_length for e in experiences),
        f"{prefix}truncated_frac": statistics.fmean(float(e.truncated) for e in experiences),
    }
    components = sorted({k for e in experiences for k in e.metrics})
    for k in components:
        out[f"{prefix}{k}_mean"] = statistics.fmean(e.metrics.get(k, 0.0) for e in experiences)
    groups: dict[tuple, list[float]] = {}
    for e, r in zip(experiences, rewards, strict=True):
        groups.setdefault(e.eid.group, []).append(r)
    multi = [g for g in groups.values() if len(g) > 1]
    if multi:
        out[f"{prefix}flat_group_frac"] = statistics.fmean(float(len(set(g)) == 1) for g in multi)
    return out


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)
