"""Reward functions: `fn(response, truth, task_raw, **args) -> dict[str, float]`, registered by name.

    from trinity.rewards import REWARD_FN
    components = REWARD_FN.get("math_reward")(response, task.truth, task.raw, **task.reward_fn_args)
    reward = sum(components.values())

Built in: arithmetic_reward, countdown_reward, exact_match, math_reward, format_reward,
math_with_format, math_boxed_reward, reasoning_gym_reward, math_dapo_reward,
math_boxed_reward_naive_dapo, rm_gallery_reward (with the rm-gallery package installed).
A dotted path (`my_pkg.rewards.my_fn`) loads a user's function.
"""

from trinity.rewards.arithmetic import arithmetic_reward, last_number
from trinity.rewards.base import REWARD_FN, RewardFn, needs_task_fields, needs_truth
from trinity.rewards.countdown import countdown_reward, parse_expression
from trinity.rewards.dapo import math_boxed_reward_naive_dapo, math_dapo_reward, naive_dapo_score
from trinity.rewards.exact_match import exact_match
from trinity.rewards.math_answer import (
    DEFAULT_FORMAT_PATTERN,
    answers_match,
    extract_answer,
    format_reward,
    last_boxed_content,
    math_boxed_reward,
    math_reward,
    math_with_format,
)
from trinity.rewards.reasoning_gym_reward import reasoning_gym_reward
from trinity.rewards.rm_gallery import rm_gallery_reward

__all__ = [
    "DEFAULT_FORMAT_PATTERN",
    "REWARD_FN",
    "RewardFn",
    "answers_match",
    "arithmetic_reward",
    "countdown_reward",
    "exact_match",
    "extract_answer",
    "format_reward",
    "last_boxed_content",
    "last_number",
    "math_boxed_reward",
    "math_boxed_reward_naive_dapo",
    "math_dapo_reward",
    "math_reward",
    "math_with_format",
    "naive_dapo_score",
    "needs_task_fields",
    "needs_truth",
    "parse_expression",
    "reasoning_gym_reward",
    "rm_gallery_reward",
]
