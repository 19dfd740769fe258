"""Several tasksets mixed by ratio (`trinity.tasks.mix`): the deal by hand, each set's own
selector, the end of the mix, feedback to the right set, and a bit-exact resume from the
JSON state the explorer's cursor keeps."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest

from trinity.tasks.mix import TaskMix, mix_weights
from trinity.tasks.selector import SequentialSelector, TaskSelector, TaskStream, make_selector


def tasks(name: str, n: int, **raw) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(index=i, taskset_name=name, raw={"id": f"{name}{i}", **raw})
        for i in range(n)
    ]


def names(items) -> list[str]:
    return [t.raw["id"] for t in items]


def mix(sets, weights, batch_size=4, epochs=1, selectors=None) -> TaskMix:
    selectors = selectors or [SequentialSelector() for _ in sets]
    return TaskMix(
        [TaskStream(s, t, batch_size, epochs) for s, t in zip(selectors, sets, strict=True)],
        weights,
    )


def steps(m: TaskMix, batch_size: int) -> list[list[str]]:
    out = []
    while batch := list(itertools.islice(m, batch_size)):
        out.append(names(batch))
    return out


def test_ratio_3_to_1_deals_three_of_the_first_per_one_of_the_second():
    # credits (weights 3, 1; W = 4), each slot: add the weights, the largest gives, minus W
    #   slot 1: [3, 1] -> A, [-1, 1];  slot 2: [2, 2] tie -> A (earlier), [-2, 2]
    #   slot 3: [1, 3] -> B, [1, -1];  slot 4: [4, 0] -> A, [0, 0]   (then it repeats)
    # A has 6 tasks: slot 9 would be A's 7th, so the mix ends after 8 tasks (first exhausted)
    m = mix([tasks("a", 6), tasks("b", 4)], [3, 1])
    assert m.length() == 8
    assert steps(m, 4) == [["a0", "a1", "b0", "a2"], ["a3", "a4", "b1", "a5"]]
    assert m.taken == 8 and m.taken_by_set == [6, 2]


def test_equal_ratios_alternate_across_step_boundaries():
    # [1, 1]: slot 1 [1, 1] -> A [-1, 1]; slot 2 [0, 2] -> B [0, 0]; and again: A B A B ...
    m = mix([tasks("a", 3), tasks("b", 3)], [1, 1], batch_size=3)
    assert steps(m, 3) == [["a0", "b0", "a1"], ["b1", "a2", "b2"]]


def test_unset_ratios_weigh_by_size_and_serve_every_task_of_every_epoch():
    # sizes 2 and 1 (W = 3): slot 1 [2, 1] -> A [-1, 1]; slot 2 [1, 2] -> B [1, -1];
    # slot 3 [3, 0] -> A [0, 0]: A B A per 3 slots, so 2 epochs = 6 tasks, each set's both passes
    weights = mix_weights(None, [2, 1])
    assert weights == [2.0, 1.0] and mix_weights([3, 1], [2, 1]) == [3.0, 1.0]
    m = mix([tasks("a", 2), tasks("b", 1)], weights, batch_size=4, epochs=2)
    assert m.length() == 6
    assert steps(m, 4) == [["a0", "b0", "a1", "a0"], ["b0", "a1"]]


def test_each_set_keeps_its_own_selector():
    shuffle = make_selector({"selector_type": "shuffle", "seed": 7})
    m = mix([tasks("a", 4), tasks("b", 4)], [1, 1], selectors=[SequentialSelector(), shuffle])
    dealt = list(m)
    alone = TaskStream(make_selector({"selector_type": "shuffle", "seed": 7}), tasks("b", 4), 4, 1)
    assert names(dealt[0::2]) == ["a0", "a1", "a2", "a3"]
    assert names(dealt[1::2]) == names(alone)


class Recording(TaskSelector):
    """Sequential order; remembers the feedback it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[list[int], list[float]]] = []

    def epoch_order(self, n, epoch):
        return list(range(n))

    def feedback(self, indices, values):
        self.seen.append((list(indices), list(values)))


def test_feedback_reaches_each_set_with_its_own_indices():
    a, b = Recording(), Recording()
    m = mix([tasks("a", 3), tasks("b", 2)], [1, 1], selectors=[a, b])
    # indices into the sets laid end to end: a0 a1 a2 | b0 b1
    m.feedback([4, 0, 3], [0.25, 0.5, 1.0])
    assert a.seen == [([0], [0.5])]
    assert b.seen == [([1, 0], [0.25, 1.0])]


def test_a_mix_resumed_from_its_json_state_continues_bit_exactly():
    # a curriculum (BOTS, sampled draws) beside a shuffle; feedback after every step; the
    # state goes through JSON as the cursor keeps it
    bots = {"selector_type": "difficulty_based", "seed": 1,
            "kwargs": {"m": 4, "target_reward": 0.5, "tau": 0.5, "do_sample": True}}  # fmt: skip
    shuffle = {"selector_type": "shuffle", "seed": 2}

    def fresh() -> TaskMix:
        return mix(
            [tasks("a", 6), tasks("b", 5)],
            [2, 1.5],
            batch_size=3,
            epochs=2,
            selectors=[make_selector(bots), make_selector(shuffle)],
        )

    def run(m: TaskMix, n_steps: int) -> list[list[str]]:
        out = []
        for _ in range(n_steps):
            batch = list(itertools.islice(m, 3))
            if not batch:
                break
            # pass rates by a fixed rule of the task: a0 0.0, a1 0.25, ...
            idx = [m.offsets[0 if t.taskset_name == "a" else 1] + t.index for t in batch]
            m.feedback(idx, [(i % 5) / 4 for i in idx])
            out.append(names(batch))
        return out

    whole = fresh()
    expected = run(whole, 100)
    first = fresh()
    head = run(first, 3)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = fresh()
    resumed.resume(first.taken, state)
    assert head + run(resumed, 100) == expected
    assert resumed.taken == whole.taken == sum(len(s) for s in expected)


def test_a_cursor_without_a_mix_state_or_of_another_mix_is_refused():
    m = mix([tasks("a", 2), tasks("b", 2)], [1, 1])
    with pytest.raises(ValueError, match="holds no state of a mix of tasksets"):
        m.resume(3, None)
    three = mix([tasks("a", 2), tasks("b", 2), tasks("c", 2)], [1, 1, 1])
    with pytest.raises(ValueError, match="the cursor's mix \\(3 tasksets, 3 tasks\\)"):
        m.resume(3, three.state_dict() | {"mix": {**three.state_dict()["mix"], "taken": [1, 1, 1]}})
    with pytest.raises(ValueError, match="not all 0"):
        mix([tasks("a", 2)], [0])


def test_the_config_checks_ratios_and_names(tmp_path):
    from trinity.config import ConfigError, load_config
    from trinity.config.support import not_applicable_notes

    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {model_path: m}\n"
        "buffer:\n  explorer_input:\n    taskset_ratios: [3, 1]\n    tasksets:\n"
        "      - {name: a, path: a.jsonl, data_selector: {selector_type: shuffle}}\n"
        "      - {name: b, path: b.jsonl, data_selector: {selector_type: random}}\n"
    )
    cfg = load_config(path)
    assert cfg.buffer.explorer_input.taskset_ratios == [3.0, 1.0]
    assert not any("data_selector" in n for n in not_applicable_notes(cfg))  # both acted upon
    with pytest.raises(ConfigError) as info:
        load_config(path, ["buffer.explorer_input.taskset_ratios=[1, 2, 3]"])
    assert "3 ratios for 2 tasksets" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(path, ["buffer.explorer_input.tasksets.1.name=a"])
    assert "'a' names tasksets[0] too" in str(info.value)
    with pytest.raises(ConfigError):
        load_config(path, ["buffer.explorer_input.taskset_ratios=[1, 0]"])
