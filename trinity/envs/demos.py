"""`env_demos`: SFT warm-up conversations written by an environment's expert.

    buffer.trainer_input.experience_buffer:     # an SFT stage's dataset
      storage_type: synthetic
      path: env_demos
      generator_args:
        env: countdown_calculator
        env_args: {max_number: 9, max_target: 30}
        source: countdown                       # whose rows (problems) the episodes play
        source_args: {max_number: 9, max_target: 30}
        num_tasks: 1000                         # episodes
      format: {prompt_type: messages, messages_key: messages}

Each episode resets the environment as `env_workflow` does (the source row's seed, else its
index, and the row as options), so its first prompt is token for token the prompt the RL stage
samples from, tools included; the expert (`TextEnv.expert_action`) then plays it to the end. An
episode of k replies gives k rows: the conversation up to and including reply i, so SFT, which
trains the last assistant message of a row, trains every reply. A row keeps the source row's
fields (minus its question) and `tools` (`format.tools_key`), and the train/test split is the
source generator's, so demonstrations never play a held-out problem.

An expert episode must end solved within `max_turns` (default: the environment's): one that does
not raises ValueError naming its row, since a demonstration that fails teaches failure.
"""

from __future__ import annotations

from typing import Any

from trinity.envs.base import ENV, episode_seed, first_prompt
from trinity.tasks.synthetic import GENERATORS, generate


@GENERATORS.register("env_demos")
def env_demos(
    split: str,
    seed: int = 0,
    num_tasks: int = 1000,
    env: str | None = None,
    env_args: dict[str, Any] | None = None,
    source: str = "env_episodes",
    source_args: dict[str, Any] | None = None,
    max_turns: int | None = None,
) -> list[dict[str, Any]]:
    """Rows `{"messages": [...], "tools": [...] | None, "turn": i, ...}` (see the module doc)."""
    if env is None:
        raise ValueError("env_demos: generator_args.env is required (an ENV name or dotted path)")
    env_cls = ENV.get(env)
    rows = generate(source, split, seed, num_tasks, **(source_args or {}))
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        game = env_cls(**(env_args or {}))
        limit = max_turns or game.max_turns
        _, messages = first_prompt(game, episode_seed(row, index), dict(row))
        tools = getattr(game, "tools", None)
        fields = {k: v for k, v in row.items() if k not in ("question", "messages")}
        for turn in range(limit):
            reply = game.expert_action()
            messages.append({"role": "assistant", "content": reply})
            out.append({**fields, "messages": list(messages), "tools": tools, "turn": turn})
            obs, reward, terminated, truncated, info = game.step(reply)
            if terminated or truncated:
                break
            messages.append(dict(obs))
        if not (terminated and game.success(True, float(reward), info)):
            raise ValueError(
                f"env_demos: the {env!r} expert did not solve row {index} of {source!r} "
                f"({row}) within {limit} turns"
            )
    return out
