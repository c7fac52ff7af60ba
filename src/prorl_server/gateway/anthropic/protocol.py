"""Wire models of Anthropic's Messages API: the subset a harness sends and reads.

Requests are untrusted: names and lists are bounded, free-form JSON (tool inputs and schemas) is checked as
a job's is, and unknown fields are ignored (`metadata`, `cache_control`, `citations`, ...) except those the
gateway cannot honour, which `translate` refuses. What a harness sends for a model with features this one
lacks is accepted and ignored, as Anthropic's API does for a model without them: `thinking` (any of its
three types), `thinking` and `redacted_thinking` blocks of an assistant turn sent back, tools of another
type than a client tool (server tools such as `web_search_20250305`, dropped). A `system` turn among the
messages is a system message in place. A content block of another type (`image`, `document`, ...) fails
validation, so it is refused with a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorl_server.gateway.protocol import MAX_NAME_CHARS, MAX_STOP_STRINGS, MAX_TOOLS, usable_tools
from prorl_server.protocol import TaskJson


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Lenient):
    """A call the assistant made (`input` is the arguments object)."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    input: TaskJson


class ToolResultBlock(_Lenient):
    """The result of a call, in a user turn."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    content: str | list[TextBlock] | None = None
    is_error: bool = False


class ThinkingBlock(_Lenient):
    """A thinking block of an assistant turn sent back: never produced here, and dropped (as Anthropic drops
    the thinking of earlier turns from the context)."""

    type: Literal["thinking", "redacted_thinking"]


UserBlock = Annotated[TextBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ToolUseBlock | ThinkingBlock, Field(discriminator="type")]


class UserTurn(_Lenient):
    role: Literal["user"]
    content: str | list[UserBlock]


class AssistantTurn(_Lenient):
    role: Literal["assistant"]
    content: str | list[AssistantBlock]


class SystemTurn(_Lenient):
    """A system message among the turns (Claude Code sends one mid-conversation)."""

    role: Literal["system"]
    content: str | list[TextBlock]


Turn = Annotated[UserTurn | AssistantTurn | SystemTurn, Field(discriminator="role")]


class Tool(_Lenient):
    """A client tool; Anthropic's server tools (`bash_20250124`, `web_search_...`) have another `type`."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    description: str | None = None
    input_schema: TaskJson


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    """`thinking`: accepted and ignored (the policy has no separate thinking; no thinking block is answered)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class MessagesRequest(_Lenient):
    """`POST /sessions/{id}/v1/messages`: what the gateway reads of an Anthropic Messages request."""

    model: str = Field(max_length=MAX_NAME_CHARS)
    max_tokens: int = Field(ge=1)
    messages: list[Turn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    thinking: ThinkingConfig | None = None
    mcp_servers: list[Any] | None = Field(default=None, max_length=MAX_TOOLS)
    output_format: TaskJson | None = None
    output_config: TaskJson | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, tools: Any) -> Any:
        return usable_tools(tools, ("custom",))


# answers -------------------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int


class Message(BaseModel):
    """The answer of a non-streamed request (and, with empty content, the `message_start` event's)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextOut | ToolUseOut]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessageUsage


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    """Anthropic's error shape, which its clients raise as `anthropic.APIStatusError` subclasses."""

    type: Literal["error"] = "error"
    error: ErrorDetail
