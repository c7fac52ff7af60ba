"""FastAPI routes of the dev engine: vLLM's paths, field names and error shape over a `DevEngine`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from prorl_server.devllm.engine import DevEngine, Generation
from prorl_server.devllm.errors import DevLLMRequestError
from prorl_server.devllm.protocol import (
    ChatCompletionLogProbs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    SampledRecord,
    SamplingFields,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    UsageInfo,
    random_id,
)
from prorl_server.devllm.sampler import SamplingParams

T = TypeVar("T")
CLIENT_CLOSED = 499  # the status nobody reads: the client is gone
LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this for JSON


def error_response(message: str, *, status: int, error_type: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body with `code` = the HTTP status."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


def sampling_params(body: SamplingFields, *, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """The engine's sampling parameters from a request, with vLLM's neutral defaults."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        min_p=body.min_p or 0.0,
        seed=body.seed,
        stop=tuple(body.stop_strings()),
        stop_token_ids=frozenset(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        logprobs=logprobs,
    )


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Await `work`, cancelling it if the client disconnects first (then None)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    finally:
        watcher.cancel()
        task.cancel()


def _clamp(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


class _TokenNames:
    """How tokens are shown in logprobs: their text, or `token_id:N` (`return_tokens_as_token_ids`)."""

    def __init__(self, engine: DevEngine, as_ids: bool) -> None:
        self._engine = engine
        self._as_ids = as_ids

    def __call__(self, token: int) -> str:
        return f"token_id:{token}" if self._as_ids else self._engine.token_str(token)


def completion_logprobs(gen: Generation, name: _TokenNames) -> CompletionLogProbs:
    """vLLM's completions logprobs block: sampled token first in each `top_logprobs` entry, then the top N."""
    n_top = gen.params.logprobs or 0
    tokens = [name(t) for t in gen.output_ids]
    offsets = [0, *itertools.accumulate(len(t) for t in tokens)][: len(tokens)]
    top: list[dict[str, float] | None] = []
    for token, logprob, alternatives in zip(gen.output_ids, gen.logprobs, gen.top_logprobs or [], strict=True):
        by_id = {token: logprob}
        for alt, alt_logprob in alternatives:
            by_id.setdefault(alt, alt_logprob)
        top.append({name(t): _clamp(lp) for t, lp in list(by_id.items())[: n_top + 1]})
    return CompletionLogProbs(
        text_offset=offsets, token_logprobs=[_clamp(lp) for lp in gen.logprobs], tokens=tokens, top_logprobs=top
    )


def chat_logprobs(gen: Generation, name: _TokenNames) -> ChatCompletionLogProbs:
    """vLLM's chat logprobs: one entry per generated token with its top alternatives."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = name(token)
        return {"token": text, "logprob": _clamp(logprob), "bytes": list(text.encode("utf-8"))}

    return ChatCompletionLogProbs(
        content=[
            ChatTokenLogprob(
                **entry(token, logprob), top_logprobs=[ChatTopLogprob(**entry(t, lp)) for t, lp in alternatives]
            )
            for token, logprob, alternatives in zip(gen.output_ids, gen.logprobs, gen.top_logprobs or [], strict=True)
        ]
    )


def usage(gen: Generation) -> UsageInfo:
    """Prompt and completion token counts."""
    n_prompt, n_out = len(gen.prompt_ids), len(gen.output_ids)
    return UsageInfo(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)


def create_app(engine: DevEngine) -> FastAPI:
    """The app serving `engine`; the caller owns the engine (and closes it)."""
    app = FastAPI(title="prorl-server dev LLM engine (vLLM protocol subset)")
    app.state.engine = engine

    @app.exception_handler(DevLLMRequestError)
    async def request_error(_: Request, exc: DevLLMRequestError) -> JSONResponse:
        return error_response(exc.message, status=exc.status.value, error_type=exc.error_type, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [[part for part in p["loc"][1:] if isinstance(part, str)] for p in exc.errors()]  # past "body"
        message = "; ".join(f"{'.'.join(f) or 'body'}: {p['msg']}" for f, p in zip(fields, exc.errors(), strict=True))
        param = fields[0][0] if fields and fields[0] else None
        return error_response(message, status=400, error_type="BadRequestError", param=param)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(f"{type(exc).__name__}: {exc}", status=500, error_type="InternalServerError")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(id=engine.model_name, root=str(engine.model_path), max_model_len=engine.n_ctx)
        return ModelList(data=[card])

    @app.post("/tokenize")
    async def tokenize(body: TokenizeChatRequest | TokenizeCompletionRequest) -> TokenizeResponse:
        engine.check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            text = engine.render_chat(
                body.messages,
                add_generation_prompt=body.add_generation_prompt,
                tools=body.tools,
                template_kwargs=body.chat_template_kwargs,
            )
        else:
            text = body.prompt
        ids = engine.tokenize(text, add_special_tokens=body.add_special_tokens)
        strs = [engine.token_str(i) for i in ids] if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=engine.n_ctx, tokens=ids, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        engine.check_model(body.model)
        return DetokenizeResponse(prompt=engine.detokenize(body.tokens))

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse | Response:
        engine.check_model(body.model)
        if isinstance(body.prompt, str):
            prompt = engine.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            prompt = list(body.prompt)
        params = sampling_params(body, max_tokens=engine.check_prompt(prompt, body.max_tokens), logprobs=body.logprobs)
        request_id = random_id("cmpl")
        gen = await until_disconnected(request, engine.generate(request_id, prompt, params, priority=body.priority))
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        name = _TokenNames(engine, bool(body.return_tokens_as_token_ids))
        choice = CompletionResponseChoice(
            text=gen.text,
            logprobs=completion_logprobs(gen, name) if body.logprobs is not None else None,
            finish_reason=gen.finish_reason,
            stop_reason=gen.stop_reason,
            prompt_token_ids=prompt if body.return_token_ids else None,
            token_ids=gen.output_ids if body.return_token_ids else None,
        )
        return CompletionResponse(id=request_id, model=engine.model_name, choices=[choice], usage=usage(gen))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse | Response:
        engine.check_model(body.model)
        text = engine.render_chat(
            body.messages, add_generation_prompt=body.add_generation_prompt, template_kwargs=body.chat_template_kwargs
        )
        prompt = engine.tokenize(text, add_special_tokens=body.add_special_tokens)
        max_tokens = engine.check_prompt(prompt, body.max_completion_tokens or body.max_tokens)
        n_top = (body.top_logprobs or 0) if body.logprobs else None
        params = sampling_params(body, max_tokens=max_tokens, logprobs=n_top)
        request_id = random_id("chatcmpl")
        gen = await until_disconnected(request, engine.generate(request_id, prompt, params, priority=body.priority))
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        name = _TokenNames(engine, bool(body.return_tokens_as_token_ids))
        choice = ChatCompletionResponseChoice(
            message=ChatMessage(content=gen.text),
            logprobs=chat_logprobs(gen, name) if body.logprobs else None,
            finish_reason=gen.finish_reason,
            stop_reason=gen.stop_reason,
            token_ids=gen.output_ids if body.return_token_ids else None,
        )
        return ChatCompletionResponse(
            id=request_id,
            model=engine.model_name,
            choices=[choice],
            usage=usage(gen),
            prompt_token_ids=prompt if body.return_token_ids else None,
        )

    if engine.recent is not None:
        recent = engine.recent

        @app.get("/debug/sampled")
        async def debug_sampled() -> list[SampledRecord]:
            """The last requests' sampled ids and logprobs, oldest first (`--debug-sampled`)."""
            return [
                SampledRecord(
                    request_id=g.request_id,
                    slot=g.slot,
                    reused_prefix=g.reused_prefix,
                    prompt_ids=g.prompt_ids,
                    output_ids=g.output_ids,
                    logprobs=g.logprobs,
                    finish_reason=g.finish_reason,
                    seed=g.params.seed,
                )
                for g in list(recent)
            ]

    return app
