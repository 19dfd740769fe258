"""reasoning-gym datasets as a synthetic generator: word problems with their own scorers, offline.

    buffer.explorer_input.taskset:
      storage_type: synthetic
      path: reasoning_gym
      split: train                      # eval sets: split: test
      generator_args: {dataset: gsm_symbolic, num_tasks: 500, seed: 0,
                       dataset_args: {difficulty: 1.0}}
      format: {prompt_key: question, response_key: answer}
    buffer.explorer_input.default_reward_fn_type: reasoning_gym_reward   # the dataset's scorer

`dataset` is any name of reasoning-gym's registry (`gsm_symbolic`, `basic_arithmetic`,
`chain_sum`, ...; `reasoning_gym.factory.DATASETS`), `dataset_args` the fields of its config
class (not `seed` and `size`: those are `seed` and `num_tasks` here). Pre-flight checks the name,
the option names and their values (the config's own `validate`) with their key paths.

Rows: `question`, `answer` (the dataset's reference answer), `metadata` (the entry's, unchanged),
`dataset` and `dataset_args`: everything `reasoning_gym_reward` needs to rebuild the entry and
call the dataset's `score_answer` on it.

Splits: reasoning-gym makes item i of seed s from `Random(s + i)`, so item i+1 of seed s is item i
of seed s+1: different seeds are not different problems. As for every synthetic generator, a
problem's split is decided by a hash of its question text (`is_heldout`), so train and eval
never share a question, whatever their seeds; within a split, repeated questions are dropped.
The seed decides which problems of the split come, in the dataset's order: items 0, 1, 2, ...
of seed `seed`, those of the split kept until `num_tasks` distinct ones are found (a larger
`num_tasks` gives a superset whose prefix is the smaller set).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from trinity.tasks.synthetic import GENERATORS, _check_common, _too_few, _want_heldout, is_heldout

NAME = "reasoning_gym"
_OURS = {"seed": "seed", "size": "num_tasks"}  # dataset config fields we set ourselves
_SPARE_DRAWS = 200  # draws beyond twice the expected number before giving up on a small space


def _datasets() -> dict[str, Any]:
    """reasoning-gym's registry: name -> (dataset class, config class)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ValueError(
            f"{NAME}: the reasoning-gym package is not installed (pip install 'trinity[real]'): {e}"
        ) from e
    return DATASETS


def dataset_config(dataset: str, dataset_args: dict[str, Any] | None, **ours: Any) -> Any:
    """The checked config object of `dataset`: ValueError naming the dataset, an unknown option,
    an option we set ourselves, or a value its `validate` refuses."""
    registry = _datasets()
    if dataset not in registry:
        raise ValueError(
            f"{NAME}: unknown dataset {dataset!r}; reasoning-gym has {', '.join(sorted(registry))}"
        )
    config_cls = registry[dataset][1]
    args = dict(dataset_args or {})
    fields = {f.name for f in dataclasses.fields(config_cls)}
    if taken := sorted(set(args) & set(_OURS)):
        raise ValueError(
            f"{NAME}: dataset_args.{taken[0]} is set by generator_args.{_OURS[taken[0]]}"
        )
    if unknown := sorted(set(args) - fields):
        raise ValueError(
            f"{NAME}: {dataset!r} has no option {unknown[0]!r}; its options: "
            f"{', '.join(sorted(fields - set(_OURS)))}"
        )
    try:
        config = config_cls(**args, **ours)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"{NAME}: {dataset!r} refused dataset_args {args}: {e}") from e
    return config


def make_dataset(dataset: str, dataset_args: dict[str, Any] | None, seed: int, size: int) -> Any:
    """A reasoning-gym dataset object (items made on demand by index)."""
    config = dataset_config(dataset, dataset_args, seed=seed, size=size)
    return _datasets()[dataset][0](config=config)


@GENERATORS.register(NAME)
def reasoning_gym_tasks(
    split: str,
    seed: int = 0,
    num_tasks: int = 1000,
    dataset: str | None = None,
    dataset_args: dict[str, Any] | None = None,
    eval_fraction: float = 0.1,
) -> list[dict[str, Any]]:
    """`num_tasks` distinct problems of reasoning-gym's `dataset` in `split` (module docstring).

    1. the dataset with `seed`, its items drawn in order (at most about twice as many as the
       split's share of them should need, plus a margin)
    2. keep an item when its question is new and hashes into `split`
    3. too few distinct ones in that many draws: ValueError with the count
    """
    _check_common(NAME, num_tasks, eval_fraction)
    if not dataset:
        raise ValueError(f"{NAME}: generator_args.dataset is required (a reasoning-gym dataset)")
    heldout = _want_heldout(NAME, split)
    # 1.
    share = eval_fraction if heldout else 1.0 - eval_fraction
    draws = math.ceil(2 * num_tasks / share) + _SPARE_DRAWS
    source = make_dataset(dataset, dataset_args, seed, draws)
    rows: dict[str, dict[str, Any]] = {}
    for index in range(draws):
        if len(rows) == num_tasks:
            break
        entry = source[index]
        question = entry["question"]
        # 2.
        if question in rows or is_heldout(f"{NAME}/{dataset}", question, eval_fraction) != heldout:
            continue
        rows[question] = {
            "question": question,
            "answer": entry["answer"],
            "metadata": entry.get("metadata", {}),
            "dataset": dataset,
            "dataset_args": dict(dataset_args or {}),
        }
    # 3.
    if len(rows) < num_tasks:
        how = f"{dataset!r}, {draws} items of seed {seed}"
        raise _too_few(NAME, split, len(rows), num_tasks, how)
    return list(rows.values())


def _arg_problems(args: dict[str, Any]) -> list[tuple[str, str]]:
    """Pre-flight: (key under generator_args, message) for a missing or unknown dataset, an
    unknown option, or values the dataset's config refuses."""
    dataset = args.get("dataset")
    if not dataset:
        return [("dataset", "required: a reasoning-gym dataset name, e.g. gsm_symbolic")]
    try:
        registry = _datasets()
    except ValueError as e:
        return [("dataset", str(e))]
    if dataset not in registry:
        hint = difflib.get_close_matches(str(dataset), registry, n=1)
        near = f" (did you mean {hint[0]!r}?)" if hint else ""
        valid = ", ".join(sorted(registry))
        return [("dataset", f"unknown reasoning-gym dataset {dataset!r}{near}; valid: {valid}")]
    dataset_args = args.get("dataset_args") or {}
    if not isinstance(dataset_args, dict):
        return [("dataset_args", f"must be a mapping of {dataset!r}'s options")]
    fields = {f.name for f in dataclasses.fields(registry[dataset][1])} - set(_OURS)
    options = ", ".join(sorted(fields))
    problems = [
        (f"dataset_args.{key}", f"set by generator_args.{_OURS[key]}")
        if key in _OURS
        else (f"dataset_args.{key}", f"{dataset!r} has no such option; its options: {options}")
        for key in sorted(set(dataset_args) - fields)
    ]
    if problems:
        return problems
    try:
        dataset_config(dataset, dataset_args, seed=0, size=1)
    except ValueError as e:
        return [("dataset_args", str(e))]
    return []


reasoning_gym_tasks.arg_problems = _arg_problems  # type: ignore[attr-defined]
