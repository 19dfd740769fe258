"""reasoning-gym datasets as tasksets (`storage_type: synthetic`, `path: reasoning_gym`) and their
scorers as the reward (`reasoning_gym_reward`). The reference for scores is the dataset's own
`score_answer`, called directly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import reasoning_gym

from trinity.config import load_config
from trinity.config.buffer_schema import StorageConfig
from trinity.config.preflight import preflight
from trinity.rewards import REWARD_FN
from trinity.tasks import generate, load_taskset

reward = REWARD_FN.get("reasoning_gym_reward")


def rows(split: str, seed: int = 0, num_tasks: int = 40, dataset: str = "chain_sum", **args):
    return generate("reasoning_gym", split, seed, num_tasks, dataset=dataset, **args)


def questions(found: list[dict]) -> list[str]:
    return [r["question"] for r in found]


# -- the taskset source ------------------------------------------------------------------------


def test_sizes_and_row_fields():
    for split, n in (("train", 60), ("test", 15)):
        found = rows(split, num_tasks=n, dataset="gsm_symbolic")
        assert len(found) == n and len(set(questions(found))) == n
        for r in found:
            assert set(r) == {"question", "answer", "metadata", "dataset", "dataset_args"}
            assert r["dataset"] == "gsm_symbolic" and r["dataset_args"] == {}
            assert r["metadata"]["source_dataset"] == "gsm_symbolic"


def test_deterministic_per_seed_and_a_larger_size_extends_the_smaller():
    assert rows("train", seed=3) == rows("train", seed=3)
    assert questions(rows("train", seed=3)) != questions(rows("train", seed=4))
    assert rows("train", seed=3, num_tasks=60)[:25] == rows("train", seed=3, num_tasks=25)


def test_train_and_eval_never_share_a_question_whatever_the_seeds():
    # the hazard: reasoning-gym's item i of seed s is item i+1 of seed s-1, so seeds alone overlap
    a = reasoning_gym.create_dataset("chain_sum", seed=0, size=5)
    b = reasoning_gym.create_dataset("chain_sum", seed=1, size=5)
    assert a[1]["question"] == b[0]["question"]
    for dataset in ("chain_sum", "basic_arithmetic", "gsm_symbolic"):
        train = set().union(*(questions(rows("train", s, 80, dataset)) for s in (0, 1)))
        test = set().union(*(questions(rows("test", s, 20, dataset)) for s in (0, 1)))
        assert len(train) >= 80 and len(test) >= 20
        assert not train & test, dataset


def test_dataset_options_reach_the_generator():
    found = rows("train", dataset_args={"min_terms": 4, "max_terms": 4, "max_digits": 1})
    # 4 one-digit terms: three operators between them, every answer within [-27, 36]
    assert all(r["metadata"]["num_terms"] == 4 for r in found)
    assert all(r["question"].count(" + ") + r["question"].count(" - ") == 3 for r in found)
    assert all(-27 <= int(r["answer"]) <= 36 for r in found)
    assert found[0]["dataset_args"] == {"min_terms": 4, "max_terms": 4, "max_digits": 1}


@pytest.mark.parametrize(
    "args, message",
    [
        ({"dataset": "chain_sums"}, "unknown dataset 'chain_sums'"),
        ({"dataset": "chain_sum", "dataset_args": {"terms": 3}}, "has no option 'terms'"),
        ({"dataset": "chain_sum", "dataset_args": {"seed": 3}}, "set by generator_args.seed"),
        ({"dataset": "chain_sum", "dataset_args": {"size": 3}}, "set by generator_args.num_tasks"),
        (
            {"dataset": "chain_sum", "dataset_args": {"min_terms": 5, "max_terms": 2}},
            "max_terms must be >= min_terms",
        ),
        ({}, "generator_args.dataset is required"),
    ],
)
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        generate("reasoning_gym", "train", 0, 5, **args)


def test_a_small_space_says_how_many_problems_it_has():
    # two one-digit terms joined by + or -: at most 10 * 10 * 2 = 200 questions in all
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    with pytest.raises(ValueError, match=r"only \d+ distinct problems exist in split 'train'"):
        rows("train", num_tasks=300, dataset_args=small)


# -- the reward --------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["gsm_symbolic", "basic_arithmetic", "chain_sum"])
def test_the_scorer_is_the_reward(dataset):
    scorer = reasoning_gym.create_dataset(dataset, seed=0, size=1).score_answer
    for row in rows("test", num_tasks=10, dataset=dataset):
        row = json.loads(json.dumps(row))  # what a row holds survives a JSON round trip
        entry = {k: row[k] for k in ("question", "answer", "metadata")}
        right = reward(f"Adding up... <answer>{row['answer']}</answer>", row["answer"], row)
        assert right == {"accuracy": 1.0, "partial_credit": 0.0}
        wrong_answer = str(int(float(row["answer"])) + 1)
        wrong = reward(f"<answer>{wrong_answer}</answer>", row["answer"], row)
        assert wrong["accuracy"] == 0.0
        assert sum(wrong.values()) == scorer(wrong_answer, entry) < 1.0
        assert reward(f"The answer is {row['answer']}.", None, row)["accuracy"] == 0.0  # no tag


def test_answer_formats():
    row = rows("test", num_tasks=1)[0]
    a = row["answer"]
    assert reward(f"so \\boxed{{{a}}}", None, row, answer_format="boxed")["accuracy"] == 1.0
    assert reward(f"<answer>{a}</answer>", None, row, answer_format="boxed")["accuracy"] == 0.0
    assert reward(a, None, row, answer_format="raw")["accuracy"] == 1.0
    assert reward(f"{a}!", None, row, answer_format="raw")["accuracy"] == 0.0
    with pytest.raises(ValueError, match="unknown answer_format 'xml'"):
        reward(a, None, row, answer_format="xml")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("So 12 + 30 = 42.", "42"),
        ("The total is 12,000 apples, not 11,999", "11999"),
        ("-7 + 2 = -5", "-5"),
        ("it costs 3.50 dollars", "3.50"),
        ("1,5 and 2", "2"),  # a comma before fewer than three digits is not a separator
        ("no digits at all", None),
    ],
)
def test_last_number_reads_the_final_number(response, expected):
    from trinity.rewards.reasoning_gym_reward import extract

    assert extract(response, "last_number") == expected


def test_last_number_scores_through_the_dataset():
    row = rows("test", num_tasks=1, dataset="chain_sum")[0]
    a = row["answer"]
    right = reward(f"First 1 + 2 = 3, then the sum is {a}.", None, row, answer_format="last_number")
    assert right["accuracy"] == 1.0
    wrong = reward(f"The sum is {a} plus 1", None, row, answer_format="last_number")
    assert wrong["accuracy"] == 0.0


def test_tasks_from_a_taskset_config_score_through_their_row():
    storage = StorageConfig(
        storage_type="synthetic",
        path="reasoning_gym",
        split="test",
        generator_args={"dataset": "gsm_symbolic", "num_tasks": 5, "seed": 7},
        format={"prompt_key": "question", "response_key": "answer"},
    )
    tasks = load_taskset(storage, is_eval=True, default_reward_fn_type="reasoning_gym_reward")
    assert len(tasks) == 5 and all(t.prompt == t.raw["question"] for t in tasks)
    for t in tasks:
        fn = REWARD_FN.get(t.reward_fn_type)
        assert fn(f"<answer>{t.truth}</answer>", t.truth, t.raw) == {
            "accuracy": 1.0,
            "partial_credit": 0.0,
        }


def test_rows_without_the_entry_are_refused_for_this_reward():
    storage = SimpleNamespace(
        name="add",
        storage_type="synthetic",
        path="arithmetic",
        split="train",
        subset_name=None,
        format=StorageConfig().format.model_copy(
            update={"prompt_key": "question", "response_key": "answer"}
        ),
        rollout_args=None,
        workflow_args={},
        reward_fn_args={},
        default_workflow_type=None,
        default_reward_fn_type="reasoning_gym_reward",
        repeat_times=None,
        generator_args={"num_tasks": 3},
    )
    with pytest.raises(Exception, match="row has no 'metadata', 'dataset'"):
        load_taskset(storage)


# -- pre-flight --------------------------------------------------------------------------------


def _config(tmp_path, generator_args: str, reward_fn_args: str = "{}"):
    path = tmp_path / "rg.yaml"
    path.write_text(
        "model: {model_path: 'tiny://1m'}\n"
        "buffer:\n"
        "  explorer_input:\n"
        "    default_reward_fn_type: reasoning_gym_reward\n"
        "    taskset:\n"
        "      storage_type: synthetic\n"
        "      path: reasoning_gym\n"
        f"      generator_args: {generator_args}\n"
        f"      reward_fn_args: {reward_fn_args}\n"
        "      format: {prompt_key: question, response_key: answer}\n"
    )
    return load_config(path)


AT = "buffer.explorer_input.taskset."


@pytest.mark.parametrize(
    "generator_args, reward_fn_args, path, message",
    [
        ("{dataset: gsm_symbolc}", "{}", "generator_args.dataset", "did you mean 'gsm_symbolic'"),
        ("{num_tasks: 4}", "{}", "generator_args.dataset", "required"),
        (
            "{dataset: chain_sum, dataset_args: {max_term: 3}}",
            "{}",
            "generator_args.dataset_args.max_term",
            "'chain_sum' has no such option; its options: allow_negation, max_digits",
        ),
        (
            "{dataset: chain_sum, dataset_args: {seed: 1}}",
            "{}",
            "generator_args.dataset_args.seed",
            "set by generator_args.seed",
        ),
        (
            "{dataset: chain_sum, dataset_args: {min_digits: 0}}",
            "{}",
            "generator_args.dataset_args",
            "refused dataset_args {'min_digits': 0}",
        ),
        ("{dataset: chain_sum, datset: x}", "{}", "generator_args.datset", "unknown argument"),
        ("{dataset: chain_sum}", "{answer_format: xml}", "reward_fn_args", "'xml' is not one of"),
    ],
)
def test_validate_names_the_key(tmp_path, generator_args, reward_fn_args, path, message):
    problems = preflight(_config(tmp_path, generator_args, reward_fn_args)).problems
    assert [p.path for p in problems] == [AT + path]
    assert message in str(problems[0])


def test_a_good_config_passes(tmp_path):
    args = "{dataset: chain_sum, num_tasks: 30, dataset_args: {max_terms: 3}}"
    assert preflight(_config(tmp_path, args)).problems == []
