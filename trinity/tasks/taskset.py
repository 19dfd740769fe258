"""Turn a taskset config (`buffer.explorer_input.taskset` and friends) into a list of Tasks.

    tasks = load_taskset(cfg.buffer.explorer_input.taskset,
                         default_workflow_type="math_workflow",
                         default_reward_fn_type="arithmetic_reward")

`storage` is any object with the attributes of `trinity.config.buffer_schema.StorageConfig`
(name, storage_type, path, subset_name, split, format, rollout_args, workflow_args,
reward_fn_args, default_workflow_type, default_reward_fn_type, repeat_times, generator_args,
skip_bad_rows). Per-taskset defaults win over the explorer-wide defaults passed in.

A bad row (invalid JSON, not an object, no prompt, a prompt of the wrong type, no reference answer
where one is needed) raises `TasksetError` naming "file:line". With `skip_bad_rows: true` on the
storage, bad rows are dropped and counted instead (a warning names the count and the first one);
pre-flight (`trinity validate`) loads every taskset through this same function, so it reports
exactly the rows the run would refuse or skip.
"""

from __future__ import annotations

import logging
from typing import Any

from trinity.rewards.limits import split_reward_args
from trinity.tasks.files import TasksetError, read_located_rows
from trinity.tasks.sql_rows import read_sql_rows
from trinity.tasks.synthetic import generate
from trinity.tasks.task import Task

_ROLLOUT_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "n", "logprobs")
log = logging.getLogger(__name__)


def load_taskset(
    storage: Any,
    is_eval: bool = False,
    default_workflow_type: str | None = None,
    default_reward_fn_type: str | None = None,
    default_seed: int = 0,
    require_response: bool = False,
    bad_rows: list[str] | None = None,
    require_pair: bool = False,
) -> list[Task]:
    """Read every row of `storage` and wrap it as a Task.

    1. read rows: a file/folder (`storage_type: file`), a SQL table (`sql`: `sql_rows`) or a
       generator (`synthetic`)
    2. per row: pick the prompt (plaintext or messages), the truth, and the taskset settings
    3. bad rows: raise at the first, or (`storage.skip_bad_rows`) drop them with a warning

    Args:
        default_seed: the run's global seed; it seeds a synthetic generator whose
            `generator_args` set no `seed`.
        require_response: every row needs its reference answer (`format.response_key`), or for
            `prompt_type: messages` a last assistant turn (SFT data). Also implied when the
            taskset's reward fn is marked as needing the truth (`trinity.rewards.needs_truth`).
        bad_rows: a list to collect every bad row's "file:line: problem" message in, skipping
            those rows, whatever `skip_bad_rows` says (used by pre-flight to report them all).
        require_pair: every row needs a preference pair (`format.chosen_key`,
            `format.rejected_key`: text, or a message list ending with the assistant reply);
            the pair lands in `Task.pair` (DPO data).
    """
    # 1.
    name = storage.name or str(storage.path)
    skip = bool(getattr(storage, "skip_bad_rows", False))
    collected: list[str] | None = bad_rows if bad_rows is not None else ([] if skip else None)
    fmt = storage.format
    workflow_type = storage.default_workflow_type or default_workflow_type
    reward_fn_type = storage.default_reward_fn_type or default_reward_fn_type
    # the fn's own keywords, and the bounds on each call (timeout, sandbox: rewards/limits.py)
    reward_args, reward_limits = split_reward_args(storage.reward_fn_args)
    need_truth = require_response or _reward_needs_truth(reward_fn_type)
    need_fields = _reward_task_fields(reward_fn_type)
    row_fields = _workflow_row_fields(workflow_type)
    if storage.storage_type == "file":
        if not storage.path:
            raise TasksetError(f"taskset {name!r}: storage_type 'file' needs a path")
        located = read_located_rows(storage.path, storage.split, storage.subset_name, collected)
    elif storage.storage_type == "synthetic":
        located = _synthetic_rows(storage, name, default_seed)
    elif storage.storage_type == "sql":
        if not storage.name or not storage.path:
            raise TasksetError(
                f"taskset {name!r}: storage_type 'sql' needs a path (the database) and a name "
                "(its table)"
            )
        columns = _columns_read(fmt, need_truth, require_pair, need_fields, reward_fn_type)
        located = read_sql_rows(storage.path, storage.name, columns, collected)
    else:
        raise TasksetError(
            f"taskset {name!r}: storage_type {storage.storage_type!r} cannot hold tasks; "
            "use 'file', 'sql' or 'synthetic'"
        )
    # 2.
    rollout_args = _rollout_args(storage.rollout_args)
    tasks = []
    for row, loc in located:
        try:
            if row_fields is None:
                prompt, messages = _prompt_of(row, fmt, loc)
            else:  # the workflow builds its prompt from these fields of the row
                prompt, messages = None, None
                _check_fields(row, row_fields, workflow_type, loc, "workflow")
            if need_truth:
                _check_response(row, fmt, messages, loc)
            _check_fields(row, need_fields, reward_fn_type, loc)
            pair = _pair_of(row, fmt, loc) if require_pair else None
            tools = _tools_of(row, fmt, loc) if row_fields is None else None
        except TasksetError as e:
            if collected is None:
                raise
            collected.append(str(e))
            continue
        truth = row_value(row, fmt.response_key)
        tasks.append(
            Task(
                index=len(tasks),
                raw=row,
                prompt=prompt,
                messages=messages,
                truth=None if truth is None else str(truth),
                taskset_name=name,
                is_eval=is_eval,
                workflow_type=workflow_type,
                reward_fn_type=reward_fn_type,
                workflow_args=dict(storage.workflow_args or {}),
                reward_fn_args=dict(reward_args),
                reward_limits=reward_limits,
                rollout_args=dict(rollout_args),
                repeat_times=storage.repeat_times,
                reply_prefix=getattr(fmt, "reply_prefix", None),
                pair=pair,
                tools=tools,
            )
        )
    # 3.
    if skip and bad_rows is None and collected:
        log.warning(
            "taskset %r: skipped %d bad rows (skip_bad_rows); the first: %s",
            name,
            len(collected),
            collected[0],
        )
    return tasks


def _reward_needs_truth(reward_fn_type: str | None) -> bool:
    """True when the named reward fn is registered and marked as needing a reference answer."""
    if not reward_fn_type:
        return False
    from trinity.rewards import REWARD_FN

    return reward_fn_type in REWARD_FN and getattr(
        REWARD_FN.get(reward_fn_type), "needs_truth", False
    )


def _reward_task_fields(reward_fn_type: str | None) -> tuple[str, ...]:
    """The task-row fields the named reward fn reads (`trinity.rewards.needs_task_fields`)."""
    if not reward_fn_type:
        return ()
    from trinity.rewards import REWARD_FN

    if reward_fn_type not in REWARD_FN:
        return ()
    return tuple(getattr(REWARD_FN.get(reward_fn_type), "task_fields", ()))


def _workflow_row_fields(workflow_type: str | None) -> tuple[str, ...] | None:
    """The row fields a workflow that builds its own prompt reads (its `row_fields`, e.g.
    `toolcall_workflow`'s tools and conversations); None for one that reads the prompt key."""
    if not workflow_type:
        return None
    from trinity.workflows import WORKFLOW

    if workflow_type not in WORKFLOW and "." not in workflow_type:
        return None  # an unknown or refused name: the config check reports it
    try:
        cls = WORKFLOW.get(workflow_type)
    except (LookupError, ImportError):  # a dotted path that does not load: reported there too
        return None
    fields = getattr(cls, "row_fields", None)
    return None if fields is None else tuple(fields)


def _check_fields(
    row: dict, fields: tuple[str, ...], reward_fn_type: Any, loc: str, kind: str = "reward fn"
) -> None:
    """A row must hold every field its reward fn (or workflow: `kind`) reads."""
    missing = [f for f in fields if f not in row]
    if missing:
        raise TasksetError(
            f"{loc}: row has no {', '.join(repr(f) for f in missing)}, which {kind} "
            f"{reward_fn_type!r} reads (it needs {', '.join(fields)}); the row's keys are "
            f"{sorted(row)}"
        )


_MISSING = object()


def row_value(row: dict, key: str, default: Any = None) -> Any:
    """`row[key]`; a key absent from the row that holds dots is a path into nested mappings
    (Trinity-RFT's BOTS examples: `response_key: reward_model.ground_truth`)."""
    if key in row or "." not in key:
        return row.get(key, default)
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def _check_response(row: dict, fmt: Any, messages: list[dict] | None, loc: str) -> None:
    """A row must carry its reference answer: `response_key`, or a last assistant turn."""
    if (value := row_value(row, fmt.response_key, _MISSING)) is not _MISSING:
        if value is None or isinstance(value, dict | list):
            raise TasksetError(
                f"{loc}: {fmt.response_key!r} (format.response_key) must be text or a number, "
                f"got {type(value).__name__}"
            )
        return
    if fmt.prompt_type == "messages" and messages and messages[-1]["role"] == "assistant":
        return
    raise TasksetError(
        f"{loc}: row has no key {fmt.response_key!r} (format.response_key), the reference "
        f"answer; the row's keys are {sorted(row)}"
    )


def _columns_read(
    fmt: Any, need_truth: bool, need_pair: bool, fields: tuple[str, ...], reward_fn_type: Any
) -> dict[str, str]:
    """The columns a plain SQL table must have for these settings, each with what names it."""
    prompt = ("messages_key", fmt.messages_key) if fmt.prompt_type == "messages" else None
    prompt = prompt or ("prompt_key", fmt.prompt_key)
    columns = {prompt[1]: f"format.{prompt[0]}"}
    if need_truth and fmt.prompt_type != "messages":  # messages may end with the answer
        columns.setdefault(fmt.response_key, "format.response_key")
    if need_pair:
        columns.setdefault(fmt.chosen_key, "format.chosen_key")
        columns.setdefault(fmt.rejected_key, "format.rejected_key")
    for f in fields:
        columns.setdefault(f, f"read by reward fn {reward_fn_type!r}")
    return columns


def _synthetic_rows(storage: Any, name: str, default_seed: int) -> list[tuple[dict, str]]:
    if not storage.path:
        raise TasksetError(f"taskset {name!r}: storage_type 'synthetic' needs a generator as path")
    args = dict(storage.generator_args or {})
    seed = int(args.pop("seed", default_seed))
    num_tasks = int(args.pop("num_tasks", 1000))
    rows = generate(storage.path, storage.split, seed, num_tasks, **args)
    return [(row, f"generator {storage.path!r} row {i}") for i, row in enumerate(rows)]


def _rollout_args(rollout_args: Any) -> dict[str, Any]:
    """The set (non-None) sampling overrides, from a pydantic model, namespace or dict."""
    if rollout_args is None:
        return {}
    if isinstance(rollout_args, dict):
        items = rollout_args.items()
    else:
        items = ((k, getattr(rollout_args, k, None)) for k in _ROLLOUT_KEYS)
    return {k: v for k, v in items if v is not None}


def _prompt_of(row: dict, fmt: Any, loc: str) -> tuple[str | None, list[dict] | None]:
    """(plaintext prompt, chat messages) of a row; messages also when a system prompt is set."""
    system = getattr(fmt, "system_prompt", None)
    if fmt.prompt_type == "messages":
        messages = _require(row, fmt.messages_key, loc, "messages_key")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise TasksetError(
                f"{loc}: {fmt.messages_key!r} must be a list of {{role, content}} objects"
            )
        messages = [dict(m) for m in messages]
        if system and (not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": system})
        return None, messages
    if fmt.prompt_type != "plaintext":
        raise TasksetError(f"{loc}: unknown prompt_type {fmt.prompt_type!r}")
    prompt = _require(row, fmt.prompt_key, loc, "prompt_key")
    if _is_messages(prompt):  # a chat list under prompt_key (Trinity-RFT reads it as messages)
        messages = [dict(m) for m in prompt]
        if system and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system})
        return None, messages
    if isinstance(prompt, bool) or not isinstance(prompt, str | int | float):
        raise TasksetError(
            f"{loc}: {fmt.prompt_key!r} (format.prompt_key) must be text or a list of "
            f"{{role, content}} messages, got {type(prompt).__name__}"
        )
    prompt = str(prompt)
    if system:
        return prompt, [
            {"role": "system", "content": system},
            {"role": "user", "content": prompt},
        ]
    return prompt, None


def _tools_of(row: dict, fmt: Any, loc: str) -> list[dict[str, Any]] | None:
    """The row's tool definitions (`format.tools_key`): None when absent, else a list of
    OpenAI function definitions (`{"type": "function", "function": {"name": ...}}`)."""
    key = getattr(fmt, "tools_key", "tools")
    tools = row.get(key)
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
        for t in tools
    ):
        raise TasksetError(
            f"{loc}: {key!r} (format.tools_key) must be a list of OpenAI tool definitions "
            '({"type": "function", "function": {"name": ..., "parameters": ...}})'
        )
    return [dict(t) for t in tools]


def _is_messages(value: Any) -> bool:
    """A non-empty chat list: every item a mapping with a role and a content."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def _pair_of(row: dict, fmt: Any, loc: str) -> tuple[str, str]:
    """The (chosen, rejected) responses of a preference row: each column holds the reply text,
    or a message list whose last item is the assistant reply (its earlier turns must be the
    row's prompt and are not read)."""
    out = []
    for option in ("chosen_key", "rejected_key"):
        key = getattr(fmt, option)
        value = _require(row, key, loc, option)
        if isinstance(value, list):
            last = value[-1] if value else None
            if not (isinstance(last, dict) and last.get("role") == "assistant"):
                raise TasksetError(
                    f"{loc}: {key!r} (format.{option}) is a message list that does not end "
                    "with an assistant message"
                )
            value = last.get("content")
        if not isinstance(value, str) or not value:
            raise TasksetError(
                f"{loc}: {key!r} (format.{option}) must be a non-empty reply text, "
                f"got {type(value).__name__}"
            )
        out.append(value)
    if out[0] == out[1]:
        raise TasksetError(f"{loc}: chosen and rejected replies are identical")
    return out[0], out[1]


def _require(row: dict, key: str, loc: str, option: str) -> Any:
    if key not in row:
        raise TasksetError(
            f"{loc}: row has no key {key!r} (format.{option}); the row's keys are {sorted(row)}"
        )
    return row[key]
