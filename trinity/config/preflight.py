"""Pre-flight: everything about a config that can be known before anything starts.

`load_config` checks the config's shape and stays pure (no I/O). This second pass needs the code
and the file system; `trinity validate` and `trinity run` both perform it, `run` before Ray
starts, so a config that validates does not fail later for any reason known here. It checks the
base config and every stage (problems located under `stages[i].`):

1. features not built yet (`support.not_built_problems`), and the keys that do not apply to this
   build (`support.not_applicable_notes`, printed as notes, not problems);
2. registry names: algorithm_type and its pieces, workflows, reward fns, synthetic generators,
   the tool-call parser;
   a dotted path (`my_pkg.mod.Fn`) is imported here, and a failed import is a problem;
3. every `*_args` key against the parameters of the function or class it is passed to, with the
   accepted names and a did-you-mean (a callee taking `**kwargs` accepts any key);
4. model folders exist (`tiny://` URLs only have to parse: they are built on first use);
5. every taskset and dataset the run reads is loaded with the runtime's own loader
   (`load_taskset`, the same arguments as the explorer and trainer pass), so each bad row is
   reported as `file:line: problem`, or, with `skip_bad_rows: true`, counted.

    report = preflight(cfg)
    report.problems  # list[Problem]; any = exit 2 with nothing started
    report.notes     # "not applicable here" lines
    report.skipped   # one line per dataset whose bad rows will be skipped
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trinity.config.buffer_schema import ExplorerInput, StorageConfig
from trinity.config.loader import valid_stages
from trinity.config.problems import Problem, suggest
from trinity.config.run_folder import trains_from_queue
from trinity.config.schema import AlgorithmConfig, TrinityConfig
from trinity.config.support import not_applicable_notes, not_built_problems
from trinity.trainer.optim import no_budget_problem

Loc = tuple[str | int, ...]
MAX_ROWS_SHOWN = 10  # bad rows listed per dataset; the rest are counted


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
    data_cache: dict[str, _Loaded] = {}
    report = _check_one(cfg, data_cache, skip)
    if cfg.stages:  # the stages that are invalid are reported by load_config
        seen = {(p.path, p.message) for p in report.problems}
        stages = valid_stages(cfg)
        for i, stage in stages:
            found = _check_one(stage, data_cache)
            for p in found.problems:  # shared with the base, or said of this stage already
                here = p.with_prefix(f"stages[{i}]")
                if {(p.path, p.message), (here.path, here.message)}.isdisjoint(seen):
                    report.problems.append(here)
                    seen.add((here.path, here.message))
            report.notes += [n for n in found.notes if n not in report.notes]
            report.skipped += [f"stages[{i}].{s}" for s in found.skipped if s not in report.skipped]
        last = stages[-1] if stages and stages[-1][0] == len(cfg.stages) - 1 else None
        if cfg.mode == "bench" and last and not last[1].buffer.explorer_input.eval_tasksets:
            report.problems.append(
                Problem(
                    f"stages[{len(cfg.stages) - 1}].buffer.explorer_input.eval_tasksets",
                    "mode 'bench' on a staged config evaluates the run's checkpoints on the last "
                    "stage's eval tasksets: it has none",
                )
            )
    return report


def _blocked(skip: Sequence[Loc], *paths: str) -> bool:
    """True when one of the dotted `paths` lies inside a skipped key path or holds one."""
    for path in paths:
        loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path))
        if any(loc[: len(s)] == s[: len(loc)] for s in skip):
            return True
    return False


def _check_one(
    cfg: TrinityConfig, data_cache: dict[str, _Loaded], skip: Sequence[Loc] = ()
) -> PreflightReport:
    """Steps 1-5 of the module docstring on one (stage) config, leaving out the steps that
    read a key path in `skip`."""
    report = PreflightReport()
    # 1.
    report.problems += not_built_problems(cfg)
    report.notes += not_applicable_notes(cfg)
    # 2. and 3.
    auxiliary = list(cfg.buffer.trainer_input.auxiliary_buffers or {})
    if not _blocked(skip, "algorithm", "buffer.trainer_input.auxiliary_buffers"):
        report.problems += _algorithm_problems(cfg.algorithm, auxiliary)
    if not _blocked(skip, "algorithm", "synchronizer"):
        report.problems += _staleness_problems(cfg)
    parser = cfg.explorer.rollout_model.tool_call_parser
    if parser and not _blocked(skip, "explorer.rollout_model.tool_call_parser"):
        from trinity.endpoint.tool_calls import TOOL_CALL_PARSER

        _, problem = _lookup(TOOL_CALL_PARSER, parser, "explorer.rollout_model.tool_call_parser")
        report.problems += [problem] if problem else []
    # 4.
    report.problems += [p for p in _model_problems(cfg) if not _blocked(skip, p.path)]
    # 2., 3. and 5. for what the explorer and the trainer read
    inp = cfg.buffer.explorer_input
    storages = [s for s in _explorer_storages(cfg) if not _blocked(skip, s[0])]
    defaults = [f"buffer.explorer_input.default_{k}" for k in ("workflow_type", "reward_fn_type")]
    if _blocked(skip, *defaults, "buffer.explorer_input.default_eval_workflow_type", "seed"):
        storages = []
    if storages:
        report.problems += _explorer_default_problems(inp)
    for path, storage, is_eval in storages:
        report.problems += _storage_name_problems(path, storage, inp, is_eval)
        if storage.storage_type == "synthetic":
            problems = _generator_problems(path, storage)
            report.problems += problems
            if problems:
                continue  # the generator cannot run
        workflow_default = (inp.default_eval_workflow_type if is_eval else None) or (
            inp.default_workflow_type
        )
        kwargs = {
            "is_eval": is_eval,
            "default_workflow_type": workflow_default,
            "default_reward_fn_type": inp.default_reward_fn_type,
            "default_seed": cfg.seed,
        }
        _check_data(path, storage, kwargs, data_cache, report)
    buf = cfg.buffer.trainer_input.experience_buffer
    # a queue (mode train fed by `mode: explore` processes) holds nothing to read now
    blocked = _blocked(skip, "mode", "algorithm", "buffer.trainer_input.experience_buffer", "seed")
    if trains_from_queue(cfg) and not _blocked(skip, "buffer", "trainer", "algorithm"):
        # fed by `mode: explore` processes of the same run: without a step budget it trains
        # until every explorer has finished, and the lr schedule must need no budget
        no_budget = cfg.buffer.total_steps is None and cfg.trainer.total_steps is None
        if no_budget and (why := no_budget_problem(cfg.algorithm.optimizer)):
            report.problems.append(
                Problem("algorithm.optimizer", f"mode train reading a queue: {why}")
            )
    if cfg.mode == "train" and buf is not None and not trains_from_queue(cfg) and not blocked:
        path = "buffer.trainer_input.experience_buffer"
        problems = _generator_problems(path, buf) if buf.storage_type == "synthetic" else []
        report.problems += problems
        if not problems:  # read by trinity.trainer.sft_data.DatasetSource
            from trinity.algorithm.algorithms import is_pairwise

            pairwise = is_pairwise(cfg.algorithm.algorithm_type)
            kwargs = {
                "is_eval": False,
                "default_seed": cfg.seed,
                "require_response": not pairwise,
                "require_pair": pairwise,
            }
            _check_data(path, buf, kwargs, data_cache, report)
    return report


# --- names and arguments ----------------------------------------------------------------------


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


def _lookup(registry: Any, name: str, path: str) -> tuple[Any, Problem | None]:
    """(the registered object, None), or (None, a problem naming the valid names)."""
    if name in registry:
        return registry.get(name), None
    if "." in name:
        try:
            return registry.get(name), None
        except Exception as e:  # a user's module may raise anything while it is imported
            if isinstance(e, LookupError):  # the registry's own message names the module
                return None, Problem(path, str(e))
            return None, Problem(path, f"cannot import {name!r}: {type(e).__name__}: {e}")
    valid = registry.names()
    return None, Problem(
        path,
        f"unknown {registry.kind} {name!r}; valid: {', '.join(valid)} "
        "(or a dotted path package.module.Name)",
        suggest(name, valid),
    )


def _accepted(obj: Any, n_fixed: int, skip: tuple[str, ...] = ()) -> set[str] | None:
    """Keyword names `obj` accepts after its first `n_fixed` parameters; None = any (`**kw`)."""
    params = list(inspect.signature(obj).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params[n_fixed:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in skip
    }


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


def _algorithm_problems(algo: AlgorithmConfig, auxiliary: list[str] | None = None) -> list[Problem]:
    """algorithm_type, every piece name and every `<piece>_args` key (as `resolve_algorithm`)."""
    from trinity.algorithm.algorithms import (
        ALGORITHM,
        ALIASES,
        NOT_BUILT,
        PIECES,
        AlgorithmSpec,
        accepted_args,
        resolve_algorithm,
        value_problems,
    )

    if algo.algorithm_type in NOT_BUILT:
        reason = NOT_BUILT[algo.algorithm_type]
        return [Problem("algorithm.algorithm_type", f"not built yet: {reason}")]
    name = ALIASES.get(algo.algorithm_type, algo.algorithm_type)
    spec, problem = _lookup(ALGORITHM, name, "algorithm.algorithm_type")
    if problem is not None:
        return [problem]
    if not isinstance(spec, AlgorithmSpec):
        return [
            Problem(
                "algorithm.algorithm_type",
                f"{algo.algorithm_type!r} does not name an AlgorithmSpec",
            )
        ]
    problems: list[Problem] = []
    for piece, (registry, _) in PIECES.items():
        default = getattr(spec, piece)
        chosen = getattr(algo, piece)
        name = default if chosen is None else chosen
        if piece == "advantage_fn" and name == "none":
            name = None
        user_args = getattr(algo, f"{piece}_args")
        if name is None:
            if user_args:
                problems.append(
                    Problem(f"algorithm.{piece}_args", f"given, but {spec.name!r} has no {piece}")
                )
            continue
        fn, problem = _lookup(registry, name, f"algorithm.{piece}")
        if problem is not None:
            problems.append(problem)
            continue
        args = dict(spec.default_args.get(f"{piece}_args", {})) if name == default else {}
        args.update(user_args)
        problems += _args_problems(
            f"algorithm.{piece}_args",
            f"{piece} {name!r}",
            args,
            lambda fn=fn, piece=piece: accepted_args(piece, fn),
        )
    if not problems:  # anything else resolve_algorithm would refuse (e.g. its own rules)
        try:
            resolved = resolve_algorithm(algo)
        except (LookupError, TypeError, ValueError) as e:
            problems.append(Problem("algorithm", str(e)))
        else:  # argument values a piece refuses when first called
            problems += [
                Problem(f"algorithm.{piece}_args", f"{getattr(resolved.spec, piece)!r}: {msg}")
                for piece, msg in value_problems(resolved, auxiliary or [])
            ]
    return problems


def _explorer_storages(cfg: TrinityConfig) -> list[tuple[str, StorageConfig, bool]]:
    """(key path, storage, is_eval) of every taskset the explorer of this config reads."""
    inp = cfg.buffer.explorer_input
    found: list[tuple[str, StorageConfig, bool]] = []
    if cfg.mode in ("both", "explore"):
        if inp.taskset is not None:
            found.append(("buffer.explorer_input.taskset", inp.taskset, False))
        found += [
            (f"buffer.explorer_input.tasksets[{i}]", s, False) for i, s in enumerate(inp.tasksets)
        ]
    found += [
        (f"buffer.explorer_input.eval_tasksets[{i}]", s, True)
        for i, s in enumerate(inp.eval_tasksets)
    ]
    return found


def _explorer_default_problems(inp: ExplorerInput) -> list[Problem]:
    """The explorer-wide workflow and reward fn names."""
    from trinity.rewards import REWARD_FN
    from trinity.workflows import WORKFLOW

    named = [
        (WORKFLOW, inp.default_workflow_type, "default_workflow_type"),
        (WORKFLOW, inp.default_eval_workflow_type, "default_eval_workflow_type"),
        (REWARD_FN, inp.default_reward_fn_type, "default_reward_fn_type"),
    ]
    problems = []
    for registry, name, key in named:
        if name:
            _, problem = _lookup(registry, name, f"buffer.explorer_input.{key}")
            problems += [problem] if problem else []
    return problems


def _storage_name_problems(
    path: str, storage: StorageConfig, inp: ExplorerInput, is_eval: bool
) -> list[Problem]:
    """Names and `*_args` of one taskset's workflow and reward fn.

    A name inherited from `explorer_input` is reported there, once; here it only serves to
    check this taskset's arguments.
    """
    from trinity.rewards import REWARD_FN
    from trinity.workflows import WORKFLOW

    problems: list[Problem] = []
    own = storage.default_workflow_type
    inherited = (inp.default_eval_workflow_type if is_eval else None) or inp.default_workflow_type
    workflow_name = own or inherited
    workflow, problem = _lookup(WORKFLOW, workflow_name, f"{path}.default_workflow_type")
    problems += [problem] if problem and own else []
    if workflow is not None:
        arg_problems = _args_problems(
            f"{path}.workflow_args",
            f"workflow {workflow_name!r}",
            storage.workflow_args,
            lambda: _accepted(workflow, 0),
        )
        check = getattr(workflow, "arg_problems", None)  # a workflow's own check of its values
        if not arg_problems and check is not None:
            arg_problems = [
                Problem(f"{path}.workflow_args", m) for m in check(storage.workflow_args)
            ]
        problems += arg_problems
    own = storage.default_reward_fn_type
    reward_name = own or inp.default_reward_fn_type
    reward_name = reward_name or getattr(workflow, "default_reward_fn_type", None)
    if reward_name:
        reward, problem = _lookup(REWARD_FN, reward_name, f"{path}.default_reward_fn_type")
        problems += [problem] if problem and own else []
        if reward is not None:
            problems += _args_problems(
                f"{path}.reward_fn_args",
                f"reward fn {reward_name!r}",
                storage.reward_fn_args,
                lambda: _accepted(reward, 3),
            )
    return problems


def _generator_problems(path: str, storage: StorageConfig) -> list[Problem]:
    """The generator name (`path`) of a synthetic storage and its `generator_args` keys."""
    from trinity.tasks import GENERATORS

    if not storage.path:
        return []  # reported by the schema checks
    generator, problem = _lookup(GENERATORS, storage.path, f"{path}.path")
    if problem is not None:
        return [problem]
    return _args_problems(
        f"{path}.generator_args",
        f"generator {storage.path!r}",
        storage.generator_args,
        lambda: _accepted(generator, 0, skip=("split",)),
    )


def _model_problems(cfg: TrinityConfig) -> list[Problem]:
    """Every model folder the run loads exists (or is a `tiny://` URL that parses)."""
    from trinity.models.loading import model_path_problem

    named = [
        ("model.model_path", cfg.model.model_path),
        ("model.critic_model_path", cfg.model.critic_model_path),
        ("explorer.rollout_model.model_path", cfg.explorer.rollout_model.model_path),
    ]
    named += [
        (f"explorer.auxiliary_models[{i}].model_path", m.model_path)
        for i, m in enumerate(cfg.explorer.auxiliary_models)
    ]
    problems = []
    for path, value in named:
        message = model_path_problem(value) if value and value.strip() else None
        if message:
            problems.append(Problem(path, message))
    return problems


# --- data ---------------------------------------------------------------------------------------


@dataclass
class _Loaded:
    """The outcome of loading one dataset: a file-level error, or its bad rows and task count."""

    error: str | None
    error_key: str
    bad_rows: list[str]
    n_tasks: int


def _load(storage: StorageConfig, kwargs: dict[str, Any]) -> _Loaded:
    from trinity.tasks import TasksetError, load_taskset

    if storage.storage_type not in ("file", "synthetic"):
        return _Loaded(
            f"{storage.storage_type!r} cannot hold tasks or a dataset; use 'file' or 'synthetic'",
            "storage_type",
            [],
            0,
        )
    bad: list[str] = []
    try:
        tasks = load_taskset(storage, bad_rows=bad, **kwargs)
    except TasksetError as e:
        return _Loaded(str(e), "path", [], 0)
    except (TypeError, ValueError) as e:  # a generator refusing its arguments
        return _Loaded(str(e), "generator_args", [], 0)
    return _Loaded(None, "", bad, len(tasks))


def _check_data(
    path: str,
    storage: StorageConfig,
    kwargs: dict[str, Any],
    cache: dict[str, _Loaded],
    report: PreflightReport,
) -> None:
    """Load one dataset as the runtime would; add its problems (or skipped count) to `report`."""
    key = json.dumps([storage.model_dump(mode="json"), kwargs], sort_keys=True, default=str)
    if key not in cache:
        cache[key] = _load(storage, kwargs)
    loaded = cache[key]
    if loaded.error is not None:
        report.problems.append(Problem(f"{path}.{loaded.error_key}", loaded.error))
        return
    bad = loaded.bad_rows
    if bad and storage.skip_bad_rows:
        report.skipped.append(f"{path}: {_rows(len(bad))} will be skipped; the first: {bad[0]}")
    elif bad:
        report.problems += [Problem(path, row) for row in bad[:MAX_ROWS_SHOWN]]
        if len(bad) > MAX_ROWS_SHOWN:
            report.problems.append(
                Problem(path, f"... and {_rows(len(bad) - MAX_ROWS_SHOWN, 'more bad')}")
            )
        report.problems.append(
            Problem(
                f"{path}.skip_bad_rows",
                f"{_rows(len(bad))}; fix them, or set skip_bad_rows: true to skip them",
            )
        )
    if loaded.n_tasks == 0 and not (bad and not storage.skip_bad_rows):
        why = "every row is bad" if bad else "it holds no rows"
        report.problems.append(Problem(path, f"no tasks to run: {why}"))


def _rows(n: int, what: str = "bad") -> str:
    """`1 bad row`, `3 bad rows`."""
    return f"{n} {what} row" + ("" if n == 1 else "s")
