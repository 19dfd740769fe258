"""Reward functions on hand-made responses."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from trinity.rewards import REWARD_FN, extract_answer

arithmetic = REWARD_FN.get("arithmetic_reward")
countdown = REWARD_FN.get("countdown_reward")
math_reward = REWARD_FN.get("math_reward")
format_reward = REWARD_FN.get("format_reward")
math_with_format = REWARD_FN.get("math_with_format")
exact_match = REWARD_FN.get("exact_match")

GSM8K_TRUTH = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def test_registry_names():
    assert {
        "arithmetic_reward",
        "countdown_reward",
        "math_reward",
        "format_reward",
        "math_with_format",
        "exact_match",
    } <= set(REWARD_FN.names())
    with pytest.raises(KeyError, match="Did you mean 'math_reward'"):
        REWARD_FN.get("math_rewrd")


@pytest.mark.parametrize(
    ("response", "truth", "accuracy"),
    [
        ("46", "46", 1.0),
        ("  46 \n", "46", 1.0),
        ("12+34=46", "46", 1.0),  # the last number counts
        ("The answer is -5", "-5", 1.0),
        ("= - 5", "-5", 1.0),  # unary sign after whitespace
        ("10-5", "5", 1.0),  # binary minus is not a sign
        ("10-5", "-5", 0.0),
        ("+7", "7", 1.0),
        ("1,234", "1234", 1.0),
        ("46.0", "46", 1.0),
        ("46.5", "46", 0.0),
        ("47", "46", 0.0),
        ("4 6", "46", 0.0),
        ("", "46", 0.0),
        ("no number", "46", 0.0),
    ],
)
def test_arithmetic_reward(response, truth, accuracy):
    assert arithmetic(response, truth, {}) == {"accuracy": accuracy}


def test_arithmetic_reward_needs_truth():
    with pytest.raises(ValueError, match="response_key"):
        arithmetic("3", None, {})


@pytest.mark.parametrize(
    ("response", "truth", "accuracy"),
    [
        ("05", "05", 1.0),
        (" 05\n", "05", 1.0),  # surrounding whitespace does not count
        ("5", "05", 0.0),  # the spelling counts, not the value (arithmetic_reward would take it)
        ("050", "05", 0.0),
        ("0 5", "05", 0.0),
        ("", "05", 0.0),
        ("", " ", 1.0),
    ],
)
def test_exact_match(response, truth, accuracy):
    assert exact_match(response, truth, {}) == {"accuracy": accuracy}
    assert arithmetic("5", "05", {}) == {"accuracy": 1.0}  # where the two differ
    with pytest.raises(ValueError, match="response_key"):
        exact_match("05", None, {})


RAW = {"numbers": [3, 5, 7], "target": 22}


@pytest.mark.parametrize(
    ("response", "accuracy", "fmt"),
    [
        ("3*5+7", 1.0, 0.0),
        (" (5 * 3) + 7 ", 1.0, 0.0),
        ("7+3*5 = 22", 1.0, 0.0),  # text after '=' is ignored
        ("(7+3)*5/ (5)", 0.0, 0.1),  # 5 used twice: well-formed, not allowed
        ("3*5+7+7", 0.0, 0.1),  # 7 reused
        ("3*5+8-1", 0.0, 0.1),  # numbers not given
        ("3+5+7", 0.0, 0.1),  # wrong value
        ("7/(5-5)", 0.0, 0.1),  # division by zero
        ("3*5+", 0.0, 0.0),  # malformed
        ("(3*5+7", 0.0, 0.0),
        ("-3+25", 0.0, 0.0),  # unary minus is not a countdown operation
        ("3**2+13", 0.0, 0.0),  # power
        ("__import__('os')", 0.0, 0.0),
        ("3 5 7", 0.0, 0.0),
        ("", 0.0, 0.0),
        ("0x16", 0.0, 0.0),
    ],
)
def test_countdown_reward(response, accuracy, fmt):
    assert countdown(response, None, RAW) == {"accuracy": accuracy, "format": fmt}


def test_countdown_reward_exact_fractions_and_subsets():
    raw = {"numbers": [1, 3, 4, 6], "target": 24}
    assert countdown("6/(1-3/4)", None, raw)["accuracy"] == 1.0  # 6 / (1/4) exactly
    assert countdown("4*6", None, raw)["accuracy"] == 1.0  # a subset of the numbers is fine
    assert countdown("3+3", None, raw, format_score=0.5)["format"] == 0.5
    with pytest.raises(ValueError, match="'numbers' and 'target'"):
        countdown("1+2", None, {})


@pytest.mark.parametrize(
    ("response", "truth", "accuracy"),
    [
        ("She sold 72 clips.\n#### 72", GSM8K_TRUTH, 1.0),
        ("#### 1,234", "#### 1234", 1.0),
        ("So the total is 1234.\n#### 1234", "Many steps.\n#### 1,234", 1.0),
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", 1.0),
        ("\\boxed{x+1}", "1+x", 1.0),
        ("First \\boxed{3}, then corrected: #### 4", "4", 1.0),  # the last answer counts
        ("#### 71", GSM8K_TRUTH, 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("I don't know", "#### 72", 0.0),
        ("", "#### 72", 0.0),
    ],
)
def test_math_reward(response, truth, accuracy):
    assert math_reward(response, truth, {}) == {"accuracy": accuracy}


def test_extract_answer():
    assert extract_answer(GSM8K_TRUTH) == "72"
    assert extract_answer("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\boxed{\\frac{1}{\\sqrt{2}}}"
    assert extract_answer("no marker 5") is None


def test_math_reward_works_off_the_main_thread():
    # math-verify's signal-based timeouts raise outside the main thread unless switched off
    cases = [("#### 72", GSM8K_TRUTH), ("\\boxed{0.5}", "\\frac{1}{2}"), ("#### 3", "4")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: math_reward(c[0], c[1], {}), cases))
    assert results == [{"accuracy": 1.0}, {"accuracy": 1.0}, {"accuracy": 0.0}]

    async def in_executor():
        return await asyncio.get_running_loop().run_in_executor(
            None, math_with_format, "#### 72", "72", {}
        )

    assert asyncio.run(in_executor()) == {"accuracy": 1.0, "format": 0.1}


def test_format_reward():
    assert format_reward("so \\boxed{42}", None, {}) == {"format": 0.1}
    assert format_reward("steps\n#### 42\n", None, {}) == {"format": 0.1}
    assert format_reward("\\boxed{42} and then more words", None, {}) == {"format": 0.0}
    assert format_reward("42", None, {}) == {"format": 0.0}
    custom = {"pattern": r"^<answer>.*</answer>$", "format_score": 0.5}
    assert format_reward("<answer>4</answer>", None, {}, **custom) == {"format": 0.5}
    assert format_reward("4", None, {}, **custom) == {"format": 0.0}


def test_math_with_format_sums_components():
    out = math_with_format("Let me think.\n#### 72", GSM8K_TRUTH, {})
    assert out == {"accuracy": 1.0, "format": 0.1}
    assert sum(out.values()) == pytest.approx(1.1)
    assert math_with_format("72", "72", {}, format_score=0.2) == {"accuracy": 1.0, "format": 0.0}
    assert math_with_format("#### 7", "72", {}, format_score=0.2) == {
        "accuracy": 0.0,
        "format": 0.2,
    }
    with pytest.raises(ValueError, match="response_key"):
        math_with_format("#### 7", None, {})
