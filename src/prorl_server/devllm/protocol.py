"""Wire models of the dev engine: the subset of vLLM's OpenAI-compatible protocol, with vLLM's field names.

Unknown request fields are ignored (as vLLM does). The models check types only, as vLLM's do (a wrong type
is vLLM's "Bad Request" listing pydantic's errors); value checks (ranges, context length, vocabulary) are
in `validation`, worded as vLLM words them. Fields vLLM knows and this engine does not implement
(`n > 1`, several prompts, `stream`, `echo`) are refused with a 400 rather than silently dropped.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs

TokenId = Annotated[int, Field(ge=0)]


def random_id(prefix: str) -> str:
    """`prefix-<32 hex>`, like vLLM's request ids."""
    return f"{prefix}-{uuid.uuid4().hex}"


class WireModel(BaseModel):
    """Base of the request models: extra fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")


class ErrorInfo(BaseModel):
    """vLLM's error body: `code` is the HTTP status."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """`{"error": {...}}`, what vLLM answers on any failure."""

    error: ErrorInfo


class SamplingFields(WireModel):
    """Sampling parameters shared by completions and chat completions (vLLM names, types and defaults)."""

    model: str | None = None
    temperature: float | None = Field(default=None, description="default 1.0; below 1e-5 is greedy")
    top_p: float | None = None
    top_k: int | None = Field(default=None, description="0 or -1 disables")
    min_p: float | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    priority: int = Field(default=0, description="lower runs first when requests queue")
    cache_salt: Any = Field(default=None, description="a non-empty string: prefix reuse only within the same salt")
    n: int = 1
    stream: bool | None = False

    def stop_strings(self) -> list[str]:
        """`stop` as a list (an empty string in it is refused by the validation, as vLLM does)."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`: one prompt, as text or token ids (or a batch of exactly one of those)."""

    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    add_special_tokens: bool = True


class CompletionLogProbs(BaseModel):
    """The legacy completions logprobs block."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class WeightVersionSpan(BaseModel):
    """Output tokens `[start, end)` were sampled under the weight version labelled `version` (vLLM's shape)."""

    version: str
    start: int
    end: int


class CompletionResponseChoice(BaseModel):
    """One completion choice; `prompt_token_ids`/`token_ids` are set with `return_token_ids`; `weight_versions`
    once the engine's tokens are labelled (`POST /update_weight_version`; vLLM reports these spans on its
    token-in-token-out endpoint, not on /v1/completions)."""

    index: int = 0
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    weight_versions: list[WeightVersionSpan] | None = None


class UsageInfo(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """`/v1/completions` answer."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`: plain text chat rendered with the model's own chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    max_tokens: int | None = Field(default=None, description="deprecated alias of max_completion_tokens")
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class ChatTopLogprob(BaseModel):
    """One alternative token at a chat position."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    """The sampled token at a chat position, with its alternatives."""

    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatCompletionLogProbs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[ChatTokenLogprob] | None = None


class ChatMessage(BaseModel):
    """The assistant's reply."""

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionResponseChoice(BaseModel):
    """One chat choice; `token_ids` is set with `return_token_ids`."""

    index: int = 0
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    """`/v1/chat/completions` answer; `prompt_token_ids` is set with `return_token_ids`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None


class TokenizeCompletionRequest(WireModel):
    """`POST /tokenize` with text."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(WireModel):
    """`POST /tokenize` with messages, rendered with the model's chat template."""

    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeResponse(BaseModel):
    """Token ids of a text or a rendered conversation."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(WireModel):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    """The text of some token ids (special tokens kept)."""

    prompt: str


class ModelCard(BaseModel):
    """One served model."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "prorl-devllm"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class SampledRecord(BaseModel):
    """What the engine sampled for one request (`GET /debug/sampled`, opt-in)."""

    request_id: str
    slot: int
    reused_prefix: int = Field(description="prompt tokens whose KV cache the slot already held")
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    seed: int | None
    cache_salt: str | None = None
