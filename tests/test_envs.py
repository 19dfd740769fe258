"""The text environments: the gymnasium contract (gymnasium's own checker) and each built-in's
rules on hand-made episodes."""

from __future__ import annotations

import json

import pytest
from gymnasium.utils.env_checker import check_env

from trinity.envs import ENV
from trinity.envs.countdown import calculate
from trinity.envs.frozen_lake import reachable


@pytest.mark.parametrize("name", ["countdown_calculator", "frozen_lake_text", "guess_number"])
def test_every_builtin_passes_gymnasium_s_checker_and_repeats_with_its_seed(name):
    env = ENV.get(name)()
    check_env(env, skip_render_check=True)

    def episode(seed: int) -> tuple:  # what one fixed reply gets from the episode of `seed`
        first = env.reset(seed=seed)[0]
        return first["content"], env.step("50 right")[0]["content"]

    assert episode(5) == episode(5)
    assert len({episode(s) for s in range(20)}) > 1  # the seed draws the episode


def test_each_environment_has_its_own_spaces_and_their_own_random_streams():
    # the spaces share one prototype's character tables, never a random generator: seeding
    # one environment's action space leaves another's draws alone
    a, b = ENV.get("guess_number")(), ENV.get("guess_number")()
    assert a.action_space is not b.action_space
    assert a.observation_space["content"] is not b.observation_space["content"]
    a.action_space.seed(7)
    first = a.action_space.sample()
    a.action_space.seed(7)
    b.action_space.seed(9)  # a shared generator would now be b's
    b.action_space.sample()
    assert a.action_space.sample() == first
    assert a.action_space.contains("héllo, 42!") and not a.action_space.contains("\x00")
    assert a.action_space.max_length == 4096


def test_guess_number_answers_higher_lower_and_ends_on_the_secret():
    env = ENV.get("guess_number")(low=1, high=10, max_turns=4)
    env.reset(seed=0)
    secret = env.secret
    below = max(1, secret - 1)
    obs, reward, done, trunc, info = env.step(f"I guess {below}")
    assert obs["content"] == ("Higher." if below < secret else "Correct!")
    obs, reward, done, trunc, info = env.step("no idea")
    assert (reward, done, info["reward_components"]) == (
        -0.1,
        False,
        {"solved": 0.0, "format": -0.1},
    )
    obs, reward, done, trunc, _ = env.step(str(secret))
    assert (obs["content"], reward, done, trunc) == ("Correct!", 1.0, True, False)
    env.reset(seed=0)
    wrong = secret % 10 + 1  # never the secret
    results = [env.step(str(wrong)) for _ in range(4)]
    assert [r[3] for r in results] == [False, False, False, True]  # truncated at turn 4


def test_frozen_lake_moves_stays_at_the_edge_and_ends_in_goal_or_hole():
    env = ENV.get("frozen_lake_text")(size=3, holes=1)
    env.reset(seed=0)
    env.grid, env.pos = ["SFH", "FFF", "FFG"], (0, 0)
    assert env.step("up")[0]["content"].startswith("PFH")  # the edge: stays put
    obs, reward, done, _, info = env.step("I think right")
    assert env.pos == (0, 1) and not done and info["cell"] == "F"
    obs, reward, done, _, _ = env.step("right")
    assert (obs["content"], reward, done) == ("You fell into a hole.", 0.0, True)
    env.pos = (1, 2)
    obs, reward, done, _, info = env.step("left? no: down")  # the last move named counts
    assert (reward, done, info["reward_components"]) == (1.0, True, {"goal": 1.0, "format": 0.0})
    assert env.step("jump")[1] == -0.1
    assert reachable(["SFH", "FHF", "HFG"]) is False and reachable(["SH", "FG"]) is True


def test_countdown_calculator_tool_and_answers():
    env = ENV.get("countdown_calculator")()
    obs, info = env.reset(seed=1, options={"numbers": [3, 5, 7], "target": 22})
    assert obs["content"] == "Use 3 5 7 to make 22." and info == {
        "numbers": [3, 5, 7],
        "target": 22,
    }
    call = {"name": "calculator", "arguments": {"expression": "3*5+7"}}
    obs, reward, done, _, _ = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert obs == {"role": "tool", "content": "22"} and (reward, done) == (0.0, False)
    assert env.step("hmm")[1] == -0.1
    obs, reward, done, _, info = env.step("<answer>5*7-3</answer>")  # 32: well-formed, wrong
    assert (reward, done, info["reward_components"]) == (
        0.1,
        True,
        {"accuracy": 0.0, "format": 0.1},
    )
    env.reset(options={"numbers": [3, 5, 7], "target": 22})
    assert env.step("So: <answer>(3*5)+7</answer>")[1] == 1.0
    env.reset(options={"numbers": [3, 5, 7], "target": 22})
    assert env.step("<answer>7*3+1</answer>")[1] == 0.1  # 1 is not a given number
    assert calculate("7/2") == "7/2 (= 3.5)" and calculate("1/0") == "error: division by zero"
    assert calculate("__import__('os')").startswith("error:")
