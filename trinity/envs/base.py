"""The text-environment contract: a `gymnasium.Env` whose actions are the model's replies and whose
observations are chat messages.

    env = ENV.get("guess_number")(low=1, high=50)
    obs, info = env.reset(seed=3)            # obs: {"role": "user", "content": "..."}
    obs, reward, terminated, truncated, info = env.step("25")

- `reset(seed=..., options=...)` returns the first message of the episode (its system prompt is
  `env.system_prompt`, or None). The seed alone decides the episode, so a task row names it.
- `step(reply)` takes the assistant's whole reply text and returns the message that answers it
  (role "user" for what the environment says, "tool" for a tool's result), the reward of this
  step, and whether the episode ended (`terminated`) or ran out of turns (`truncated`).
- `info["reward_components"]`: the named parts of the step's reward (each a float; they sum to
  the reward), reported as metrics by the workflow that runs the environment.
- `success(terminated, reward, info)` (given the last step's results): whether the episode
  solved its task; by default terminated with a positive last reward.
- `expert_action()` (optional): a good next reply in the current state, decided only from what
  the observations have shown; the `env_demos` task generator plays it to write SFT warm-up
  conversations (`trinity.envs.demos`). Environments without one raise NotImplementedError.
- An environment never raises on a bad reply: a reply it cannot parse is answered with a message
  saying so (and usually a step penalty), as a real environment would answer a confused agent.

Environments are registered in `ENV` by name (a dotted path `package.module.Class` works too).
"""

from __future__ import annotations

import copy
import functools
import string
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from trinity.common.registry import Registry

ENV: Registry[type[TextEnv]] = Registry(
    "env",
    modules={
        "countdown_calculator": "trinity.envs.countdown",
        "frozen_lake_text": "trinity.envs.frozen_lake",
        "guess_number": "trinity.envs.guess_number",
        "sciworld": "trinity.envs.sciworld",
    },
)

_TEXT = string.printable + "".join(chr(c) for c in range(0xA0, 0x2FFF))


@functools.cache
def _text_prototype(max_length: int) -> spaces.Text:
    return spaces.Text(max_length, min_length=0, charset=_TEXT)


def text_space(max_length: int = 4096) -> spaces.Text:
    """A text space over printable characters. A fresh space per call (its own random
    generator, seeded on first use), sharing the read-only character tables of one built
    prototype: building them (about 12k characters) for every space would be paid again by
    every environment."""
    return copy.copy(_text_prototype(max_length))


def message(content: str, role: str = "user") -> dict[str, str]:
    return {"role": role, "content": content}


class TextEnv(gym.Env):
    """Base class: sets the spaces; subclasses write `reset` and `step` (see the module doc)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    system_prompt: str | None = None
    tools: ClassVar[list[dict[str, Any]] | None] = None  # OpenAI function definitions, if any
    max_turns: int = 8

    def __init__(self, max_turns: int | None = None) -> None:
        if max_turns is not None:
            if max_turns < 1:
                raise ValueError(f"max_turns must be >= 1, got {max_turns}")
            self.max_turns = max_turns
        self.action_space = text_space()
        self.observation_space = spaces.Dict(
            {"role": spaces.Text(16, charset=string.ascii_lowercase), "content": text_space()}
        )
        self.turns = 0

    def success(self, terminated: bool, reward: float, info: dict[str, Any]) -> bool:
        """Whether an episode that ended with this last step solved its task (the `success`
        metric of `env_workflow`): by default, it terminated with a positive last reward."""
        return terminated and reward > 0

    def expert_action(self) -> str:
        """A good next reply in the current state, decided only from what the observations
        have shown (see the module doc)."""
        raise NotImplementedError(
            f"environment {type(self).__name__} has no expert_action: it cannot write demonstrations"
        )

    def _turn(self) -> bool:
        """Count a step; True when it was the last one allowed (the episode is truncated)."""
        self.turns += 1
        return self.turns >= self.max_turns


def episode_seed(row: dict[str, Any], index: int) -> int:
    """The reset seed of a task row's episodes: the row's `seed`, else its index in the taskset."""
    return int(row["seed"] if row.get("seed") is not None else index)


def first_prompt(
    env: Any, seed: int, options: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Reset `env`; (its first observation, the episode's first messages: the environment's
    system prompt, if any, then that observation)."""
    obs, _ = env.reset(seed=seed, options=options)
    system = getattr(env, "system_prompt", None)
    return dict(obs), ([message(system, "system")] if system else []) + [dict(obs)]
