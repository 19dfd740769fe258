"""Tasksets read from a SQL table (`storage_type: sql`), on SQLite and on PostgreSQL: Trinity-RFT's
task table (`id`, `raw_task` JSON) and a plain table of columns, read through the `format` keys
as a file's rows; errors naming the table and its columns; the config and pre-flight checks."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from trinity.buffer.sql_url import database_url
from trinity.tasks import TasksetError, load_taskset
from trinity.tasks.selector import TaskStream, make_selector

ROWS = [
    {"question": "1+1=", "answer": "2"},
    {"question": "2+3=", "answer": "5"},
    {"question": "4+4=", "answer": "8"},
]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "tasks.sqlite")
    return request.getfixturevalue("postgres_url")


def trinity_rft_table(url: str, name: str, raw_tasks: list) -> None:
    """A table in the layout of Trinity-RFT's `TaskModel` (an autoincrement `id`, `raw_task`
    JSON), filled in order, as its `SQLTaskStorage.write` does."""
    engine = sa.create_engine(database_url(url))
    t = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("raw_task", sa.JSON, nullable=False),
    )
    t.create(engine)
    with engine.begin() as conn:
        for raw in raw_tasks:
            conn.execute(t.insert().values(raw_task=raw))
    engine.dispose()


def plain_table(url: str, name: str, rows: list[tuple[int, str, str]]) -> None:
    """A table of columns (id, question, answer), rows inserted in the order given."""
    engine = sa.create_engine(database_url(url))
    t = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("question", sa.Text),
        sa.Column("answer", sa.Text),
    )
    t.create(engine)
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": i, "question": q, "answer": a} for i, q, a in rows])
    engine.dispose()


def storage(path: str, name: str, **over):
    from trinity.config.buffer_schema import StorageConfig

    over.setdefault("format", {"prompt_key": "question", "response_key": "answer"})
    return StorageConfig(name=name, storage_type="sql", path=path, **over)


def test_trinity_rft_s_task_table_is_read_in_id_order(db):
    trinity_rft_table(db, "math", ROWS)
    tasks = load_taskset(storage(db, "math"), default_reward_fn_type="arithmetic_reward")
    assert [t.prompt for t in tasks] == ["1+1=", "2+3=", "4+4="]
    assert [t.truth for t in tasks] == ["2", "5", "8"]
    assert [t.index for t in tasks] == [0, 1, 2]
    assert tasks[1].raw == ROWS[1] and tasks[0].taskset_name == "math"
    assert tasks[0].reward_fn_type == "arithmetic_reward"


def test_a_plain_table_is_read_in_primary_key_order_through_the_format_keys(db):
    plain_table(db, "plain", [(3, "c?", "3"), (1, "a?", "1"), (2, "b?", "2")])
    tasks = load_taskset(storage(db, "plain"))
    assert [(t.prompt, t.truth) for t in tasks] == [("a?", "1"), ("b?", "2"), ("c?", "3")]
    assert tasks[0].raw == {"id": 1, "question": "a?", "answer": "1"}


def test_sql_tasks_equal_the_same_rows_from_a_file_and_select_and_resume_alike(db, tmp_path):
    # same rows, same format, same selector: the same tasks in the same order, resumed alike
    trinity_rft_table(db, "ts", ROWS * 3)
    jsonl = tmp_path / "ts.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS * 3))
    from_sql = load_taskset(storage(db, "ts"))
    from_file = load_taskset(storage(str(jsonl), "ts").model_copy(update={"storage_type": "file"}))
    assert [(t.index, t.raw, t.prompt, t.truth) for t in from_sql] == [
        (t.index, t.raw, t.prompt, t.truth) for t in from_file
    ]
    shuffle = {"selector_type": "shuffle", "seed": 3}
    whole = [t.index for t in TaskStream(make_selector(shuffle), from_sql, 4, 2)]
    assert sorted(whole) == sorted(list(range(9)) * 2)
    resumed = TaskStream(make_selector(shuffle), from_sql, 4, 2)
    resumed.resume(5, None)
    assert [t.index for t in resumed] == whole[5:]


def test_bad_raw_task_rows_are_named_by_id_and_skipped_when_asked(db):
    trinity_rft_table(db, "bad", [ROWS[0], [1, 2], {"question": "9+9="}, ROWS[1]])
    with pytest.raises(TasksetError, match=r"table 'bad' row id=2: raw_task is a list"):
        load_taskset(storage(db, "bad"))
    bad: list[str] = []
    tasks = load_taskset(storage(db, "bad"), require_response=True, bad_rows=bad)
    assert [t.prompt for t in tasks] == ["1+1=", "2+3="]
    assert bad == [
        "table 'bad' row id=2: raw_task is a list, expected a JSON object",
        "table 'bad' row id=3: row has no key 'answer' (format.response_key), the reference "
        "answer; the row's keys are ['question']",
    ]


def test_a_missing_table_or_column_is_named_with_what_is_there(db):
    plain_table(db, "plain", [(1, "a?", "1")])
    with pytest.raises(TasksetError) as e:
        load_taskset(storage(db, "nope"))
    assert "has no table 'nope' (the taskset's `name` names its table)" in str(e.value)
    assert "tables there: ['plain']" in str(e.value)
    fmt = {"prompt_key": "prompt", "response_key": "solution"}
    with pytest.raises(TasksetError) as e:
        load_taskset(storage(db, "plain", format=fmt), require_response=True)
    assert (
        "table 'plain' in " in str(e.value)
        and "has no column 'prompt' (format.prompt_key), 'solution' (format.response_key); "
        "its columns: ['id', 'question', 'answer']"
        in str(e.value)
    )


def test_a_sqlite_file_that_does_not_exist_is_not_created(tmp_path):
    missing = tmp_path / "none.sqlite"
    with pytest.raises(TasksetError, match="no SQLite database at"):
        load_taskset(storage(str(missing), "ts"))
    assert not missing.exists()


def test_the_config_takes_sql_tasksets_and_refuses_a_queue_with_a_reason(tmp_path):
    from trinity.config import ConfigError, load_config
    from trinity.config.support import not_built_problems

    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {model_path: m}\n"
        "buffer: {explorer_input: {taskset: {name: math, storage_type: sql, path: t.sqlite}}}\n"
    )
    cfg = load_config(path)
    assert not_built_problems(cfg) == []
    queue = load_config(path, ["buffer.explorer_input.taskset.storage_type=queue"])
    (refused,) = not_built_problems(queue)
    assert "tasksets from a queue (a queue carries experiences;" in refused.message
    path.write_text(
        "model: {model_path: m}\n"
        "buffer: {explorer_input: {taskset: {storage_type: sql, path: t.sqlite},\n"
        "  eval_tasksets: [{storage_type: sql, name: e, path: 'mysql://h/d'}]}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    found = {p.path: p.message for p in info.value.problems}
    assert "the table holding the tasks" in found["buffer.explorer_input.taskset.name"]
    assert (
        "database 'mysql' is not supported" in found["buffer.explorer_input.eval_tasksets[0].path"]
    )


def test_validate_names_a_missing_table_and_missing_columns(tmp_path):
    from trinity.config import load_config
    from trinity.config.preflight import preflight

    db = str(tmp_path / "t.sqlite")
    plain_table(db, "plain", [(1, "a?", "1")])
    path = tmp_path / "cfg.yaml"
    path.write_text(
        'model: {model_path: "tiny://1m?seed=0"}\n'
        "buffer:\n  explorer_input:\n    default_reward_fn_type: arithmetic_reward\n"
        f"    taskset: {{name: plain, storage_type: sql, path: {db},\n"
        "      format: {prompt_key: question, response_key: answer}}\n"
        f"    eval_tasksets: [{{name: gone, storage_type: sql, path: {db}}}]\n"
    )
    problems = {p.path: p.message for p in preflight(load_config(path)).problems}
    (where,) = problems
    assert where == "buffer.explorer_input.eval_tasksets[0].name"
    assert "has no table 'gone'" in problems[where] and "['plain']" in problems[where]
    renamed = load_config(path, ["buffer.explorer_input.taskset.format.response_key=sol"])
    problems = {p.path: p.message for p in preflight(renamed).problems}
    assert (
        "has no column 'sol' (format.response_key)"
        in problems["buffer.explorer_input.taskset.path"]
    )


@pytest.mark.slow  # a whole run (about 20 s on 2 cores)
def test_a_run_mixes_a_sql_taskset_with_a_generated_one_by_ratio(tmp_path, tiny_model_dir):
    """mode both, GRPO: tasksets [math: Trinity-RFT's table in SQLite (6 rows), add: generated
    (40)], taskset_ratios [3, 1], batch_size 4, no step count: each step deals math math add math
    (tests/test_task_mix.py), math runs out after 2 steps, so the run plans and makes 2 steps;
    the metrics count each set's tasks per step, the cursor holds the deal."""
    import asyncio

    from test_e2e import run_trinity

    from trinity.buffer.queue import QueueStorage
    from trinity.tasks import generate

    db = str(tmp_path / "tasks.sqlite")
    trinity_rft_table(db, "math", generate("arithmetic", "train", 1, 6, digits=1))
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(
        f"project: e2e\nname: mix\ncheckpoint_root_dir: {tmp_path / 'ckpt'}\n"
        f"model: {{model_path: {tiny_model_dir}, max_response_tokens: 4}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 4, optimizer: {lr: 1.0e-2}}\n"
        "buffer:\n  batch_size: 4\n  explorer_input:\n    taskset_ratios: [3, 1]\n"
        "    tasksets:\n"
        f"      - {{name: math, storage_type: sql, path: {db},\n"
        "         format: {prompt_key: question, response_key: answer},\n"
        "         data_selector: {selector_type: shuffle, seed: 5}}\n"
        "      - {name: add, storage_type: synthetic, path: arithmetic,\n"
        "         generator_args: {digits: 1, num_tasks: 40, seed: 0},\n"
        "         format: {prompt_key: question, response_key: answer}}\n"
        "    default_reward_fn_type: arithmetic_reward\n"
        "  trainer_input: {experience_buffer: {name: exp, storage_type: queue}}\n"
        "explorer: {runner_per_model: 16}\n"
        "trainer: {micro_batch_size_per_gpu: 8, use_dynamic_bsz: false}\n"
        "monitor: {monitor_type: jsonl}\n"
    )
    r = run_trinity(cfg)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "mix"
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    explored = [x for x in recs if "rollout/tasks" in x]
    assert [x["step"] for x in explored] == [1, 2]
    for x in explored:
        assert x["rollout/taskset/math/tasks"] == 3 and x["rollout/taskset/add/tasks"] == 1
        assert 0 <= x["rollout/taskset/math/reward_mean"] <= 1
    assert [x["step"] for x in recs if "train/loss" in x] == [1, 2]
    cursor = asyncio.run(QueueStorage(run_dir / "buffer" / "exp.db").cursor("explorer"))
    assert cursor is not None and cursor.step == 2 and cursor.tasks == 8
    assert cursor.selector["mix"]["taken"] == [6, 2]
