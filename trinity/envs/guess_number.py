"""Guess the number: a dialogue in which the environment answers "higher" or "lower".

The secret is drawn from [low, high] by the reset seed. Each reply's first integer is the guess.
Reward: 1 for the right guess (the episode ends), -0.1 for a reply holding no integer, 0
otherwise; a guess outside [low, high] is answered as any other. Components: "solved", "format".
"""

from __future__ import annotations

import re
from typing import Any

from trinity.envs.base import ENV, TextEnv, message

_INT = re.compile(r"-?\d+")


@ENV.register("guess_number")
class GuessNumber(TextEnv):
    system_prompt = "Guess the secret number. Reply with one integer per turn."
    max_turns = 8

    def __init__(self, low: int = 1, high: int = 100, max_turns: int | None = None) -> None:
        super().__init__(max_turns)
        if low > high:
            raise ValueError(f"low ({low}) must be <= high ({high})")
        self.low, self.high = low, high
        self.secret = low
        self.bounds = (low, high)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(self.low, self.high + 1))
        self.turns = 0
        self.bounds = (self.low, self.high)  # what the answers so far leave possible
        text = f"I picked an integer from {self.low} to {self.high}. Your guess?"
        return message(text), {}

    def expert_action(self) -> str:
        """Binary search: the middle of the range the "higher"/"lower" answers left open."""
        lo, hi = self.bounds
        return str((lo + hi) // 2)

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        last = self._turn()
        m = _INT.search(action)
        if m is None:
            comps = {"solved": 0.0, "format": -0.1}
            reply, done = "Reply with an integer.", False
        else:
            guess = int(m.group())
            done = guess == self.secret
            comps = {"solved": float(done), "format": 0.0}
            reply = "Correct!" if done else ("Higher." if guess < self.secret else "Lower.")
            lo, hi = self.bounds
            if guess < self.secret:
                self.bounds = (max(lo, guess + 1), hi)
            elif guess > self.secret:
                self.bounds = (lo, min(hi, guess - 1))
        info = {"reward_components": comps, "secret": self.secret}
        return message(reply), sum(comps.values()), done, last and not done, info
