"""What `validate` checks of `data_processor.task_pipeline` (called by `config.preflight`): its
inputs read, its operators (or recipe) build with their arguments, and each LLM operator's
`api_or_hf_model` names an auxiliary model the explorer serves."""

from __future__ import annotations

from typing import Any

from trinity.common.registry import RegistryError
from trinity.data.recipes import RecipeError, missing_ops, read_recipe, recipe_problems
from trinity.data.task_ops import build_row_operator


def task_pipeline_problems(cfg: Any, served: dict[int | str, int]) -> list[tuple[str, str]]:
    """(key path, problem) pairs; empty when the pipeline can run."""
    from trinity.tasks.files import TasksetError, read_rows

    tp = cfg.data_processor.task_pipeline
    if tp is None:
        return []
    at = "data_processor.task_pipeline"
    problems: list[tuple[str, str]] = []
    if not tp.inputs:
        problems.append((f"{at}.inputs", "a task pipeline needs its raw input files"))
    for i, path in enumerate(tp.inputs):
        try:
            read_rows(path)
        except TasksetError as e:
            problems.append((f"{at}.inputs[{i}]", str(e)))
    if tp.output is not None and (extra := tp.output.model_fields_set - {"path", "name"}):
        problems.append(
            (
                f"{at}.output",
                f"only output.path is used (the jsonl file the explorer reads); "
                f"{', '.join(sorted(extra))} would be ignored: set them on "
                "buffer.explorer_input.taskset",
            )
        )
    inp = cfg.buffer.explorer_input
    if cfg.mode == "train":
        problems.append(
            (
                at,
                "not built yet: a task pipeline in mode train (Trinity-RFT writes its output to "
                "the dpo or sft experience buffer); here the explorer runs the pipeline and "
                "explores its output, so run it in mode both or explore",
            )
        )
    elif inp.taskset is None and not inp.tasksets:
        problems.append(
            (
                "buffer.explorer_input.taskset",
                "the task pipeline's output is read as the training taskset: set one (its "
                "format and workflow settings apply to the pipeline's rows)",
            )
        )
    ops: list[Any] = []
    if tp.config_path:
        try:
            recipe = read_recipe(tp.config_path)
        except RecipeError as e:
            return [*problems, (f"{at}.config_path", str(e))]
        found = recipe_problems(recipe, f"{at}.config_path", cfg.service.data_juicer)
        problems += [(f"{at}.config_path", why) for why in found]
        if not found and not missing_ops(recipe):  # else Data-Juicer runs it all
            ops = [build_row_operator(n, a) for n, a in recipe]
    for i, op in enumerate([] if tp.config_path else tp.operators):
        where = f"{at}.operators[{i}]"
        try:
            ops.append(build_row_operator(op.name, dict(op.args)))
        except RegistryError as e:
            problems.append(
                (
                    f"{where}.name",
                    f"{e} (a Data-Juicer op not built here runs through a recipe: config_path)",
                )
            )
        except ValueError as e:
            problems.append((f"{where}.args", str(e)))
    for op in ops:
        for name in op.models_needed():
            if name not in served:
                problems.append(
                    (
                        f"{at}.operators",
                        f"api_or_hf_model {name!r} names no auxiliary model served to the "
                        "pipeline; add one to explorer.auxiliary_models with "
                        f"name: {name} (served: {sorted(map(str, served)) or 'none'})",
                    )
                )
    return problems


def data_juicer_users(cfg: Any) -> list[str]:
    """The key paths of what sends ops to a real Data-Juicer in this run (a task pipeline's
    recipe, an experience operator's) with the ops; empty: every Data-Juicer op it names is
    built here, so no Data-Juicer server is needed. What does not build is left to the checks
    that report it."""
    from trinity.data.operators import build_operator

    users = []
    tp = cfg.data_processor.task_pipeline
    if tp is not None and tp.config_path:
        try:
            if missing := missing_ops(read_recipe(tp.config_path)):
                users.append(f"data_processor.task_pipeline.config_path ({', '.join(missing)})")
        except RecipeError:
            pass
    ep = cfg.data_processor.experience_pipeline
    for i, op in enumerate(ep.operators if ep is not None else []):
        try:
            built = build_operator(op.name, dict(op.args))
        except (RegistryError, ValueError, TypeError):
            continue
        if ops := built.data_juicer_ops():
            at = f"data_processor.experience_pipeline.operators[{i}]"
            users.append(f"{at} ({', '.join(ops)})")
        built.close()
    return users


def data_juicer_service_report(cfg: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems, notes) of `service.data_juicer`: checked (`dj_server.service_problems`) where
    a recipe of the run needs Data-Juicer; noted as unused where none does (Trinity-RFT's
    examples set it beside recipes of ops built here)."""
    from trinity.data.dj_server import service_notes, service_problems

    svc = cfg.service.data_juicer
    if svc is None or not (svc.auto_start or svc.server_url):
        return [], []
    if not data_juicer_users(cfg):
        return [], [
            "service.data_juicer: no server is started or used: every Data-Juicer op this run "
            "names is built here (docs/data.md)"
        ]
    return service_problems(svc), service_notes(svc)
