"""Tasksets: file formats, error messages, synthetic generators and selectors."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from trinity.tasks import (
    GENERATORS,
    Task,
    TasksetError,
    generate,
    is_heldout,
    load_taskset,
    make_selector,
    read_rows,
)

ROWS = [{"question": "1+1=", "answer": "2"}, {"question": "2+3=", "answer": "5"}]


def storage(**overrides) -> SimpleNamespace:
    """A taskset config with StorageConfig's attribute names."""
    fmt = dict(
        prompt_type="plaintext",
        prompt_key="question",
        response_key="answer",
        messages_key="messages",
        system_prompt=None,
        reply_prefix=None,
    )
    fmt.update(overrides.pop("format", {}))
    base = dict(
        name="ts",
        storage_type="file",
        path=None,
        subset_name=None,
        split="train",
        format=SimpleNamespace(**fmt),
        rollout_args=SimpleNamespace(
            temperature=None, top_p=None, top_k=None, max_tokens=None, n=None
        ),
        workflow_args={},
        reward_fn_args={},
        default_workflow_type=None,
        default_reward_fn_type=None,
        repeat_times=None,
        generator_args={},
    )
    base.update(overrides)
    return SimpleNamespace(**base)


# -- file formats --------------------------------------------------------------------------------


def test_every_file_format(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "b.json").write_text(json.dumps({"data": ROWS}))
    (tmp_path / "a.csv").write_text("question,answer\n1+1=,2\n2+3=,5\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    for name in ("a.jsonl", "a.json", "b.json", "a.csv", "a.parquet", "ds", "dd"):
        assert read_rows(tmp_path / name) == ROWS, name
    assert read_rows(tmp_path / "dd", split="test") == ROWS[:1]
    with pytest.raises(TasksetError, match=r"split 'dev' not found.*'test', 'train'"):
        read_rows(tmp_path / "dd", split="dev")


def test_folder_of_split_files(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (tmp_path / "train.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    assert read_rows(tmp_path, split="train") == [ROWS[1]]
    assert read_rows(tmp_path, split="test") == [ROWS[0]]
    with pytest.raises(TasksetError, match="no file for split 'dev'"):
        read_rows(tmp_path, split="dev")


def test_malformed_jsonl_names_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"question": "a"}\n\n{"question": oops}\n')
    with pytest.raises(TasksetError, match=r"bad\.jsonl:3: invalid JSON"):
        read_rows(f)
    f.write_text('{"question": "a"}\n[1, 2]\n')
    with pytest.raises(TasksetError, match=r"bad\.jsonl:2: row is a list"):
        read_rows(f)
    g = tmp_path / "bad.json"
    g.write_text(json.dumps([ROWS[0], "text"]))
    with pytest.raises(TasksetError, match=r"bad\.json row 1: row is a str"):
        read_rows(g)


def test_missing_or_unsupported_file(tmp_path):
    with pytest.raises(TasksetError, match=r"not found.*nope\.jsonl"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(TasksetError, match=r"unsupported file type '\.txt'"):
        read_rows(tmp_path / "x.txt")


# -- load_taskset --------------------------------------------------------------------------------


def test_load_taskset_plaintext_and_settings(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    s = storage(
        path=str(f),
        rollout_args=SimpleNamespace(temperature=0.7, top_p=None, top_k=None, max_tokens=8, n=None),
        workflow_args={"w": 1},
        reward_fn_args={"format_score": 0.2},
        default_reward_fn_type="arithmetic_reward",
        repeat_times=4,
    )
    tasks = load_taskset(
        s, is_eval=True, default_workflow_type="math_workflow", default_reward_fn_type="math_reward"
    )
    assert [t.index for t in tasks] == [0, 1]
    t = tasks[1]
    assert (t.prompt, t.messages, t.truth) == ("2+3=", None, "5")
    assert t.to_messages() == [{"role": "user", "content": "2+3="}]
    assert t.raw == ROWS[1] and t.taskset_name == "ts" and t.is_eval
    assert t.workflow_type == "math_workflow"  # explorer-wide default
    assert t.reward_fn_type == "arithmetic_reward"  # the taskset's own default wins
    assert t.rollout_args == {"temperature": 0.7, "max_tokens": 8}
    assert (t.workflow_args, t.reward_fn_args, t.repeat_times) == (
        {"w": 1},
        {"format_score": 0.2},
        4,
    )
    tasks[0].workflow_args["w"] = 2  # tasks do not share mutable settings
    assert tasks[1].workflow_args == {"w": 1}


def test_system_prompt_and_messages(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n")
    t = load_taskset(storage(path=str(f), format={"system_prompt": "Be brief."}))[0]
    assert t.prompt == "1+1="
    assert t.to_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
    ]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    f.write_text(json.dumps({"messages": chat}) + "\n")
    t = load_taskset(storage(path=str(f), format={"prompt_type": "messages"}))[0]
    assert t.prompt is None and t.truth is None and t.to_messages() == chat
    t.to_messages().append({"role": "user", "content": "more"})  # a copy
    assert t.to_messages() == chat


def test_missing_key_message(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps({"q": "x", "a": "1"}) + "\n")
    with pytest.raises(TasksetError) as e:
        load_taskset(storage(path=str(f)))
    msg = str(e.value)
    assert "t.jsonl:3" in msg and "'question'" in msg and "['a', 'q']" in msg
    with pytest.raises(TasksetError, match="no key 'messages'"):
        load_taskset(storage(path=str(f), format={"prompt_type": "messages"}))


def test_synthetic_taskset():
    s = storage(
        storage_type="synthetic",
        path="arithmetic",
        split="test",
        generator_args={"digits": 2, "num_tasks": 20, "seed": 3},
    )
    tasks = load_taskset(s, is_eval=True, default_reward_fn_type="arithmetic_reward")
    assert len(tasks) == 20
    assert tasks[0].truth == str(tasks[0].raw["a"] + tasks[0].raw["b"])
    assert tasks[0].prompt == tasks[0].raw["question"]
    with pytest.raises(TasksetError, match="storage_type 'queue'"):
        load_taskset(storage(storage_type="queue", path="x"))


# -- synthetic generators ------------------------------------------------------------------------


def test_arithmetic_rows_and_determinism():
    rows = generate("arithmetic", "train", seed=0, num_tasks=50, digits=2, ops="+-*")
    assert rows == generate("arithmetic", "train", seed=0, num_tasks=50, digits=2, ops="+-*")
    assert rows != generate("arithmetic", "train", seed=1, num_tasks=50, digits=2, ops="+-*")
    assert generate("arithmetic", "train", 0, 80, digits=2, ops="+-*")[:50] == rows  # a prefix
    for r in rows:
        a, b, op = r["a"], r["b"], r["op"]
        assert r["question"] == f"{a}{op}{b}=" and 0 <= a <= 99 and 0 <= b <= 99
        assert int(r["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op] >= 0
    assert len({r["question"] for r in rows}) == 50


def test_arithmetic_splits_never_overlap():
    # the whole 2-digit addition space (10,000 problems), both splits in full
    n_test = sum(is_heldout("arithmetic", f"{a}+{b}=", 0.1) for a in range(100) for b in range(100))
    assert 800 < n_test < 1200  # eval_fraction 0.1
    full_train = generate("arithmetic", "train", seed=0, num_tasks=10_000 - n_test, digits=2)
    full_test = generate("arithmetic", "test", seed=5, num_tasks=n_test, digits=2)
    train_q = {r["question"] for r in full_train}
    test_q = {r["question"] for r in full_test}
    assert not train_q & test_q
    assert len(train_q | test_q) == 10_000
    # any seed, any size: held-out problems stay held out ("eval" names the same split)
    assert {r["question"] for r in generate("arithmetic", "eval", 9, 100, digits=2)} <= test_q
    assert {r["question"] for r in generate("arithmetic", "train", 9, 100, digits=2)} <= train_q
    with pytest.raises(ValueError, match=f"arithmetic: only {n_test} distinct problems"):
        generate("arithmetic", "test", seed=0, num_tasks=n_test + 1, digits=2)
    assert generate("arithmetic", "train", seed=0, num_tasks=0) == []


def test_countdown_rows_and_disjoint_splits():
    from trinity.rewards import countdown_reward

    train = generate("countdown", "train", seed=0, num_tasks=400)
    assert train == generate("countdown", "train", seed=0, num_tasks=400)
    test = generate("countdown", "test", seed=1, num_tasks=100)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for r in train + test:
        assert r["question"] == f"Use {' '.join(map(str, r['numbers']))} to make {r['target']}"
        assert len(r["numbers"]) == 3 and 1 <= r["target"] <= 100
        assert countdown_reward(r["answer"], None, r)["accuracy"] == 1.0  # the answer is right


def test_generator_errors():
    with pytest.raises(ValueError, match=r"countdown: only \d+ distinct"):
        generate("countdown", "train", 0, 5000, num_numbers=2, max_number=3)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        generate("arithmetic", "dev", 0, 5)
    with pytest.raises(ValueError, match="ops"):
        generate("arithmetic", "train", 0, 5, ops="^")
    with pytest.raises(KeyError, match="Valid names: arithmetic, arithmetic_levels, countdown"):
        GENERATORS.get("algebra")


# -- selectors -----------------------------------------------------------------------------------


def _tasks(n: int) -> list[Task]:
    return [Task(index=i, raw={}, prompt=str(i)) for i in range(n)]


def _ids(batches) -> list[list[int]]:
    return [[t.index for t in b] for b in batches]


def test_sequential_selector_fills_batches_across_epochs():
    # an epoch's tail is completed from the next epoch's head: every step has batch_size tasks
    # (a partial batch mid-run deadlocked an on-policy explorer and its trainer); only the
    # run's last batch may be partial
    sel = make_selector(SimpleNamespace(selector_type="sequential", seed=0))
    assert _ids(sel.batches(_tasks(5), 2, total_epochs=2)) == [
        [0, 1], [2, 3], [4, 0], [1, 2], [3, 4],
    ]  # fmt: skip
    assert _ids(sel.batches(_tasks(5), 3, total_epochs=2)) == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4]]
    assert _ids(make_selector(None).batches(_tasks(3), 5, 1)) == [[0, 1, 2]]
    assert list(make_selector("sequential").batches([], 4, 3)) == []


def test_shuffle_selector_reshuffles_each_epoch_from_seed():
    sel = make_selector({"selector_type": "shuffle", "seed": 7})
    batches = _ids(sel.batches(_tasks(20), 8, total_epochs=3))
    assert [len(b) for b in batches] == [8] * 7 + [4]  # 60 items, 20 per epoch
    flat = [i for b in batches for i in b]
    epochs = [flat[k : k + 20] for k in (0, 20, 40)]
    assert all(sorted(e) == list(range(20)) for e in epochs)  # each epoch is a permutation
    assert epochs[0] != epochs[1] != epochs[2]
    again = make_selector(SimpleNamespace(selector_type="shuffle", seed=7))
    assert _ids(again.batches(_tasks(20), 8, 3)) == batches
    other = make_selector(SimpleNamespace(selector_type="shuffle", seed=8))
    assert _ids(other.batches(_tasks(20), 8, 3)) != batches


def test_random_selector_draws_with_replacement():
    sel = make_selector(SimpleNamespace(selector_type="random", seed=0))
    batches = _ids(sel.batches(_tasks(50), 16, total_epochs=2))
    assert [len(b) for b in batches] == [16] * 6 + [4]  # 2 epochs of 50 draws
    drawn = Counter(i for b in batches for i in b)
    assert max(drawn.values()) > 1  # replacement: 100 draws from 50 repeat some
    with pytest.raises(ValueError, match="batch_size"):
        list(sel.batches(_tasks(3), 0, 1))
    with pytest.raises(KeyError, match="Valid names: difficulty_based, offline_easy2hard, random"):
        make_selector("easy_to_hard")


def test_carry_slip_forgets_the_ones_carry_or_borrow():
    from trinity.tasks.synthetic import carry_slip

    assert carry_slip(47, "+", 38) == 75  # 7+8=15: ones 5, tens 4+3=7 without the carry
    assert carry_slip(74, "+", 56) == 120  # 4+6=10: ones 0, tens 7+5=12 without the carry
    assert carry_slip(52, "-", 38) == 24  # 2<8: ones 12-8=4, tens 5-3=2 without the borrow
    assert carry_slip(41, "+", 38) is None  # 1+8=9: no carry, nothing to forget
    assert carry_slip(58, "-", 32) is None
    assert carry_slip(47, "*", 38) is None


def test_teacher_answers_slip_at_the_given_rate_on_carry_problems_only():
    from trinity.tasks.synthetic import arithmetic, carry_slip

    def rows(rate):
        return arithmetic("train", 0, 4000, digits=2, ops="+", teacher_slip_rate=rate)

    assert "teacher_answer" not in arithmetic("train", 0, 10, digits=2)[0]
    assert all(r["teacher_answer"] == r["answer"] for r in rows(0.0))
    always = rows(1.0)
    for r in always:
        slip = carry_slip(r["a"], r["op"], r["b"])
        assert r["teacher_answer"] == (r["answer"] if slip is None else str(slip))
    some = [r for r in rows(0.7) if carry_slip(r["a"], r["op"], r["b"]) is not None]
    slipped = sum(r["teacher_answer"] != r["answer"] for r in some) / len(some)
    assert abs(slipped - 0.7) < 0.04  # ~1800 carry problems: 4 standard errors ≈ 0.043
    # a problem's teacher answer depends on (seed, question), not on how many were drawn
    first = {r["question"]: r["teacher_answer"] for r in rows(0.7)[:100]}
    fewer = arithmetic("train", 0, 100, digits=2, ops="+", teacher_slip_rate=0.7)
    assert {r["question"]: r["teacher_answer"] for r in fewer} == first


def test_show_carry_writes_the_ones_carry_before_the_result():
    from trinity.rewards import arithmetic_reward
    from trinity.tasks.synthetic import arithmetic

    def by_question(**kw):
        # seed 3's training split holds all five problems below
        add = arithmetic("train", 3, 7000, digits=2, ops="+", min_operand=10, **kw)
        sub = arithmetic("train", 3, 3500, digits=2, ops="-", min_operand=10, **kw)
        return {r["question"]: r for r in add + sub}

    worked = by_question(show_carry=True, teacher_slip_rate=1.0)
    plain = by_question(teacher_slip_rate=1.0)
    assert worked.keys() == plain.keys()  # the same problems, only the answers are spelt out
    for q, expected in {
        "47+38=": ("1:85", "1:75"),  # 7+8=15 carries 1; the slipping teacher notes it, adds none
        "74+56=": ("1:130", "1:120"),  # 4+6=10 carries 1
        "23+45=": ("0:68", "0:68"),  # 3+5=8: no carry, nothing to slip
        "52-38=": ("1:14", "1:24"),  # 2<8 borrows 1; 52-38 without the borrow is 24
        "58-32=": ("0:26", "0:26"),
    }.items():
        assert (worked[q]["answer"], worked[q]["teacher_answer"]) == expected, q
    for q, row in worked.items():
        carry, result = row["answer"].split(":")
        assert result == plain[q]["answer"] and carry in "01"
        assert row["teacher_answer"].split(":")[1] == plain[q]["teacher_answer"]
        # the reward scores the result: the truth `1:85` expects 85, whatever note precedes it
        assert arithmetic_reward(result, row["answer"], {})["accuracy"] == 1.0
    assert arithmetic_reward("0:85", "1:85", {})["accuracy"] == 1.0
    assert arithmetic_reward("1:75", "1:85", {})["accuracy"] == 0.0
    with pytest.raises(ValueError, match="show_carry is defined for ops"):
        arithmetic("train", 0, 10, digits=2, ops="*", show_carry=True)


def test_min_operand_keeps_to_true_two_digit_numbers():
    from trinity.tasks.synthetic import arithmetic

    train = arithmetic("train", 0, 7000, digits=2, ops="+", min_operand=10)
    test = arithmetic("test", 0, 500, digits=2, ops="+", min_operand=10)
    rows = train + test
    assert all(10 <= r["a"] <= 99 and 10 <= r["b"] <= 99 for r in rows)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    # 90 x 90 = 8,100 sums in all: the held-out tenth leaves too few for 7,500 training problems
    with pytest.raises(ValueError, match=r"only .* distinct problems"):
        arithmetic("train", 0, 7500, digits=2, ops="+", min_operand=10)
    with pytest.raises(ValueError, match="min_operand"):
        arithmetic("train", 0, 10, digits=2, min_operand=100)
