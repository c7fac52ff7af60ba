"""Wire models of the gateway: OpenAI Chat Completions (the subset a harness sends and reads) and the
trainer's session endpoints (`POST /sessions`, `DELETE /sessions/{id}`).

Requests from a harness are untrusted: every string and list is bounded (`MAX_*`), unknown top-level fields
are ignored (OpenAI clients send fields such as `user` or `metadata` that change nothing here), and unknown
fields inside a message are ignored too (a harness may send back the whole message object it received).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from prorl_server.protocol import Trajectory
from prorl_server.protocol.bounded import TaskJson

MAX_NAME_CHARS = 256
MAX_STOP_STRINGS = 16
MAX_TOOLS = 256
MAX_HARNESS_MODELS = 16

HarnessParam = Literal[
    "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "presence_penalty", "frequency_penalty"
]
"""The sampling fields of a chat completion a session may let the harness set (`harness_params`)."""
HARNESS_SAMPLING_FIELDS: tuple[str, ...] = get_args(HarnessParam)


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


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, which OpenAI clients raise as `openai.APIStatusError` subclasses."""

    error: ErrorBody


# the trainer's session endpoints ---------------------------------------------------------------------


class OpenSessionRequest(BaseModel):
    """`POST /sessions`: a standalone session, pinned to one backend, for a harness the trainer runs itself."""

    model_config = ConfigDict(extra="forbid")

    sampling_params: TaskJson = Field(
        default_factory=dict,
        description="Sampling params of every completion (vLLM's names); they win over the harness's, except "
        "for the fields in `harness_params`.",
    )
    harness_params: list[HarnessParam] = Field(
        default_factory=lambda: ["max_tokens"],
        description="Fields of the harness's chat request that are used, overriding `sampling_params`; the "
        "harness's other sampling fields are ignored.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="A name the harness may use for the model besides the backend's served name.",
    )
    accept_any_model: bool = Field(
        default=False,
        description="Answer whatever model name the harness sends (a harness with a model name of its own, "
        "such as Claude Code's); the names it sent are in the result's `harness_models`.",
    )
    data_source: str = Field(default="", max_length=MAX_NAME_CHARS, description="For telemetry, as a job's.")


class SessionOpened(BaseModel):
    """A session's address and key: give both to the harness (`OPENAI_BASE_URL`, `OPENAI_API_KEY`)."""

    session_id: str
    base_url: str = Field(description="The session's OpenAI base URL (ends in /v1).")
    api_key: str = Field(description="The session's own key; it opens this session and nothing else.")
    model: str = Field(description="The model name to send (the alias when one was given).")


class SessionResult(BaseModel):
    """A closed session's recording: one trajectory per segment, in order.

    A segment starts at the first call and whenever the harness's messages are not the previous call's
    messages plus the reply it got plus new messages (a rewrite of its history, or other tools).
    """

    session_id: str
    segments: list[Trajectory]
    rewrites: int = Field(
        description="Segments started after a call had been answered: the harness's history did not continue "
        "the previous call's."
    )
    calls: int = Field(description="Chat completions answered.")
    harness_models: list[str] = Field(
        default_factory=list,
        description=f"The model names the harness's answered calls sent, in order of first use (at most "
        f"{MAX_HARNESS_MODELS}).",
    )
    failed_calls: int = Field(
        description="Valid chat completions that got no reply: the backend failed, or the call was cancelled "
        "(its harness went away, or the session was closed)."
    )
