"""Reading vLLM's responses: validation against the wire models (`protocol.vllm`) and the checks on what they carry.

The models are strict (prorl_server.protocol.vllm): token ids are JSON integers (not floats, not booleans) in
`[0, MAX_TOKEN_ID)`, and below the vocabulary size when the backend reports one; logprobs are finite and
<= 0. A response that breaks these rules is its backend's failure (BackendProtocolError), so the call
fails over as on any other backend fault instead of handing the trainer corrupt data.

vLLM does not report its vocabulary size (`/v1/models` has `max_model_len` only, and the opt-in
`/tokenizer_info` returns `tokenizer_config.json`, which has no size); llama.cpp's `llama-server` reports
it as `meta.n_vocab` in `/v1/models`, which is used when present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from prorl_server.llm.errors import BackendProtocolError
from prorl_server.protocol import (
    MAX_TOKEN_ID,
    TOKEN_ID_PREFIX,
    CompletionLogProbs,
    CompletionResponse,
    DetokenizeResponse,
    ModelList,
    TokenizeResponse,
    WireResponse,
)


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
M = TypeVar("M", bound=WireResponse)


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
