"""Offline pass rates for `benchmarks/curriculum.py --reference`: BOTS's reference column.

    .venv/bin/python benchmarks/curriculum_reference.py --config run.yaml --out tasks.jsonl

BOTS reads each task's offline pass rate under reference models (`feature_keys`); here the one
reference is the policy the GRPO stage starts from (the SFT model): every task of the config's
taskset is run through its workflow and reward with the config's sampling (`repeat_times`
samples at the rollout temperature), by one engine in this process as `trinity debug workflow`
does, and the task's rows are written as JSON lines with `sft_pass_rate`, the mean reward of
its samples. Costs one pass over the taskset before training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from trinity.common.keys import stable_key
from trinity.common.rollout import engine_class, pool_kwargs
from trinity.config import load_config, seeds, stage_configs
from trinity.config.resolved import chat_template_kwargs, resolve
from trinity.explorer.explorer import finish_experiences, task_sampling
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.tasks import load_taskset
from trinity.workflows import WORKFLOW

COLUMN = "sft_pass_rate"


def pass_rates(config: Path) -> list[dict]:
    """Each task row of the config's (first stage's) taskset with its `sft_pass_rate`."""
    cfg = stage_configs(load_config(config, []))[0]
    rm = cfg.explorer.rollout_model
    engine_cls = engine_class(resolve(cfg).engine_type)
    engine = engine_cls(
        seeds.model_path(cfg),
        dtype=rm.dtype,
        seed=seeds.engine_seed(cfg, 0),
        max_model_len=cfg.model.max_model_len,
        custom_chat_template=cfg.model.custom_chat_template,
        **pool_kwargs(engine_cls, rm),
    )
    client = BatchingClient([InProcess(engine)])
    inp = cfg.buffer.explorer_input
    tasks = load_taskset(
        inp.taskset,
        is_eval=False,
        default_workflow_type=inp.default_workflow_type,
        default_reward_fn_type=inp.default_reward_fn_type,
        default_seed=cfg.seed,
    )

    async def rate(task) -> float:
        key = stable_key(seeds.rollout_seed(cfg), "reference", task.index)
        handle = TaskModelHandle(
            client, engine.tokenizer, task_sampling(cfg, task, evaluating=False),
            chat_template_kwargs(cfg), key=key,
        )  # fmt: skip
        exps = await WORKFLOW.get(task.workflow_type or "")(**task.workflow_args).run(task, handle)
        finish_experiences(cfg, exps, handle, train=True)
        return statistics.fmean(float(e.reward or 0.0) for e in exps)

    async def main() -> list[float]:
        return list(await asyncio.gather(*(rate(t) for t in tasks)))

    return [{**t.raw, COLUMN: r} for t, r in zip(tasks, asyncio.run(main()), strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="a run config (its first stage)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines to write")
    args = ap.parse_args()
    rows = pass_rates(args.config)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} tasks, mean {COLUMN} {statistics.fmean(r[COLUMN] for r in rows):.3f}")


if __name__ == "__main__":
    main()
