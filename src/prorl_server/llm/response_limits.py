"""How many bytes a backend's answer may have: bounded by what the request asked for.

The client reads every body as a stream and refuses it (as that backend's failure) once it passes its
bound, or before reading when an announced Content-Length already does; so a backend cannot make the
server hold more than a small multiple of what a correct answer needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENVELOPE_BYTES = 64 * 1024  # everything of a response that does not grow with the request
BYTES_PER_OUTPUT_TOKEN = 2048  # id, logprob, text, token string, top-logprob entry: JSON-escaped, with margin
BYTES_PER_PROMPT_TOKEN = 16  # vLLM echoes `prompt_token_ids` with `return_token_ids`
BYTES_PER_INPUT_BYTE = 32  # /tokenize: at most one id (a dozen bytes of JSON) per byte of input
HEALTH_BYTES = 64 * 1024
MODELS_BYTES = 1024 * 1024
ERROR_BYTES = 64 * 1024  # of an error body, what is read for the message (the rest is dropped)
FALLBACK_MAX_NEW_TOKENS = 32768  # when neither max_tokens nor the context length is known


def requested_tokens(sampling_params: Mapping[str, Any], prompt_len: int, max_model_len: int | None) -> int | None:
    """The most tokens a completion may return: `max_tokens`, else what is left of the context (vLLM's default)."""
    max_tokens = sampling_params.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        return max_tokens
    if max_model_len is not None:
        return max(max_model_len - prompt_len, 0)
    return None


def completion_bytes(max_new_tokens: int | None, prompt_len: int) -> int:
    """Bound of a `/v1/completions` answer."""
    new = FALLBACK_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    return ENVELOPE_BYTES + BYTES_PER_OUTPUT_TOKEN * new + BYTES_PER_PROMPT_TOKEN * prompt_len


def tokenize_bytes(request_bytes: int) -> int:
    """Bound of a `/tokenize` answer to a request body of `request_bytes`."""
    return ENVELOPE_BYTES + BYTES_PER_INPUT_BYTE * request_bytes


def detokenize_bytes(ids: int) -> int:
    """Bound of a `/detokenize` answer for `ids` token ids."""
    return ENVELOPE_BYTES + BYTES_PER_OUTPUT_TOKEN * ids
