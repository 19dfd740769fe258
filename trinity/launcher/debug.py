"""`trinity debug workflow`: run one task's workflow in this process and show what it trains.

    trinity debug workflow --config x.yaml [--task 3] [--eval] [--out exps.jsonl]

One engine in this process (no Ray), the config's model, workflow, reward and sampling (and one
engine per served auxiliary model, reached as in the explorer by `model.auxiliary(i)`; their
OpenAI clients are not served here); the task is row `--task` of the first taskset (or eval
taskset). Prints each experience as a
transcript: the prompt dim, trained tokens (action mask 1) green, tokens the model did not
sample (tool or environment turns, mask 0) yellow, then its reward and metrics; saves the
experiences as JSON lines (`Experience.to_dict`) when `--out` is given.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from trinity.common.experience import Experience
from trinity.common.keys import stable_key
from trinity.common.rollout import engine_class, pool_kwargs, run_kwargs, takes_messages
from trinity.config import seeds
from trinity.config.resolved import BEST_ENGINE, chat_template_kwargs, resolve
from trinity.explorer import workflow_env
from trinity.explorer.auxiliary import (
    AuxiliaryModels,
    auxiliary_limits,
    auxiliary_model,
    served_auxiliary,
    why_not_served,
)
from trinity.explorer.explorer import finish_experiences, task_sampling
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.tasks import Task, load_taskset
from trinity.workflows import WORKFLOW


def pick_task(cfg: Any, index: int, evaluating: bool) -> Task:
    """Row `index` of the config's first taskset (eval taskset); ValueError naming the problem."""
    inp = cfg.buffer.explorer_input
    storages = list(inp.eval_tasksets) if evaluating else [inp.taskset, *inp.tasksets]
    storages = [s for s in storages if s is not None]
    if not storages:
        what = "eval_tasksets" if evaluating else "taskset"
        raise ValueError(f"the config has no buffer.explorer_input.{what} to take a task from")
    workflow = (inp.default_eval_workflow_type if evaluating else None) or inp.default_workflow_type
    tasks = load_taskset(
        storages[0],
        is_eval=evaluating,
        default_workflow_type=workflow,
        default_reward_fn_type=inp.default_reward_fn_type,
        default_seed=cfg.seed,
    )
    if not 0 <= index < len(tasks):
        raise ValueError(f"--task {index}: the taskset has tasks 0 to {len(tasks) - 1}")
    return tasks[index]


def run_one(cfg: Any, task: Task) -> tuple[list[Experience], Any]:
    """The task's experiences, sampled by one in-process engine; and the tokenizer."""
    workflow_env.apply(cfg)  # explorer.env_vars: the workflow runs in this process
    rm = cfg.explorer.rollout_model
    engine_cls = engine_class(resolve(cfg).engine_type)
    engine = engine_cls(
        seeds.model_path(cfg),
        dtype=rm.dtype,
        seed=seeds.engine_seed(cfg, 0),
        max_model_len=cfg.model.max_model_len,
        custom_chat_template=cfg.model.custom_chat_template,
        **pool_kwargs(engine_cls, rm),
        **run_kwargs(engine_cls, cfg),
    )
    aux_engines = {}
    for i in served_auxiliary(cfg):
        aux = cfg.explorer.auxiliary_models[i]
        aux_cls = engine_class(aux.engine_type or BEST_ENGINE[0])
        aux_engines[i] = aux_cls(
            seeds.model_path(cfg, aux.model_path),
            dtype=aux.dtype,
            seed=seeds.auxiliary_seed(cfg, i),
            max_model_len=auxiliary_limits(cfg, i)[0],
            **pool_kwargs(aux_cls, aux),
        )
    m = cfg.model

    async def main() -> list[Experience]:
        key = stable_key(seeds.rollout_seed(cfg), "debug", task.index)
        auxiliary = None
        if aux_engines:
            models = AuxiliaryModels(
                [
                    auxiliary_model(cfg, i, BatchingClient([InProcess(e)]), e.tokenizer)
                    for i, e in aux_engines.items()
                ],
                list(cfg.explorer.auxiliary_models),
                why_not_served(cfg),
            )
            auxiliary = (models, models.handles(key, None))
        client = BatchingClient([InProcess(engine)], messages=takes_messages(engine_cls, cfg))
        server = publisher = None
        if rm.enable_openai_api:  # the explorer's endpoint, on this loop, for this one task
            from trinity.endpoint.server import SessionPublisher, rollout_model_endpoint

            sessions, server = rollout_model_endpoint(cfg, engine.tokenizer, client)
            publisher = SessionPublisher(sessions, await server.start())
        try:
            handle = TaskModelHandle(
                client,
                engine.tokenizer,
                task_sampling(cfg, task, evaluating=task.is_eval),
                chat_template_kwargs(cfg),
                key=key,
                max_prompt_tokens=m.max_prompt_tokens if m.enable_prompt_truncation else None,
                auxiliary=auxiliary,
                publish=publisher,
                reasoning_parser=rm.reasoning_parser,
            )
            workflow = WORKFLOW.get(task.workflow_type or "")(**task.workflow_args)
            exps = await workflow.run(task, handle)
            finish_experiences(cfg, exps, handle, train=not task.is_eval)  # as the explorer
            return exps
        finally:
            if server is not None:
                await server.stop()

    return asyncio.run(main()), engine.tokenizer


def transcript(exp: Experience, tokenizer: Any) -> Text:
    """The experience's tokens as text, styled by what the trainer does with them."""
    out = Text(tokenizer.decode(exp.tokens[: exp.prompt_length].tolist()), style="dim")
    mask = exp.action_mask.tolist() if exp.action_mask is not None else []
    response = exp.response_tokens.tolist()
    start = 0
    for i in range(1, len(response) + 1):  # runs of equal mask
        if i == len(response) or mask[i] != mask[start]:
            style = "bold green" if mask[start] else "yellow"
            out.append(tokenizer.decode(response[start:i]), style=style)
            start = i
    return out


def debug_workflow(
    cfg: Any, index: int, evaluating: bool, out: Path | None, console: Console
) -> list[Experience]:
    task = pick_task(cfg, index, evaluating)
    console.print(
        f"task {task.index} of {task.taskset_name!r}: workflow {task.workflow_type!r}, "
        f"reward {task.reward_fn_type!r}",
        soft_wrap=True,
    )
    exps, tokenizer = run_one(cfg, task)
    for i, exp in enumerate(exps):
        trained = int(exp.action_mask.sum()) if exp.action_mask is not None else 0
        console.rule(
            f"experience {i}: {exp.kind.value}, reward {exp.reward}, {trained} of "
            f"{exp.response_length} response tokens trained"
        )
        console.print(transcript(exp, tokenizer), soft_wrap=True)
        if exp.metrics:
            console.print(f"metrics {json.dumps(exp.metrics)}", soft_wrap=True)
        if exp.info.get(
            "tool_calls"
        ):  # each turn's tool-call parse (explorer.malformed_tool_calls)
            console.print(
                f"tool calls per turn {json.dumps(exp.info['tool_calls'])}", soft_wrap=True
            )
    console.print("[dim]legend: prompt dim, trained tokens green, not trained yellow[/]")
    if out is not None:
        out.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in exps), encoding="utf-8")
        console.print(f"saved {len(exps)} experiences to {out}", soft_wrap=True)
    return exps
