"""The vLLM responses prorl-server reads, as strict pydantic models, and the checks on what they carry.

Like vLLM's own `protocol.py`, but for what comes back, and only the fields the client uses (others are
ignored). Every field is strict: token ids are JSON integers (not floats, not booleans) in
`[0, MAX_TOKEN_ID)`, and below the vocabulary size when the backend reports one; logprobs are finite and
<= 0. A response that breaks these rules is its backend's failure (BackendProtocolError), so the call
fails over as on any other backend fault instead of handing the trainer corrupt data.

vLLM does not report its vocabulary size (`/v1/models` has `max_model_len` only, and the opt-in
`/tokenizer_info` returns `tokenizer_config.json`, which has no size); llama.cpp's `llama-server` reports
it as `meta.n_vocab` in `/v1/models`, which is used when present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from prorl_server.llm.errors import BackendProtocolError

MAX_TOKEN_ID = 2**31  # exclusive bound on ids when the backend does not report its vocabulary size
TOKEN_ID_PREFIX = "token_id:"

TokenId = Annotated[int, Field(ge=0, lt=MAX_TOKEN_ID)]
Logprob = Annotated[float, Field(le=0, allow_inf_nan=False)]


class _Response(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class CompletionLogProbs(_Response):
    """`choices[i].logprobs` of `/v1/completions`."""

    tokens: list[str] | None = None
    token_logprobs: list[Logprob] | None = None


class WeightVersionSpan(_Response):
    """Output tokens `[start, end)` were sampled by the weights the engine labelled `version` (vLLM's
    `WeightVersionSpan`; the dev engine and the simulator put a list of them on a completion's choice)."""

    version: str = Field(max_length=256)
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class CompletionResponseChoice(_Response):
    """One choice; `token_ids` is there with `return_token_ids: true`; `weight_versions` when the engine's
    tokens are labelled with weight versions (`POST /update_weight_version`) and it reports them."""

    text: str = ""
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[TokenId] | None = None
    weight_versions: list[WeightVersionSpan] | None = None


class CompletionResponse(_Response):
    """`POST /v1/completions`."""

    choices: list[CompletionResponseChoice] = Field(min_length=1)


class TokenizeResponse(_Response):
    """`POST /tokenize`."""

    tokens: list[TokenId]


class DetokenizeResponse(_Response):
    """`POST /detokenize`."""

    prompt: str


class ModelMeta(_Response):
    """llama.cpp's `meta` of a model card (vLLM sends none)."""

    n_vocab: PositiveInt | None = None


class ModelCard(_Response):
    """One served model."""

    id: str
    max_model_len: PositiveInt | None = None
    root: str | None = None
    meta: ModelMeta | None = None


class ModelList(_Response):
    """`GET /v1/models`."""

    data: list[ModelCard] = Field(min_length=1)


@dataclass(frozen=True)
class Completion:
    """What one `/v1/completions` call produced."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str
    stop_reason: int | str | None = None
    """vLLM's: the stop string (or stop token id) the completion ended on; None at end of turn or length."""
    weight_spans: list[tuple[str, int, int]] | None = None
    """The engine's weight-version label of each range of output tokens (label, start, end), if it reports them."""


@dataclass(frozen=True)
class ServedModel:
    """A model a backend serves: its id, context length, vocabulary size and `root` (vLLM's: the path or
    name it loaded the model from); None when not reported."""

    id: str
    max_model_len: int | None
    vocab_size: int | None = None
    root: str | None = None


Body = bytes | bytearray | str | dict[str, Any]
M = TypeVar("M", bound=_Response)


def parse_completion(body: Body, *, max_tokens: int | None = None, vocab_size: int | None = None) -> Completion:
    """Token ids and sampled logprobs of a completion response, checked.

    Prefers `choices[0].token_ids` (`return_token_ids: true`); falls back to the `"token_id:N"` strings
    that `--return-tokens-as-token-ids` puts in `logprobs.tokens`. At most `max_tokens` ids are accepted.
    """
    choice = _validate(CompletionResponse, body, "completion").choices[0]
    block = choice.logprobs
    ids = choice.token_ids if choice.token_ids is not None else _ids_from_token_strings(block)
    if block is None or block.token_logprobs is None:
        raise BackendProtocolError("completion response carries no logprobs.token_logprobs (send logprobs: 0)")
    if len(block.token_logprobs) != len(ids):
        raise BackendProtocolError(
            f"completion response has {len(ids)} token ids but {len(block.token_logprobs)} logprobs"
        )
    if max_tokens is not None and len(ids) > max_tokens:
        raise BackendProtocolError(f"completion response has {len(ids)} token ids, more than max_tokens={max_tokens}")
    check_vocabulary(ids, vocab_size, "completion")
    return Completion(
        output_ids=ids,
        logprobs=block.token_logprobs,
        finish_reason=choice.finish_reason,
        text=choice.text,
        stop_reason=choice.stop_reason,
        weight_spans=None
        if choice.weight_versions is None
        else [(span.version, span.start, span.end) for span in choice.weight_versions],
    )


def parse_tokens(body: Body, *, vocab_size: int | None = None) -> list[int]:
    """The ids of a `/tokenize` response, checked."""
    tokens = _validate(TokenizeResponse, body, "/tokenize").tokens
    check_vocabulary(tokens, vocab_size, "/tokenize")
    return tokens


def parse_detokenized(body: Body) -> str:
    """The text of a `/detokenize` response."""
    return _validate(DetokenizeResponse, body, "/detokenize").prompt


def parse_served_model(body: Body) -> ServedModel:
    """The first model of a `/v1/models` response."""
    card = _validate(ModelList, body, "/v1/models").data[0]
    return ServedModel(
        id=card.id,
        max_model_len=card.max_model_len,
        vocab_size=card.meta.n_vocab if card.meta else None,
        root=card.root,
    )


def check_vocabulary(ids: list[int], vocab_size: int | None, what: str) -> None:
    """Refuse ids at or past the backend's vocabulary size (when it reported one)."""
    if vocab_size is not None and ids and (largest := max(ids)) >= vocab_size:
        raise BackendProtocolError(f"{what} response has token id {largest}, outside the vocabulary of {vocab_size}")


def _ids_from_token_strings(block: CompletionLogProbs | None) -> list[int]:
    tokens = block.tokens if block is not None else None
    if tokens is None or not all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        raise BackendProtocolError(
            "completion response has neither choices[0].token_ids nor token_id:N tokens; "
            "serve with a vLLM that supports return_token_ids (>= 0.10.2) or --return-tokens-as-token-ids"
        )
    ids: list[int] = []
    for token in tokens:
        digits = token[len(TOKEN_ID_PREFIX) :]
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 10) or int(digits) >= MAX_TOKEN_ID:
            raise BackendProtocolError(f"completion response has {token[:40]!r} in logprobs.tokens, not token_id:N")
        ids.append(int(digits))
    return ids


def _validate(model: type[M], body: Body, what: str) -> M:
    try:
        if isinstance(body, dict):
            return model.model_validate(body)
        return model.model_validate_json(body)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)[:3]
        ]
        raise BackendProtocolError(f"malformed {what} response: " + "; ".join(problems)) from None
