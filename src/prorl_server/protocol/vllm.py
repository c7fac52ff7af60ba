"""vLLM's OpenAI-compatible wire, once: the requests the fake engines accept and the responses every side reads.

Like vLLM's own `entrypoints/openai/*/protocol.py` (wire models only), for the subset this project speaks:
`/v1/completions`, `/v1/chat/completions`, `/tokenize`, `/detokenize` and `/v1/models`. The client
(`llm.vllm_client`, checks in `llm.vllm_parsing`) validates a backend's answers with the response models;
the dev engine (`devllm`), the simulator (`simllm`) and the test double (`testing`) build their answers
with them and accept requests with the request models.

Requests ignore unknown fields and check types only, as vLLM's do (value checks, worded as vLLM words them,
are in `devllm.validation`). Responses are strict: token ids are JSON integers in `[0, MAX_TOKEN_ID)`,
sampled logprobs are finite and <= 0, and a field the client does not read has a default, so an answer
that leaves it out still parses. vLLM does not report its vocabulary size; llama.cpp's `llama-server`
reports it as `meta.n_vocab` in `/v1/models`.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_TOKEN_ID = 2**31  # exclusive bound on ids when the backend does not report its vocabulary size
TOKEN_ID_PREFIX = "token_id:"  # how `return_tokens_as_token_ids` names a token in logprobs

TokenId = Annotated[int, Field(ge=0)]
"""A token id in a request (checked against the vocabulary by the engine, with vLLM's words)."""
SampledTokenId = Annotated[int, Field(ge=0, lt=MAX_TOKEN_ID)]
"""A token id in a response (strict: a JSON integer, not a float or a boolean)."""
Logprob = Annotated[float, Field(le=0, allow_inf_nan=False)]


def random_id(prefix: str) -> str:
    """`prefix-<32 hex>`, like vLLM's request ids."""
    return f"{prefix}-{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


class WireRequest(BaseModel):
    """Base of the request models: extra fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")


class WireResponse(BaseModel):
    """Base of the response models: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


# --- errors -------------------------------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    """vLLM's error body: `code` is the HTTP status."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """`{"error": {...}}`, what vLLM answers on any failure."""

    error: ErrorInfo


# --- requests -----------------------------------------------------------------------------------------------


class SamplingFields(WireRequest):
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


class TokenizeCompletionRequest(WireRequest):
    """`POST /tokenize` with text."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(WireRequest):
    """`POST /tokenize` with messages, rendered with the model's chat template."""

    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(WireRequest):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[TokenId]


# --- responses ----------------------------------------------------------------------------------------------


class UsageInfo(WireResponse):
    """Token counts of one request."""

    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0


class CompletionLogProbs(WireResponse):
    """`choices[i].logprobs` of `/v1/completions`: the legacy completions logprobs block."""

    text_offset: list[int] | None = None
    token_logprobs: list[Logprob] | None = None
    tokens: list[str] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class WeightVersionSpan(WireResponse):
    """Output tokens `[start, end)` were sampled by the weights the engine labelled `version` (vLLM's
    `WeightVersionSpan`; the dev engine and the simulator put a list of them on a completion's choice)."""

    version: str = Field(max_length=256)
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class CompletionResponseChoice(WireResponse):
    """One completion choice; `prompt_token_ids`/`token_ids` are set with `return_token_ids`; `weight_versions`
    once the engine's tokens are labelled (`POST /update_weight_version`; vLLM reports these spans on its
    token-in-token-out endpoint, not on /v1/completions)."""

    index: int = 0
    text: str = ""
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[Any] | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[SampledTokenId] | None = None
    weight_versions: list[WeightVersionSpan] | None = None


class CompletionResponse(WireResponse):
    """`POST /v1/completions`."""

    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: str = "text_completion"
    created: int = Field(default_factory=_now)
    model: str = ""
    choices: list[CompletionResponseChoice] = Field(min_length=1)
    usage: UsageInfo | None = None


class ChatTopLogprob(WireResponse):
    """One alternative token at a chat position."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    """The sampled token at a chat position, with its alternatives."""

    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatCompletionLogProbs(WireResponse):
    """Chat logprobs: one entry per generated token."""

    content: list[ChatTokenLogprob] | None = None


class ChatMessage(WireResponse):
    """The assistant's reply."""

    role: str = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionResponseChoice(WireResponse):
    """One chat choice; `token_ids` is set with `return_token_ids`."""

    index: int = 0
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[SampledTokenId] | None = None


class ChatCompletionResponse(WireResponse):
    """`POST /v1/chat/completions`; `prompt_token_ids` is set with `return_token_ids`."""

    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: str = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str = ""
    choices: list[ChatCompletionResponseChoice] = Field(min_length=1)
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None


class TokenizeResponse(WireResponse):
    """`POST /tokenize`: the token ids of a text or a rendered conversation."""

    count: int | None = None
    max_model_len: int | None = None
    tokens: list[SampledTokenId]
    token_strs: list[str] | None = None


class DetokenizeResponse(WireResponse):
    """`POST /detokenize`: the text of some token ids (special tokens kept)."""

    prompt: str


class ModelMeta(WireResponse):
    """llama.cpp's `meta` of a model card (vLLM sends none)."""

    n_vocab: PositiveInt | None = None


class ModelCard(WireResponse):
    """One served model; `root` is the path or name the engine loaded the model from."""

    id: str
    object: str = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: PositiveInt | None = None
    meta: ModelMeta | None = Field(default=None, exclude_if=lambda meta: meta is None)


class ModelList(WireResponse):
    """`GET /v1/models`."""

    object: str = "list"
    data: list[ModelCard] = Field(min_length=1)
