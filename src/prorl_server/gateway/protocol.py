"""Wire models of the gateway: OpenAI Chat Completions (the subset a harness sends and reads).

The trainer's session endpoints (`POST /sessions`, `DELETE /sessions/{id}`) are `protocol.sessions`.

Requests from a harness are untrusted: every string and list is bounded (`MAX_*`), unknown top-level fields
are ignored (OpenAI clients send fields such as `user`, `metadata` or `reasoning_effort` that change nothing
here), and unknown fields inside a message are ignored too (a harness may send back the whole message object
it received). Tools of a type the policy cannot call (anything but `function`) are dropped
(`usable_tools`).
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorl_server.protocol import HARNESS_SAMPLING_FIELDS, MAX_NAME_CHARS, TaskJson

MAX_STOP_STRINGS = 16
MAX_TOOLS = 256

log = logging.getLogger(__name__)


def usable_tools(tools: Any, usable: Container[str]) -> Any:
    """`tools` (a request's raw list) without the tools whose `type` is a string not in `usable`: built-in
    tools the gateway does not run (`web_search`, `local_shell`, Anthropic's server tools, ...) and
    Codex's `namespace` tools, which the policy cannot call; each dropped one is logged (debug). Anything
    else is left for validation."""
    if not isinstance(tools, list):
        return tools
    kept = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind not in usable:
            log.debug("gateway: dropped a tool of type %r (%r): the policy cannot call it", kind[:64], tool.get("name"))
            continue
        kept.append(tool)
    return kept


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    """A text part of a message's content (`{"type": "text", "text": ...}`); other part types are refused."""

    type: Literal["text"]
    text: str


Content = str | list[TextPart] | None


class FunctionCall(_Lenient):
    """The function of a tool call: its name and its arguments as a JSON string (OpenAI's shape)."""

    name: str = Field(max_length=MAX_NAME_CHARS)
    arguments: str


class ToolCallParam(_Lenient):
    """A tool call of an assistant message as a harness sends it back."""

    id: str = Field(max_length=MAX_NAME_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Lenient):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class UserMessage(_Lenient):
    role: Literal["user"]
    content: Content
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: Content = None
    tool_calls: list[ToolCallParam] | None = None
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class ToolMessage(_Lenient):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(max_length=MAX_NAME_CHARS)


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    description: str | None = None
    parameters: TaskJson | None = None
    strict: bool | None = None


class ToolDefinition(_Lenient):
    """A tool the model may call (`{"type": "function", "function": {...}}`)."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: TaskJson


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    """`POST /sessions/{id}/v1/chat/completions`: what the gateway reads of an OpenAI chat request."""

    model: str = Field(max_length=MAX_NAME_CHARS)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    @field_validator("tools", mode="before")
    @classmethod
    def _callable_tools(cls, tools: Any) -> Any:
        return usable_tools(tools, ("function",))

    def harness_sampling(self) -> dict[str, Any]:
        """The sampling fields the harness set (`max_completion_tokens` read as `max_tokens`)."""
        values = {name: getattr(self, name) for name in HARNESS_SAMPLING_FIELDS if getattr(self, name) is not None}
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        return values


# answers -------------------------------------------------------------------------------------------


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantReply(BaseModel):
    """The message of a choice."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantReply
    finish_reason: str
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """The answer of a non-streaming chat completion."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "prorl-server"


class ModelList(BaseModel):
    """`GET /sessions/{id}/v1/models`: the one model the session answers as."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class SessionProbe(BaseModel):
    """`GET` (or `HEAD`) of a session's base URL: that it is open, and its model names."""

    object: Literal["session"] = "session"
    id: str
    models: list[str]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, which OpenAI clients raise as `openai.APIStatusError` subclasses."""

    error: ErrorBody
