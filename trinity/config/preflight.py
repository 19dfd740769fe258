"""Pre-flight: everything about a config that can be known before anything starts.

`load_config` checks the config's shape and stays pure (no I/O). This second pass needs the code
and the file system; `trinity validate` and `trinity run` both perform it, `run` before Ray
starts, so a config that validates does not fail later for any reason known here. It checks the
base config and every stage (problems located under `stages[i].`):

1. features not built yet (`support.not_built_problems`), and the keys that do not apply to this
   build (`support.not_applicable_notes`, printed as notes, not problems);
2. registry names: algorithm_type and its pieces, workflows, reward fns, synthetic generators
   (and a generator's own `arg_problems`, e.g. reasoning-gym's dataset names and options),
   the tool-call parsers; the auxiliary models a workflow's arguments name
   (`auxiliary_keys`, e.g. a judge's) are served;
   a dotted path (`my_pkg.mod.Fn`) is imported here, and a failed import is a problem;
3. every `*_args` key against the parameters of the function or class it is passed to, with the
   accepted names and a did-you-mean (a callee taking `**kwargs` accepts any key);
4. model folders exist (`tiny://` URLs only have to parse: they are built on first use), a
   tensor-parallel engine's size divides its model's heads and MLP width, and with sequence
   parallelism the trained models' heads split over its ranks; `model.external_model`'s
   endpoint answers (its URL, its key, the model name it serves); a Data-Juicer (the server
   of `service.data_juicer`, or `dj-process`) runs the recipe ops not built here, and that
   server, where a recipe needs it, can start (a Data-Juicer environment) or answers as ours
   (`data.checks.data_juicer_service_report`);
5. every taskset and dataset the run reads is loaded with the runtime's own loader
   (`load_taskset`, the same arguments as the explorer and trainer pass), so each bad row is
   reported as `file:line: problem`, or, with `skip_bad_rows: true`, counted;
6. the monitor backends `monitor_type` names are installed, and each `monitor_args` key is one
   that a backend in use reads (`trinity.monitor.backends.config_problems`); `peft` is
   installed when a stage sets `model.lora_configs`.

    report = preflight(cfg)
    report.problems  # list[Problem]; any = exit 2 with nothing started
    report.notes     # notes: keys not applicable here, how some act here
    report.skipped   # one line per dataset whose bad rows will be skipped
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from trinity.common.registry import keyword_names
from trinity.config.buffer_schema import EXPERIENCE_FILE_SUFFIXES, ExplorerInput, StorageConfig
from trinity.config.checks import Loc, blocked
from trinity.config.loader import merge_stages, per_stage, valid_stages
from trinity.config.problems import Problem, suggest
from trinity.config.run_folder import trains_from_queue, writes_experience_file
from trinity.config.schema import AlgorithmConfig, TrinityConfig
from trinity.config.support import not_applicable_notes, not_built_problems
from trinity.monitor.backends import config_problems as monitor_problems
from trinity.trainer.optim import no_budget_problem

MAX_ROWS_SHOWN = 10  # bad rows listed per dataset; the rest are counted
Loaded = tuple[str, str | None, list[str], int]  # (key of the error, error, bad rows, tasks)


@dataclass
class PreflightReport:
    """What pre-flight found: problems (exit 2), notes and skipped-row counts (printed)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def preflight(cfg: TrinityConfig, skip: Sequence[Loc] = ()) -> PreflightReport:
    """Check `cfg` (from `load_config`) and each of its stages; see the module docstring.

    A problem that the base config and a stage share is reported once, under the base's path.

    Args:
        cfg: a loaded config, or the partial config of one that failed the schema
            (`ConfigError.partial`): every part whose schema is valid is checked, so one report
            holds every problem.
        skip: key paths that failed the schema (`ConfigError.removed`); the steps reading
            them are left out (their stand-in defaults would give knock-on problems).
    """
    cache: dict[str, Loaded] = {}
    reports = per_stage(cfg, lambda c: _check_one(c, cache, skip if c is cfg else ()))
    problems, skipped = (merge_stages([(at, r[i]) for at, r in reports]) for i in (0, 1))
    report = PreflightReport(not_built_problems(cfg) + problems, not_applicable_notes(cfg), skipped)
    stages, last = dict(valid_stages(cfg)), len(cfg.stages) - 1
    if cfg.explorer.env_vars and cfg.cluster.one_process is not False:
        from trinity.explorer.workflow_env import ONE_PROCESS_NOTE

        report.notes.append(ONE_PROCESS_NOTE)
    # 4. the Data-Juicer server (one serves every stage), where a recipe needs Data-Juicer
    if cfg.service.data_juicer is not None and not blocked(skip, "service.data_juicer"):
        from trinity.data.checks import data_juicer_service_report

        found_dj, notes = data_juicer_service_report(cfg)
        report.problems += [Problem(p, why) for p, why in found_dj]
        report.notes += notes
    # 6. the monitor backends: installed, and their arguments (one monitor serves every stage)
    if not blocked(skip, "monitor"):
        found, notes = monitor_problems(cfg.monitor)
        report.problems += found
        report.notes += notes
    lora_at = [
        p
        for p, c in [("", cfg), *((f"stages[{i}].", c) for i, c in stages.items())]
        if c.model.lora_configs
    ]
    if lora_at and importlib.util.find_spec("peft") is None:
        report.problems.append(
            Problem(
                f"{lora_at[0]}model.lora_configs",
                "LoRA trains through peft, which is not installed: pip install 'trinity[lora]'",
            )
        )
    for i, stage in stages.items():
        if stage.monitor != cfg.monitor:
            report.problems.append(
                Problem(
                    f"stages[{i}].monitor", "one monitor serves the whole run: set it at the top"
                )
            )
    if (
        cfg.mode == "bench"
        and last in stages
        and not stages[last].buffer.explorer_input.eval_tasksets
    ):
        report.problems.append(
            Problem(
                f"stages[{last}].buffer.explorer_input.eval_tasksets",
                "mode 'bench' on a staged config evaluates the run's checkpoints on the last "
                "stage's eval tasksets: it has none",
            )
        )
    return report


def _check_one(
    cfg: TrinityConfig, cache: dict[str, Loaded], skip: Sequence[Loc] = ()
) -> tuple[list[Problem], list[str]]:
    """Steps 2-5 of the module docstring on one (stage) config, leaving out the steps that read
    a key path in `skip`: (problems, skipped-row lines)."""
    problems: list[Problem] = []
    skipped: list[str] = []
    # 2. and 3.
    if not blocked(skip, "algorithm", "buffer.trainer_input.auxiliary_buffers"):
        problems += _algorithm_problems(
            cfg.algorithm, list(cfg.buffer.trainer_input.auxiliary_buffers)
        )
    if not blocked(skip, "algorithm", "synchronizer"):
        problems += _staleness_problems(cfg)
    pools = [("rollout_model", cfg.explorer.rollout_model)]
    pools += [(f"auxiliary_models[{i}]", m) for i, m in enumerate(cfg.explorer.auxiliary_models)]
    for at, pool in pools:
        where = f"explorer.{at}.tool_call_parser"
        if pool.tool_call_parser and not blocked(skip, where):
            from trinity.endpoint.tool_calls import TOOL_CALL_PARSER

            problems += _lookup(TOOL_CALL_PARSER, pool.tool_call_parser, where)[1]
        where = f"explorer.{at}.reasoning_parser"
        if pool.reasoning_parser and not blocked(skip, where):
            from trinity.common.reasoning import REASONING_PARSER

            problems += _lookup(REASONING_PARSER, pool.reasoning_parser, where)[1]
    if not blocked(skip, "data_processor.experience_pipeline"):
        problems += _operator_problems(cfg)
    if not blocked(skip, "data_processor.task_pipeline", "explorer.auxiliary_models"):
        from trinity.data.checks import task_pipeline_problems

        problems += [Problem(p, why) for p, why in task_pipeline_problems(cfg, _served(cfg))]
    # 4.
    problems += [p for p in _model_problems(cfg) if not blocked(skip, p.path)]
    problems += [p for p in _tensor_parallel_problems(cfg) if not blocked(skip, p.path)]
    if cfg.model.external_model.enable and not blocked(skip, "model.external_model", "mode"):
        problems += _external_model_problems(cfg)
    if not blocked(skip, "trainer", "model", "algorithm.algorithm_type"):
        problems += _sequence_parallel_problems(cfg)
    where = "trainer.malloc_mmap_threshold_mb"
    if cfg.trainer.malloc_mmap_threshold_mb is not None and not blocked(skip, where):
        from trinity.common.memory import can_set_mmap_threshold

        if not can_set_mmap_threshold():
            problems.append(Problem(where, "glibc's malloc only (Linux); this platform has none"))
    where = "cluster.one_process"
    if (
        cfg.cluster.one_process
        and cfg.cluster.gpu_per_node is None
        and not blocked(skip, where)
        and gpu_driver_present()
    ):
        import torch  # what Ray will see: the check refuses an explicit gpu_per_node itself

        if torch.cuda.is_available():
            problems.append(
                Problem(
                    where,
                    f"not built yet on GPUs: this machine has {torch.cuda.device_count()} CUDA "
                    "GPU(s), which Ray gives the run's compute objects; set "
                    "cluster.gpu_per_node: 0 to run on CPUs, or leave one_process off",
                )
            )
    where = "cluster.colocate"
    vllm = cfg.explorer.rollout_model.engine_type == "vllm"
    if cfg.cluster.colocate and vllm and not blocked(skip, where, "explorer.rollout_model"):
        on_cpu = cfg.cluster.gpu_per_node == 0 or not gpu_driver_present()
        if on_cpu:  # as `launcher.placement.colocated_config` refuses it when the run starts
            problems.append(
                Problem(
                    where,
                    "with explorer.rollout_model.engine_type vllm on CPUs: vLLM's sleep mode "
                    "needs CUDA, so its engines cannot give the device to the trainer; use "
                    "engine_type transformers, or cluster.colocate: false",
                )
            )
    # 2., 3. and 5. for what the explorer reads
    inp = cfg.buffer.explorer_input
    storages = inp.storages(training=cfg.mode in ("both", "explore"))
    storages = [s for s in storages if not blocked(skip, s[0])]
    keys = ("workflow_type", "eval_workflow_type", "reward_fn_type")
    if blocked(skip, *(f"buffer.explorer_input.default_{k}" for k in keys), "seed"):
        storages = []
    for key in keys if storages else ():
        name = getattr(inp, f"default_{key}")
        problems += (
            _lookup(_registry(key), name, f"buffer.explorer_input.default_{key}")[1] if name else []
        )
    served = None if blocked(skip, "explorer.auxiliary_models", "algorithm") else _served(cfg)
    openai_api = cfg.explorer.rollout_model.enable_openai_api
    for path, storage, is_eval in storages:
        problems += _storage_name_problems(path, storage, inp, is_eval, openai_api, served)
        if not is_eval:
            problems += _selector_problems(path, storage, cfg.seed)
        if storage.storage_type == "synthetic" and (found := _generator_problems(path, storage)):
            problems += found
            continue  # the generator cannot run
        workflow = (
            inp.default_eval_workflow_type if is_eval else None
        ) or inp.default_workflow_type
        kwargs = {
            "is_eval": is_eval,
            "default_workflow_type": workflow,
            "default_reward_fn_type": inp.default_reward_fn_type,
            "default_seed": cfg.seed,
        }
        if not is_eval and path == _pipeline_taskset(inp) and cfg.data_processor.task_pipeline:
            continue  # the task pipeline writes it when the stage starts (its inputs are checked)
        _check_data(path, storage, kwargs, cache, problems, skipped)
    # the same for what the trainer reads: a queue (fed by `mode: explore` processes of the same
    # run) holds nothing now; without a step budget it trains until every explorer has finished,
    # so the lr schedule must need no budget
    if trains_from_queue(cfg) and not blocked(skip, "buffer", "trainer", "algorithm"):
        no_budget = cfg.buffer.total_steps is None and cfg.trainer.total_steps is None
        if no_budget and (why := no_budget_problem(cfg.algorithm.optimizer)):
            problems.append(Problem("algorithm.optimizer", f"mode train reading a queue: {why}"))
    buf, path = cfg.buffer.trainer_input.experience_buffer, "buffer.trainer_input.experience_buffer"
    if writes_experience_file(cfg) and not blocked(skip, path, "mode", "algorithm"):
        problems += _experience_file_problems(cfg, f"{path}.path")
    if cfg.mode != "train" or buf is None or trains_from_queue(cfg):
        return problems, skipped
    if blocked(skip, "mode", "algorithm", path, "seed"):
        return problems, skipped
    if buf.storage_type == "synthetic" and (found := _generator_problems(path, buf)):
        return problems + found, skipped
    from trinity.algorithm.algorithms import is_pairwise

    problems += _selector_problems(path, buf, cfg.seed, explored=False)
    pairwise = is_pairwise(cfg.algorithm.algorithm_type)  # as trainer.sft_data.DatasetSource
    kwargs = {"is_eval": False, "default_seed": cfg.seed, "require_response": not pairwise}
    _check_data(path, buf, kwargs | {"require_pair": pairwise}, cache, problems, skipped)
    return problems, skipped


GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's driver; AMD's (ROCm torch)


def gpu_driver_present() -> bool:
    """Whether torch could see a CUDA (or ROCm) GPU here: on Linux only where a GPU driver's
    device node exists, so a machine without one is answered without importing torch (a second
    of `trinity run`'s start); elsewhere True (torch is asked)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(node) for node in GPU_DRIVER_NODES)


# --- names and arguments ----------------------------------------------------------------------


def _registry(kind: str) -> Any:
    """The registry a `default_<kind>` key names into."""
    from trinity.rewards import REWARD_FN
    from trinity.workflows import WORKFLOW

    return REWARD_FN if kind == "reward_fn_type" else WORKFLOW


def _lookup(registry: Any, name: str, path: str) -> tuple[Any, list[Problem]]:
    """(the registered object, []), or (None, [a problem at `path` naming the valid names, or
    the reason a name known from Trinity-RFT is not built here])."""
    refusal = getattr(registry, "refusal", None)
    if refusal is not None and (why := refusal(name)) is not None:
        return None, [Problem(path, f"{registry.kind} {name!r}: not built here: {why}")]
    if name in registry:
        return registry.get(name), []
    if "." in name:
        try:
            return registry.get(name), []
        except LookupError as e:  # the registry's own message names the module
            return None, [Problem(path, str(e))]
        except Exception as e:  # a user's module may raise anything while it is imported
            return None, [Problem(path, f"cannot import {name!r}: {type(e).__name__}: {e}")]
    valid = registry.names()
    return None, [
        Problem(
            path,
            f"unknown {registry.kind} {name!r}; valid: {', '.join(valid)} "
            "(or a dotted path package.module.Name)",
            suggest(name, valid),
        )
    ]


def _args_problems(
    path: str, callee: str, args: dict[str, Any], accepted: Callable[[], set[str] | None]
) -> list[Problem]:
    """One problem per key of `args` (at `path`) that `callee` does not accept."""
    if not args:
        return []
    try:
        names = accepted()
    except (TypeError, ValueError):  # no signature: not a function or class
        return [Problem(path.removesuffix("_args"), f"{callee} is not callable")]
    if names is None:
        return []
    accepts = f"it accepts: {', '.join(sorted(names))}" if names else "it takes no arguments"
    return [
        Problem(f"{path}.{key}", f"unknown argument of {callee}; {accepts}", suggest(key, names))
        for key in sorted(set(args) - names)
    ]


def _reward_fn_args(
    path: str, callee: str, args: dict[str, Any], accepted: Callable[[], set[str] | None]
) -> tuple[dict[str, Any], list[Problem]]:
    """`reward_fn_args` without the keys that bound each call (`rewards/limits.py`: their
    values are the config check's), and a problem for each such key set for a fn that takes an
    argument of that name itself (the key cannot reach it)."""
    from trinity.rewards.limits import LIMIT_KEYS

    limits = sorted(set(args or {}) & set(LIMIT_KEYS))
    if not limits:
        return args, []
    try:
        names = accepted() or set()
    except (TypeError, ValueError):  # not callable: `_args_problems` says so
        names = set()
    problems = [
        Problem(
            f"{path}.{key}",
            f"bounds each call of {callee} (trinity/rewards/limits.py), which also takes an "
            f"argument {key!r} of its own that this key cannot reach; rename that argument",
        )
        for key in limits
        if key in names
    ]
    return {k: v for k, v in args.items() if k not in LIMIT_KEYS}, problems


def _selector_problems(
    path: str, storage: StorageConfig, seed: int, explored: bool = True
) -> list[Problem]:
    """The storage's `data_selector` builds with its keys and arguments; one that learns from
    rollouts (difficulty_based) orders only an explored taskset."""
    from trinity.tasks import make_selector

    where = f"{path}.data_selector"
    try:
        selector = make_selector(storage.data_selector, seed)
    except ValueError as e:
        return [Problem(where, str(e))]
    if selector.adaptive and not explored:
        why = "learns from rollouts' pass rates: it orders an explored taskset, not a dataset"
        return [Problem(f"{where}.selector_type", f"{storage.data_selector.selector_type} {why}")]
    return []


def _pipeline_taskset(inp: Any) -> str:
    """The training taskset a task pipeline's output replaces (`Explorer._load_train_tasks`)."""
    return "buffer.explorer_input." + ("taskset" if inp.taskset is not None else "tasksets[0]")


def _operator_problems(cfg: TrinityConfig) -> list[Problem]:
    """Each experience operator's name and arguments, and that it builds with them (a bad
    value, such as an unknown `op_type`, is refused here, not at the first step)."""
    from trinity.data.operators import EXPERIENCE_OPERATORS, build_operator

    pipeline = cfg.data_processor.experience_pipeline
    problems: list[Problem] = []
    served = _served(cfg) if pipeline is not None and pipeline.operators else {}
    for i, op in enumerate(pipeline.operators if pipeline is not None else []):
        where = f"data_processor.experience_pipeline.operators[{i}]"
        cls, found = _lookup(EXPERIENCE_OPERATORS, op.name, f"{where}.name")
        found = found or _args_problems(
            f"{where}.args", f"experience operator {op.name!r}", op.args,
            lambda cls=cls: keyword_names(cls, 0),
        )  # fmt: skip
        if not found:
            try:
                built = build_operator(op.name, dict(op.args))
            except ValueError as e:
                found = [Problem(f"{where}.args", str(e))]
            else:
                found = _model_name_problems(f"{where}.args", built, served)
                if dj_ops := built.data_juicer_ops():  # a recipe Data-Juicer runs: one does
                    from trinity.data.recipes import recipe_problems

                    said = recipe_problems(
                        [(n, {}) for n in dj_ops], f"{where}.args", cfg.service.data_juicer
                    )
                    found += [Problem(f"{where}.args", why) for why in said]
                built.close()
        problems += found
    return problems


def _model_name_problems(where: str, op: Any, served: dict[int | str, int]) -> list[Problem]:
    """An LLM operator's `api_or_hf_model` that names no served auxiliary model."""
    needed = op.models_needed() if hasattr(op, "models_needed") else []
    return [
        Problem(
            where,
            f"api_or_hf_model {name!r} names no auxiliary model served to the pipeline; add one "
            f"to explorer.auxiliary_models with name: {name} (served: "
            f"{', '.join(map(str, served)) or 'none'})",
        )
        for name in needed
        if name not in served
    ]


def _staleness_problems(cfg: TrinityConfig) -> list[Problem]:
    """A `staleness_control` bound that is negative or that the sync style can never meet."""
    from trinity.algorithm.sample_strategy import max_staleness
    from trinity.sync.schedule import staleness_bound_problem

    algo, sync = cfg.algorithm, cfg.synchronizer
    bound = max_staleness(algo.sample_strategy, algo.sample_strategy_args)
    path = "algorithm.sample_strategy_args.max_staleness"
    if bound is None:
        return []
    if not isinstance(bound, int) or bound < 0:
        return [Problem(path, f"must be an integer >= 0, got {bound!r}")]
    why = staleness_bound_problem(sync.sync_style, sync.sync_interval, bound)
    return [Problem(path, why)] if why else []


def _algorithm_problems(algo: AlgorithmConfig, auxiliary: list[str]) -> list[Problem]:
    """algorithm_type, every piece name and every `<piece>_args` key (as `resolve_algorithm`),
    then the argument values a piece refuses when first called."""
    from trinity.algorithm.algorithms import (
        ALGORITHM,
        ALIASES,
        NOT_BUILT,
        PIECES,
        AlgorithmSpec,
        accepted_args,
        chosen_pieces,
        resolve_algorithm,
        shipped_defaults,
        value_problems,
    )

    where = "algorithm.algorithm_type"
    if algo.algorithm_type in NOT_BUILT:
        return [Problem(where, f"not built yet: {NOT_BUILT[algo.algorithm_type]}")]
    spec, problems = _lookup(
        ALGORITHM, ALIASES.get(algo.algorithm_type, algo.algorithm_type), where
    )
    if spec is not None and not isinstance(spec, AlgorithmSpec):
        return [Problem(where, f"{algo.algorithm_type!r} does not name an AlgorithmSpec")]
    for piece, name, args in chosen_pieces(algo, spec) if spec is not None else ():
        if name is None:
            why = f"given, but {spec.name!r} has no {piece}"
            problems += [Problem(f"algorithm.{piece}_args", why)] if args else []
            continue
        fn, found = _lookup(PIECES[piece][0], name, f"algorithm.{piece}")
        problems += found or _args_problems(
            f"algorithm.{piece}_args",
            f"{piece} {name!r}",
            args,
            lambda fn=fn, piece=piece: accepted_args(piece, fn),
        )
    if problems:
        return problems
    try:  # anything else resolve_algorithm would refuse (e.g. its own rules)
        resolved = resolve_algorithm(algo)
    except (LookupError, TypeError, ValueError) as e:
        return [Problem("algorithm", str(e))]
    if shipped_defaults(algo, auxiliary):  # values that tests run (no torch import here)
        return []
    return [  # argument values a piece refuses when first called
        Problem(f"algorithm.{piece}_args", f"{getattr(resolved.spec, piece)!r}: {msg}")
        for piece, msg in value_problems(resolved, auxiliary)
    ]


def _served(cfg: TrinityConfig) -> dict[int | str, int]:
    """The auxiliary models the explorer serves to workflows, by position and by name."""
    from trinity.explorer.auxiliary import served_auxiliary

    out: dict[int | str, int] = {}
    for i in served_auxiliary(cfg):
        out[i] = i
        if (name := cfg.explorer.auxiliary_models[i].name) is not None:
            out[name] = i
    return out


def _auxiliary_key_problems(
    path: str, workflow: Any, args: dict[str, Any], served: dict[int | str, int]
) -> list[Problem]:
    """A problem for each auxiliary model the workflow's arguments name (its `auxiliary_keys`)
    that the explorer does not serve."""
    keys = getattr(workflow, "auxiliary_keys", None)
    if keys is None:
        return []
    have = ", ".join(repr(k) for k in served) or "none (set explorer.auxiliary_models)"
    problems = []
    for arg, key in keys(args):
        if key not in served:
            why = f"names auxiliary model {key!r}, which is not served to workflows; served: {have}"
            problems.append(Problem(f"{path}.{arg}", why))
    return problems


def _storage_name_problems(
    path: str,
    storage: StorageConfig,
    inp: ExplorerInput,
    is_eval: bool,
    openai_api: bool = False,
    served: dict[int | str, int] | None = None,
) -> list[Problem]:
    """Names and `*_args` of one taskset's workflow and reward fn. A name inherited from
    `explorer_input` is reported there, once; here it only serves to check the arguments. A
    workflow that talks to the model through OpenAI clients (`needs_openai_api`) needs
    `explorer.rollout_model.enable_openai_api` (`openai_api`). `served`: the auxiliary models
    workflows may name (None: not checked)."""
    problems: list[Problem] = []

    def check(key: str, what: str, own: str | None, name: str | None, n_fixed: int) -> Any:
        if not name:
            return None
        found, said = _lookup(_registry(f"{key}_type"), name, f"{path}.default_{key}_type")
        problems.extend(said if own else [])
        if found is not None:
            args, accepted = getattr(storage, f"{key}_args"), partial(keyword_names, found, n_fixed)
            if key == "reward_fn":  # the call's limits (timeout, sandbox, ...) are not the fn's
                args, said = _reward_fn_args(
                    f"{path}.{key}_args", f"{what} {name!r}", args, accepted
                )
                problems.extend(said)
            said = _args_problems(f"{path}.{key}_args", f"{what} {name!r}", args, accepted)
            values = getattr(found, "arg_problems", None)  # a workflow's own check of its values
            if not said and values is not None:
                said = [Problem(f"{path}.{key}_args", m) for m in values(args)]
            if not said and served is not None:
                said = _auxiliary_key_problems(f"{path}.{key}_args", found, args, served)
            problems.extend(said)
        return found

    own = storage.default_workflow_type
    inherited = (inp.default_eval_workflow_type if is_eval else None) or inp.default_workflow_type
    wf_name = own or inherited
    workflow = check("workflow", "workflow", own, wf_name, 0)
    if getattr(workflow, "needs_openai_api", False) and not openai_api:
        problems.append(
            Problem(
                "explorer.rollout_model.enable_openai_api",
                f"workflow {own or inherited!r} of {path} talks to the model through OpenAI "
                "clients: set it to true",
            )
        )
    applies = getattr(workflow, "takes_reply_prefix", False)
    if storage.format.reply_prefix and workflow is not None and not applies:
        problems.append(
            Problem(
                f"{path}.format.reply_prefix",
                f"workflow {own or inherited!r} does not apply a reply prefix (the single-turn "
                "workflows do: math_workflow, math_boxed_workflow, the judge workflows); "
                "remove the key",
            )
        )
    own = storage.default_reward_fn_type
    name = own or inp.default_reward_fn_type or getattr(workflow, "default_reward_fn_type", None)
    reward = check("reward_fn", "reward fn", own, name, 3)
    wants_length = getattr(reward, "needs_response_length", None)
    passes = workflow is None or getattr(workflow, "passes_response_length", False)
    if not passes and wants_length is not None and wants_length(storage.reward_fn_args):
        problems.append(
            Problem(
                f"{path}.reward_fn_args",
                f"reward fn {name!r} needs each response's length in tokens with these "
                f"arguments, and workflow {wf_name!r} does not pass it "
                "(math_workflow and math_boxed_workflow do)",
            )
        )
    return problems


def _experience_file_problems(cfg: TrinityConfig, where: str) -> list[Problem]:
    """A configured experience store (`storage_type: file`, `buffer/file_storage.py`): mode
    train needs it written already (by a `mode: explore` run, or any tool writing experiences),
    and a store that exists must hold experiences, not a dataset's rows: its format
    (`buffer/record_format.py`, by the path's name) reads its first record and checks what
    else it can cheaply (a Parquet folder: every part's columns). A missing store is fine for a
    writer: it creates it."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb is None or not eb.path:
        return []  # unset: the run folder's file
    if cfg.mode != "train" and not eb.path.endswith(EXPERIENCE_FILE_SUFFIXES):
        return []  # a writer's other name: the config check says so
    from trinity.buffer.record_format import format_for

    store = Path(eb.path).expanduser()
    if not store.exists():
        if cfg.mode != "train":
            return []
        return [
            Problem(
                where,
                f"no experience file at {store}: nothing was written there yet; run the explore "
                "process (mode explore, the same path) first, or leave path unset to meet it in "
                "the run folder (buffer/<name>.jsonl)",
            )
        ]
    if (why := format_for(store).problem(store)) is None:
        return []
    algo = cfg.algorithm.algorithm_type
    return [
        Problem(
            where,
            f"{why}; algorithm_type {algo!r} trains on rollouts, so this is read as "
            "experiences (an SFT or DPO algorithm reads a file as a dataset of rows; a stage "
            "that inherits an SFT stage's dataset wants its own experience_buffer, e.g. "
            "storage_type queue)",
        )
    ]


def _generator_problems(path: str, storage: StorageConfig) -> list[Problem]:
    """The generator name (`path`) of a synthetic storage and its `generator_args` keys."""
    from trinity.tasks import GENERATORS

    if not storage.path:
        return []  # reported by the schema checks
    generator, problems = _lookup(GENERATORS, storage.path, f"{path}.path")
    problems = problems or _args_problems(
        f"{path}.generator_args",
        f"generator {storage.path!r}",
        storage.generator_args,
        lambda: keyword_names(generator, 0, skip=("split",)),
    )
    values = getattr(generator, "arg_problems", None)  # a generator's own check of its values
    if problems or values is None:
        return problems
    return [
        Problem(f"{path}.generator_args.{key}" if key else f"{path}.generator_args", message)
        for key, message in values(dict(storage.generator_args))
    ]


def _model_problems(cfg: TrinityConfig) -> list[Problem]:
    """Every model folder the run loads exists (or is a `tiny://` URL that parses)."""
    from trinity.models.loading import model_path_problem

    models = [("rollout_model", cfg.explorer.rollout_model)]
    models += [(f"auxiliary_models[{i}]", m) for i, m in enumerate(cfg.explorer.auxiliary_models)]
    paths = [("model.model_path", cfg.model.model_path)]
    paths += [("model.critic_model_path", cfg.model.critic_model_path)]
    paths += [(f"explorer.{at}.model_path", m.model_path) for at, m in models]
    return [
        Problem(path, why)
        for path, value in paths
        if value and value.strip() and (why := model_path_problem(value))
    ]


def _external_model_problems(cfg: TrinityConfig) -> list[Problem]:
    """`model.external_model`'s endpoint has a URL, answers, takes the key and serves the model
    name (GET /v1/models, once), so an unreachable server or a refused key stops `validate`
    as it would stop `run`."""
    from trinity.explorer.external_endpoint import EndpointError, endpoint_of, probe

    ext = cfg.model.external_model
    if cfg.mode != "bench" or cfg.stages or not (ext.model_name or "").strip():
        return []  # `checks._external_model_is_benched` says why
    try:
        probe(endpoint_of(ext))
    except EndpointError as e:
        return [Problem("model.external_model", str(e).removeprefix("model.external_model: "))]
    return []


def _tensor_parallel_problems(cfg: TrinityConfig) -> list[Problem]:
    """Each tensor-parallel engine pool's size divides its model's attention heads, KV heads and
    MLP intermediate size, where the model's config is at hand (`models.shapes`; an imported
    GGUF's is not until imported, and the engine checks again when it builds)."""
    from trinity.models.shapes import divisibility_problem, model_shape

    rm = cfg.explorer.rollout_model
    pools = [("rollout_model", rm, rm.model_path or cfg.model.model_path)]
    pools += [
        (f"auxiliary_models[{i}]", m, m.model_path)
        for i, m in enumerate(cfg.explorer.auxiliary_models)
    ]
    problems = []
    for at, pool, path in pools:
        t = pool.tensor_parallel_size
        if t > 1 and pool.engine_type == "vllm":
            problems.append(
                Problem(
                    f"explorer.{at}.tensor_parallel_size",
                    f"{t}: not built for engine_type vllm (the engine loads synced weights into "
                    "the model in its own process, and vLLM's tensor parallelism runs the model "
                    "in worker processes of its own); use engine_type transformers, or 1",
                )
            )
            continue
        shape = model_shape(path) if t > 1 and path else None
        if shape is not None and (why := divisibility_problem(shape, t)) is not None:
            problems.append(Problem(f"explorer.{at}.tensor_parallel_size", f"{why} (model {path})"))
    return problems


def _sequence_parallel_problems(cfg: TrinityConfig) -> list[Problem]:
    """The trained models' attention and key/value heads divide over
    `trainer.ulysses_sequence_parallel_size` ranks (where they can be read without building
    the model: a `tiny://` preset or a folder's config.json; the trainer checks the rest)."""
    sp = cfg.trainer.ulysses_sequence_parallel_size
    if sp == 1:
        return []  # before the imports: the trainer's module brings torch
    from trinity.algorithm.algorithms import known_algorithm
    from trinity.models.loading import attention_heads
    from trinity.trainer.sequence_parallel import KEY, heads_problem

    paths = {cfg.model.model_path: "model.model_path"}
    spec = known_algorithm(cfg.algorithm.algorithm_type)
    if spec is not None and spec.use_critic and cfg.model.critic_model_path:
        paths.setdefault(cfg.model.critic_model_path, "model.critic_model_path")
    found = []
    for path, where in paths.items():
        heads = attention_heads(path) if path and path.strip() else None
        if heads is not None and (why := heads_problem(*heads, sp)):
            found.append(Problem(KEY, f"{why} ({where} {path})"))
    name = cfg.algorithm.advantage_fn or (spec.advantage_fn if spec is not None else None)
    if name and _reads_token_stats(name):
        found.append(
            Problem(
                KEY,
                f"{sp}: advantage_fn {name!r} reads the trainer's token statistics (entropy, "
                "NEC), which are not computed with sequence parallelism here; set it to 1",
            )
        )
    return found


def _reads_token_stats(advantage_fn: str) -> bool:
    """Whether the advantage fn of this name is marked `@needs_token_stats` (an unknown name is
    the algorithm check's problem)."""
    from trinity.algorithm.advantage import ADVANTAGE_FN

    try:
        return bool(getattr(ADVANTAGE_FN.get(advantage_fn), "token_stats", False))
    except LookupError:
        return False


# --- data ---------------------------------------------------------------------------------------


def _load(storage: StorageConfig, kwargs: dict[str, Any]) -> Loaded:
    """Load one dataset as the runtime would."""
    from trinity.common.registry import RegistryError
    from trinity.tasks import TasksetError, load_taskset

    if storage.storage_type not in ("file", "sql", "synthetic"):
        why = (
            f"{storage.storage_type!r} cannot hold tasks or a dataset; use 'file', 'sql' or "
            "'synthetic'"
        )
        return "storage_type", why, [], 0
    bad: list[str] = []
    try:
        tasks = load_taskset(storage, bad_rows=bad, **kwargs)
    except TasksetError as e:
        return e.key, str(e), [], 0
    except (TypeError, ValueError, RegistryError) as e:  # a generator refusing its arguments
        return "generator_args", str(e), [], 0  # (e.g. env_demos naming an unknown env)
    if why := _feature_problem(storage, tasks, kwargs.get("default_seed", 42)):
        return "data_selector.feature_keys", why, bad, len(tasks)
    return "", None, bad, len(tasks)


def _feature_problem(storage: StorageConfig, tasks: list, seed: int) -> str | None:
    """A curriculum's offline `feature_keys` must be a number in every row, as the selector
    reads them before the first step (`tasks.curriculum.feature_matrix`)."""
    from trinity.tasks import make_selector
    from trinity.tasks.curriculum import feature_matrix

    if storage.data_selector is None or not storage.data_selector.feature_keys:
        return None
    try:
        keys = getattr(make_selector(storage.data_selector, seed), "feature_keys", None)
    except ValueError:  # the selector check reports it
        return None
    try:
        feature_matrix(tasks, keys or [])
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _check_data(
    path: str,
    storage: StorageConfig,
    kwargs: dict[str, Any],
    cache: dict[str, Loaded],
    problems: list[Problem],
    skipped: list[str],
) -> None:
    """Load one dataset (once per storage and arguments); add its problems or its skipped-row
    line."""
    key = json.dumps([storage.model_dump(mode="json"), kwargs], sort_keys=True, default=str)
    if key not in cache:
        cache[key] = _load(storage, kwargs)
    error_key, error, bad, n_tasks = cache[key]
    if error is not None:
        problems.append(Problem(f"{path}.{error_key}", error))
        return
    if bad and storage.skip_bad_rows:
        skipped.append(f"{path}: {_rows(len(bad))} will be skipped; the first: {bad[0]}")
    elif bad and n_tasks == 0 and len({row.split(": ", 1)[-1] for row in bad}) == 1:
        # one mistake of the config (a format key), not of the data: said once, and skipping
        # would leave nothing to run
        problems.append(Problem(path, f"every row ({len(bad)}) is bad the same way: {bad[0]}"))
        return
    elif bad:
        problems += [Problem(path, row) for row in bad[:MAX_ROWS_SHOWN]]
        if len(bad) > MAX_ROWS_SHOWN:
            problems.append(
                Problem(path, f"... and {_rows(len(bad) - MAX_ROWS_SHOWN, 'more bad')}")
            )
        why = f"{_rows(len(bad))}; fix them, or set skip_bad_rows: true to skip them"
        problems.append(Problem(f"{path}.skip_bad_rows", why))
    if n_tasks == 0 and not (bad and not storage.skip_bad_rows):
        why = "every row is bad" if bad else "it holds no rows"
        problems.append(Problem(path, f"no tasks to run: {why}"))


def _rows(n: int, what: str = "bad") -> str:
    """`1 bad row`, `3 bad rows`."""
    return f"{n} {what} row" + ("" if n == 1 else "s")
