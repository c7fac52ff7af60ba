"""Request checks worded and ordered as vLLM's: what it refuses, the message, the `param`, and which check wins.

vLLM checks a request in stages, and the first failing stage answers:

1. the request itself (`check_completion_request`, `check_chat_request`): the prompt is given, `cache_salt`
   is a non-empty string, chat's `top_logprobs` goes with `logprobs`; here also the refusals of what the
   dev engine does not do (`stream`, `echo`, several prompts);
2. the context (`fit_context`): `max_tokens` at most the context length, the prompt shorter than it; then
   `max_tokens` is cut to the room the prompt leaves (not an error: the request ends with "length");
3. the sampling parameters (`sampling_params`): `n`, temperature, top-p, top-k, min-p, `max_tokens` >= 1
   (after the cut: a prompt filling the context fails here), stop strings, the logprobs count, then the
   stop token ids against the vocabulary;
4. the prompt's ids (`check_prompt_ids`): not empty, each in the vocabulary.

A wrong JSON type is caught before all of these by the wire models, as vLLM's pydantic models do
(`validation_error_response`: type "Bad Request", param the field's location, e.g. "body.temperature").
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from prorl_server.devllm.errors import DevLLMRequestError, vllm_error
from prorl_server.devllm.sampler import SamplingParams
from prorl_server.protocol import MAX_LOGPROBS, ChatCompletionRequest, CompletionRequest, SamplingFields

PYDANTIC_ERROR_TYPE = "Bad Request"  # vLLM's `type` for a request its pydantic models reject
NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."


def check_model(requested: str | None, served: str) -> None:
    """A request naming a model other than the one served gets vLLM's 404."""
    if requested is not None and requested != served:
        raise DevLLMRequestError(f"The model `{requested}` does not exist.", param="model", status=HTTPStatus.NOT_FOUND)


def _check_common(body: SamplingFields) -> None:
    if body.stream:
        raise DevLLMRequestError("the dev engine does not stream: send stream=false", param="stream")
    salt = body.cache_salt
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise vllm_error("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")


def check_completion_request(body: CompletionRequest) -> str | list[int]:
    """Stage 1 of a completion; returns its one prompt (text or ids)."""
    prompt = body.prompt
    if prompt is None or prompt == "":
        raise vllm_error(NO_PROMPT, param="prompt")
    if isinstance(prompt, list) and not prompt:
        raise DevLLMRequestError("You must pass at least one prompt")
    _check_common(body)
    if body.echo:
        raise DevLLMRequestError("the dev engine does not echo the prompt: send echo=false", param="echo")
    if isinstance(prompt, str):
        return prompt
    first = prompt[0]
    if isinstance(first, int):
        return [int(token) for token in prompt]  # type: ignore[arg-type]
    if len(prompt) > 1:
        raise DevLLMRequestError(
            f"the dev engine takes one prompt per request, got {len(prompt)}: send them one by one", param="prompt"
        )
    return first


def check_chat_request(body: ChatCompletionRequest) -> None:
    """Stage 1 of a chat completion."""
    _check_common(body)
    top = body.top_logprobs
    if top is not None:
        if top < 0 and top != -1:
            raise vllm_error("`top_logprobs` must be a positive value or -1.", param="top_logprobs", value=top)
        if (top == -1 or top > 0) and not body.logprobs:
            raise vllm_error("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")


def fit_context(
    prompt_len: int, requested: int | None, *, n_ctx: int, name: str = "max_tokens", from_text: bool = False
) -> int:
    """Stage 2: the `max_tokens` to use, `requested` cut to the room the prompt leaves (may be < 1: stage 3
    refuses it). `name` is the field the request set; `from_text` reports an over-long text prompt as vLLM
    does (it stops tokenizing one token past the limit: "at least N+1")."""
    if requested is not None and requested > n_ctx:
        raise vllm_error(
            f"{name}={requested} cannot be greater than max_model_len={n_ctx}. Please request fewer output tokens.",
            param=name,
            value=requested,
        )
    if prompt_len > n_ctx:
        shown = n_ctx + 1 if from_text else prompt_len
        raise vllm_error(
            f"This model's maximum context length is {n_ctx} tokens. However, your prompt contains "
            f"{'at least ' if from_text else ''}{shown} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
            value=shown,
        )
    room = n_ctx - prompt_len
    return room if requested is None else min(requested, room)


def sampling_params(body: SamplingFields, *, max_tokens: int, logprobs: int | None, n_vocab: int) -> SamplingParams:
    """Stage 3: the engine's sampling parameters, with vLLM's neutral defaults and its checks.

    `logprobs` is the number of alternatives asked for (-1: the whole vocabulary, as in vLLM), None for none.
    """
    if body.n < 1:
        raise DevLLMRequestError(f"n must be at least 1, got {body.n}.")
    if body.n > 1:
        raise DevLLMRequestError("the dev engine returns one choice per request: send n=1", param="n")
    temperature = 1.0 if body.temperature is None else body.temperature
    if temperature < 0.0:
        raise vllm_error(
            f"temperature must be non-negative, got {temperature}.", param="temperature", value=temperature
        )
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise vllm_error(f"top_p must be in (0, 1], got {top_p}.", param="top_p", value=top_p)
    top_k = 0 if body.top_k in (None, -1) else body.top_k
    if top_k < 0:
        raise DevLLMRequestError(f"top_k must be 0 (disable), or at least 1, got {body.top_k}.")
    min_p = 0.0 if body.min_p is None else body.min_p
    if not 0.0 <= min_p <= 1.0:
        raise DevLLMRequestError(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens < 1:
        raise vllm_error(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens", value=max_tokens)
    stop = body.stop_strings()
    if any(not s for s in stop):
        raise DevLLMRequestError("stop cannot contain an empty string.")
    if logprobs is not None:
        if logprobs < -1:
            raise vllm_error("`logprobs` must be a positive value or -1.", param="logprobs", value=logprobs)
        wanted = n_vocab if logprobs == -1 else logprobs
        if wanted > MAX_LOGPROBS:
            raise vllm_error(
                f"Requested sample logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
                param="logprobs",
                value=wanted,
            )
    bad_stops = [t for t in body.stop_token_ids or () if not 0 <= t < n_vocab]
    if bad_stops:
        raise vllm_error(
            f"token_id(s) {bad_stops} in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {n_vocab}",
            param="stop_token_ids",
            value=bad_stops,
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=body.seed,
        stop=tuple(stop),
        stop_token_ids=frozenset(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        logprobs=logprobs,
    )


def check_prompt_ids(prompt: list[int], n_vocab: int) -> None:
    """Stage 4: a prompt has at least one id and every id is in the vocabulary (llama.cpp aborts on others)."""
    if not prompt:
        raise DevLLMRequestError("The decoder prompt cannot be empty")
    highest = max(prompt)
    if highest >= n_vocab:
        raise DevLLMRequestError(f"Token id {highest} is out of vocabulary")
    if min(prompt) < 0:  # token-id prompts are refused by the wire model first; kept for direct callers
        raise DevLLMRequestError(f"Token id {min(prompt)} is out of vocabulary")


def _summary(value: Any) -> str:
    """What vLLM shows as an error's `input`: containers by size, anything else as text."""
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list | tuple):
        return f"<list of {len(value)} items>"
    return str(value)


def _where(loc: tuple[int | str, ...], body: Any) -> tuple[int | str, ...]:
    """`loc` without the names pydantic adds for union members (`str`, `list[...]`, a model's name), as vLLM
    reports it (`body.prompt.1`): a name is kept where the request has that key, or lacks it (`missing`)."""
    kept: list[int | str] = []
    node = body
    for i, part in enumerate(loc):
        if isinstance(part, int):
            kept.append(part)
            node = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
        elif isinstance(node, dict) and (part in node or i == len(loc) - 1):
            kept.append(part)
            node = node.get(part)
    return tuple(kept)


def validation_error(errors: Sequence[Any], body: Any) -> tuple[str, str | None]:
    """vLLM's message and param for a request its models reject: "N validation error(s):" then one line per
    error, and the first error's location (`body.temperature`)."""
    lines: list[str] = []
    params: list[str] = []
    for error in errors:
        loc = error.get("loc", ())
        path = loc[:1] + _where(tuple(loc[1:]), body) if loc and loc[0] == "body" else tuple(loc)
        where = ".".join(str(part) for part in path)
        params.append(where)
        shown: dict[str, Any] = {"type": error.get("type"), "loc": where, "msg": error.get("msg")}
        shown["input"] = _summary(error.get("input"))
        if error.get("ctx"):
            shown["ctx"] = {
                k: v if isinstance(v, str | int | float | bool | None) else str(v) for k, v in error["ctx"].items()
            }
        lines.append(f"  {shown}")
    count = len(lines)
    message = f"{count} validation error{'' if count == 1 else 's'}:\n" + "\n".join(lines)
    return message, params[0] if params else None
