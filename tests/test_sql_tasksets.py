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
    assert where == "buffer.explorer_input.eval_tasksets[0].path"
    assert "has no table 'gone'" in problems[where] and "['plain']" in problems[where]
    renamed = load_config(path, ["buffer.explorer_input.taskset.format.response_key=sol"])
    problems = {p.path: p.message for p in preflight(renamed).problems}
    assert (
        "has no column 'sol' (format.response_key)"
        in problems["buffer.explorer_input.taskset.path"]
    )
