"""One task: a dataset row plus what the explorer needs to roll it out and score it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from trinity.rewards.limits import RewardLimits


@dataclass
class Task:
    """A prompt to roll out, its reference answer and the settings of its taskset.

    Exactly one of `prompt` (plaintext) and `messages` (chat form) is the source of the prompt;
    with a system prompt, `messages` is built as [system, user] and `prompt` keeps the user text.
    """

    index: int  # position in its taskset
    raw: dict[str, Any]  # the dataset row, unchanged
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    truth: str | None = None  # the row's `format.response_key`, if present
    taskset_name: str = ""
    is_eval: bool = False
    workflow_type: str | None = None
    reward_fn_type: str | None = None
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn_args: dict[str, Any] = field(default_factory=dict)  # the fn's own keywords
    reward_limits: RewardLimits = field(default_factory=RewardLimits)  # timeout, sandbox, ...
    rollout_args: dict[str, Any] = field(default_factory=dict)  # only the entries that are set
    repeat_times: int | None = None
    reply_prefix: str | None = None  # text the assistant reply is forced to start with
    pair: tuple[str, str] | None = None  # (chosen, rejected) replies of a preference row (DPO)
    tools: list[dict[str, Any]] | None = None  # OpenAI tool definitions (`format.tools_key`)

    def to_messages(self) -> list[dict[str, Any]]:
        """The prompt in chat form (a fresh copy: callers may append to it)."""
        if self.messages is not None:
            return copy.deepcopy(self.messages)
        if self.prompt is None:
            raise ValueError(f"task {self.index} of {self.taskset_name!r} has no prompt")
        return [{"role": "user", "content": self.prompt}]

    def prompt_messages(self) -> list[dict[str, Any]]:
        """The messages a single-turn workflow samples its replies to: `to_messages()`, then,
        with `format.reply_prefix`, an assistant message marked `"prefix": True` that the reply
        is forced to start with (`explorer.bridging.split_reply_prefix`: its tokens are prompt
        tokens, and the sampled reply is what follows it, as in Trinity-RFT)."""
        messages = self.to_messages()
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix, "prefix": True})
        return messages
