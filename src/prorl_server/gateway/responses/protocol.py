"""Wire models of OpenAI's Responses API: the subset a harness sends, and the response and stream events
the gateway answers with (the shapes of the `openai` SDK's `types/responses`).

As in the chat protocol, requests are untrusted and bounded, unknown top-level fields and unknown fields
of an item are ignored. What harnesses always send for OpenAI's models and a model without those features
lacks is accepted and ignored: `include` (nothing it names exists here), `reasoning` options, `text.verbosity`,
`reasoning` input items, and tools of a type the policy cannot call (built-in tools, Codex's `namespace`
tools), dropped. What the gateway cannot honour (images and files, other item types, structured output,
...) fails validation or `translate`'s checks with a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from prorl_server.gateway.protocol import MAX_NAME_CHARS, MAX_TOOLS, usable_tools
from prorl_server.protocol import TaskJson

MAX_METADATA_KEYS = 16
MAX_INCLUDES = 32


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextContent(_Lenient):
    """A text part of an input message (`input_text`, or `output_text` in an assistant message sent back);
    image, file and audio parts are refused."""

    type: Literal["input_text", "output_text"]
    text: str


ItemContent = str | list[TextContent]


class MessageItem(_Lenient):
    """A message (`{"role", "content"}`, with or without `"type": "message"`)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: ItemContent


class FunctionCallItem(_Lenient):
    """A call the model made, as a harness sends it back."""

    type: Literal["function_call"]
    call_id: str = Field(max_length=MAX_NAME_CHARS)
    name: str = Field(max_length=MAX_NAME_CHARS)
    arguments: str


class FunctionCallOutputItem(_Lenient):
    """The result of a call."""

    type: Literal["function_call_output"]
    call_id: str = Field(max_length=MAX_NAME_CHARS)
    output: ItemContent


class ReasoningItem(_Lenient):
    """A reasoning item sent back (its summary and encrypted content): never produced here, and dropped."""

    type: Literal["reasoning"]


def _item_type(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else ""


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_type,
        custom_error_type="unsupported_item",
        custom_error_message="only items of type 'message', 'function_call', 'function_call_output' and "
        "'reasoning' are supported",
    ),
]


class FunctionTool(_Lenient):
    """A function the model may call (`{"type": "function", "name", "description", "parameters", "strict"}`);
    tools of other types (web_search, file_search, local_shell, namespace, ...) are dropped before."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    description: str | None = None
    parameters: TaskJson | None = None
    strict: bool | None = None


class ResponsesRequest(_Lenient):
    """`POST /sessions/{id}/v1/responses`: what the gateway reads of a Responses request."""

    model: str = Field(max_length=MAX_NAME_CHARS)
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | TaskJson | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    previous_response_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    store: bool = True
    parallel_tool_calls: bool | None = None
    metadata: Annotated[dict[str, str], Field(max_length=MAX_METADATA_KEYS)] | None = None
    # accepted and ignored: the policy's reasoning cannot be configured, and nothing `include` names exists here
    reasoning: TaskJson | None = None
    include: list[Annotated[str, Field(max_length=MAX_NAME_CHARS)]] | None = Field(
        default=None, max_length=MAX_INCLUDES
    )
    # refused unless they ask for nothing (translate.refuse_unsupported); `text.verbosity` is ignored
    text: TaskJson | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    conversation: str | TaskJson | None = None
    prompt: TaskJson | None = None
    top_logprobs: int | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _callable_tools(cls, tools: Any) -> Any:
        return usable_tools(tools, ("function",))


# answers -------------------------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The model's text, one `output_text` part."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    """A call the model made; `call_id` is what its `function_call_output` answers."""

    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str


OutputItem = OutputMessage | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response (`object: "response"`), also the payload of the lifecycle stream events."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool
    temperature: float | None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None
    metadata: dict[str, str] = Field(default_factory=dict)
