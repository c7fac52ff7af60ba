"""The dev engine's answers on vLLM's routes (`vllm_routes`): vLLM's field names and error shape over a `DevEngine`."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from prorl_server.devllm.engine import DevEngine, Generation
from prorl_server.devllm.errors import DevLLMRequestError
from prorl_server.devllm.keep_pause import add_keep_routes, spans
from prorl_server.devllm.metrics import engine_registry
from prorl_server.devllm.validation import (
    PYDANTIC_ERROR_TYPE,
    check_chat_request,
    check_completion_request,
    check_prompt_ids,
    fit_context,
    sampling_params,
    validation_error,
)
from prorl_server.devllm.vllm_routes import VLLMServing, add_vllm_routes
from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.protocol import (
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
    ModelCard,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    UsageInfo,
    VllmErrorInfo,
    VllmErrorResponse,
    random_id,
)

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this for JSON


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


def error_response(message: str, *, status: int, error_type: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body with `code` = the HTTP status."""
    body = VllmErrorResponse(error=VllmErrorInfo(message=message, type=error_type, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


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


def add_engine_basics(app: FastAPI, registry: CollectorRegistry) -> None:
    """What the dev engine and the simulator serve alike besides vLLM's routes: vLLM's error shape for every
    error (400 for a bad body, 500 for a bug) and `/metrics` from `registry` (vLLM's names)."""

    @app.exception_handler(DevLLMRequestError)
    async def request_error(_: Request, exc: DevLLMRequestError) -> JSONResponse:
        return error_response(exc.message, status=exc.status.value, error_type=exc.error_type, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_error(exc.errors(), exc.body)
        return error_response(message, status=400, error_type=PYDANTIC_ERROR_TYPE, param=param)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(f"{type(exc).__name__}: {exc}", status=500, error_type="InternalServerError")

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text with vLLM's metric names."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class DevServing(VLLMServing):
    """vLLM's routes answered by a `DevEngine`."""

    def __init__(self, engine: DevEngine) -> None:
        self.engine = engine
        self.card = ModelCard(
            id=engine.model_name, owned_by="prorl-devllm", root=str(engine.model_path), max_model_len=engine.n_ctx
        )

    async def tokenize(
        self, body: TokenizeCompletionRequest | TokenizeChatRequest, request: Request
    ) -> TokenizeResponse:
        engine = self.engine
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

    async def detokenize(self, body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        self.engine.check_model(body.model)
        return DetokenizeResponse(prompt=self.engine.detokenize(body.tokens))

    async def completion(self, body: CompletionRequest, request: Request) -> CompletionResponse | Response:
        engine = self.engine
        engine.check_model(body.model)
        given = check_completion_request(body)
        from_text = isinstance(given, str)
        prompt = engine.tokenize(given, add_special_tokens=body.add_special_tokens) if from_text else list(given)
        max_tokens = fit_context(len(prompt), body.max_tokens, n_ctx=engine.n_ctx, from_text=from_text)
        params = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs, n_vocab=engine.n_vocab)
        check_prompt_ids(prompt, engine.n_vocab)
        request_id = random_id("cmpl")
        generation = engine.generate(request_id, prompt, params, priority=body.priority, cache_salt=body.cache_salt)
        gen = await until_disconnected(request, generation)
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
            weight_versions=spans(gen.version_starts, len(gen.output_ids)),
        )
        return CompletionResponse(id=request_id, model=engine.model_name, choices=[choice], usage=usage(gen))

    async def chat_completion(self, body: ChatCompletionRequest, request: Request) -> ChatCompletionResponse | Response:
        engine = self.engine
        engine.check_model(body.model)
        check_chat_request(body)
        text = engine.render_chat(
            body.messages, add_generation_prompt=body.add_generation_prompt, template_kwargs=body.chat_template_kwargs
        )
        prompt = engine.tokenize(text, add_special_tokens=body.add_special_tokens)
        if body.max_completion_tokens is not None:
            requested, name = body.max_completion_tokens, "max_completion_tokens"
        else:
            requested, name = body.max_tokens, "max_tokens"
        max_tokens = fit_context(len(prompt), requested, n_ctx=engine.n_ctx, name=name, from_text=True)
        n_top = (body.top_logprobs or 0) if body.logprobs else None
        params = sampling_params(body, max_tokens=max_tokens, logprobs=n_top, n_vocab=engine.n_vocab)
        check_prompt_ids(prompt, engine.n_vocab)
        request_id = random_id("chatcmpl")
        generation = engine.generate(request_id, prompt, params, priority=body.priority, cache_salt=body.cache_salt)
        gen = await until_disconnected(request, generation)
        if gen is None:
            return Response(status_code=CLIENT_CLOSED)
        names = _TokenNames(engine, bool(body.return_tokens_as_token_ids))
        choice = ChatCompletionResponseChoice(
            message=ChatMessage(content=gen.text),
            logprobs=chat_logprobs(gen, names) if body.logprobs else None,
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


def create_app(engine: DevEngine) -> FastAPI:
    """The app serving `engine`; the caller owns the engine (and closes it)."""
    app = FastAPI(title="prorl-server dev LLM engine (vLLM protocol subset)")
    app.state.engine = engine
    add_engine_basics(app, engine_registry(engine))
    add_vllm_routes(app, DevServing(engine))
    steps = engine.steps

    async def pause() -> None:
        await asyncio.to_thread(steps.pause)

    add_keep_routes(app, pause=pause, resume=steps.resume, is_paused=lambda: steps.paused, set_label=steps.set_label)

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
                    cache_salt=g.cache_salt,
                )
                for g in list(recent)
            ]

    return app
