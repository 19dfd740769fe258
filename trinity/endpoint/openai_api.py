"""OpenAI request bodies as the endpoint accepts them, and its error format.

Every field OpenAI defines for `/v1/chat/completions` and `/v1/completions` is either acted upon
or refused with a 400 that names it: a parameter the engine cannot honour (penalties, logit bias,
JSON mode, forced tool choice, echo) is an error, never silently ignored, and so is a field
OpenAI does not define ("Unrecognized request argument supplied"). `top_k` is accepted as vLLM's
extension.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class APIError(Exception):
    """An error answered in OpenAI's format: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class _Sampling(_Strict):
    """Fields both endpoints share."""

    model: str
    n: int = Field(1, ge=1, le=16)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stop

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> _Sampling:
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (use 0)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        return self

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatMessage(BaseModel):
    """One message; content may be a string or a list of text parts. Extra keys a client keeps
    on messages (e.g. `refusal`, `annotations` from a response it appends) are dropped."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if isinstance(self.content, list):
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
        for call in self.tool_calls or []:
            fn = call.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError("each tool call needs function.name")
            if isinstance(fn.get("arguments"), str):
                try:
                    json.loads(fn["arguments"])
                except json.JSONDecodeError as e:
                    raise ValueError(f"tool call arguments are not JSON: {e}") from None
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it: text parts joined, tool-call arguments as
        objects (templates serialise them themselves)."""
        out: dict[str, Any] = {"role": self.role}
        text = self.content
        if isinstance(text, list):
            text = "".join(part["text"] for part in text)
        if text is not None:
            out["content"] = text
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": _as_object(call["function"].get("arguments", {})),
                    },
                }
                for call in self.tool_calls
            ]
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def _as_object(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _refuse_chat_unsupported(self) -> ChatRequest:
        if self.top_logprobs:
            raise ValueError(
                "top_logprobs > 0 is not supported (the engine returns the sampled tokens' logprobs)"
            )
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError("tool_choice 'auto' or 'none' only (forcing a call is not supported)")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("response_format other than {'type': 'text'} is not supported")
        return self

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template renders them: also under `tool_choice: "none"` (as
        vLLM renders them), so a call that may not use the tools continues the conversation's
        prompt exactly (an agent's last, tool-less turn stays in its trajectory)."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def parses_calls(self) -> bool:
        """Whether replies are parsed for tool calls: there are tools and a call is allowed."""
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _refuse_completion_unsupported(self) -> CompletionRequest:
        if self.logprobs:
            raise ValueError(
                "logprobs > 0 alternatives are not supported (use 0 for the sampled tokens')"
            )
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class FeedbackRequest(_Strict):
    """POST /feedback (`trinity.endpoint.feedback`): a reward for a session, a call or a turn."""

    session_id: str
    reward: float = Field(allow_inf_nan=False)
    key: str = Field(min_length=1, max_length=256)
    call_id: str | None = None
    turn: int | None = Field(None, ge=0)


class CommitRequest(_Strict):
    """POST /commit: the session is over; the `group_size` sessions of one `group` are
    compared (GRPO) and trained together, once all are ready."""

    session_id: str
    group: str | None = Field(None, max_length=256)
    group_size: int | None = Field(None, ge=1, le=4096)
