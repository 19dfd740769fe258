"""The Experience: one trajectory as the trainer sees it.

Token-in/token-out: `tokens` are exactly the ids the engine sampled (prompt + response), never
re-tokenised text. Response-side tensors (`logprobs`, `action_mask`, `advantages`, `returns`,
`token_level_reward`) have length `len(tokens) - prompt_length`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class ExperienceKind(enum.StrEnum):
    SINGLE_TURN = "single_turn"
    MULTI_TURN = "multi_turn"
    DPO = "dpo"
    SFT = "sft"


@dataclass(frozen=True)
class EID:
    """Experience id. `group` (batch, task) is the key GRPO-style advantages normalise over."""

    batch: int = 0  # explore step that produced it
    task: int = 0  # index of the task inside its batch
    run: int = 0  # which of the `repeat_times` samples of the task
    step: int = 0  # turn index for step-wise workflows
    suffix: str = ""  # taskset name, "eval", ...

    @property
    def group(self) -> tuple[int, int, str]:
        return (self.batch, self.task, self.suffix)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "task": self.task,
            "run": self.run,
            "step": self.step,
            "suffix": self.suffix,
        }


@dataclass
class Experience:
    tokens: torch.Tensor  # [L] int64, prompt + response
    prompt_length: int
    logprobs: torch.Tensor | None = None  # [R] float32, from the sampling engine
    action_mask: torch.Tensor | None = None  # [R] bool, 1 = trained token
    reward: float | None = None
    token_level_reward: torch.Tensor | None = None  # [R]
    advantages: torch.Tensor | None = None  # [R]
    returns: torch.Tensor | None = None  # [R]
    eid: EID = field(default_factory=EID)
    model_version: int = 0
    truncated: bool = False
    kind: ExperienceKind = ExperienceKind.SINGLE_TURN
    prompt_text: str | None = None
    response_text: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long)
        n = self.response_length
        if n < 0:
            raise ValueError(
                f"prompt_length {self.prompt_length} exceeds token count {len(self.tokens)}"
            )
        if self.action_mask is None:
            self.action_mask = torch.ones(n, dtype=torch.bool)
        for name in ("logprobs", "action_mask", "advantages", "returns", "token_level_reward"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has length {len(value)}, expected response length {n}")

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def response_tokens(self) -> torch.Tensor:
        return self.tokens[self.prompt_length :]

    # -- serialisation (SQLite rows, files, Ray without torch pickling) -------------------------

    def to_dict(self) -> dict[str, Any]:
        def lst(t: torch.Tensor | None) -> list | None:
            return None if t is None else t.tolist()

        return {
            "tokens": self.tokens.tolist(),
            "prompt_length": self.prompt_length,
            "logprobs": lst(self.logprobs),
            "action_mask": lst(self.action_mask),
            "reward": self.reward,
            "token_level_reward": lst(self.token_level_reward),
            "advantages": lst(self.advantages),
            "returns": lst(self.returns),
            "eid": self.eid.to_dict(),
            "model_version": self.model_version,
            "truncated": self.truncated,
            "kind": self.kind.value,
            "prompt_text": self.prompt_text,
            "response_text": self.response_text,
            "info": self.info,
            "metrics": self.metrics,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Experience:
        def t(v: list | None, dtype: torch.dtype) -> torch.Tensor | None:
            return None if v is None else torch.tensor(v, dtype=dtype)

        return cls(
            tokens=torch.tensor(d["tokens"], dtype=torch.long),
            prompt_length=d["prompt_length"],
            logprobs=t(d.get("logprobs"), torch.float32),
            action_mask=t(d.get("action_mask"), torch.bool),
            reward=d.get("reward"),
            token_level_reward=t(d.get("token_level_reward"), torch.float32),
            advantages=t(d.get("advantages"), torch.float32),
            returns=t(d.get("returns"), torch.float32),
            eid=EID(**d.get("eid", {})),
            model_version=d.get("model_version", 0),
            truncated=d.get("truncated", False),
            kind=ExperienceKind(d.get("kind", "single_turn")),
            prompt_text=d.get("prompt_text"),
            response_text=d.get("response_text"),
            info=d.get("info", {}),
            metrics=d.get("metrics", {}),
        )
