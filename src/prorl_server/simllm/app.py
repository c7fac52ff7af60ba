"""FastAPI routes of the simulator: vLLM's paths, field names and error shape over a `SimEngine`.

The request models, checks, logprobs blocks and error bodies are the dev engine's (prorl_server.devllm);
a completion also carries `sim`, the request's simulated times (`SimTiming`), which vLLM clients ignore.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prorl_server.devllm.app import completion_logprobs, error_response, usage
from prorl_server.devllm.errors import DevLLMRequestError
from prorl_server.devllm.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    random_id,
)
from prorl_server.devllm.validation import (
    PYDANTIC_ERROR_TYPE,
    check_completion_request,
    check_prompt_ids,
    fit_context,
    sampling_params,
    validation_error,
)
from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.simllm.engine import SimEngine, SimTiming
from prorl_server.simllm.metrics import sim_registry

MODEL_ROOT = "simulated"  # the `root` of the model card: there is no checkpoint


class SimCompletionResponse(CompletionResponse):
    """`/v1/completions` answer with the request's simulated times."""

    sim: SimTiming


def create_app(engine: SimEngine) -> FastAPI:
    """The app serving `engine`; its lifespan runs the engine's step loop on the server's event loop."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.create_task(engine.run(), name="simllm-steps")
        try:
            yield
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    app = FastAPI(title="prorl-server simulated LLM backend (vLLM protocol subset)", lifespan=lifespan)
    app.state.engine = engine
    registry = sim_registry(engine)
    tokenizer = engine.tokenizer

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

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text with vLLM's metric names."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        card = ModelCard(
            id=engine.model_name, root=MODEL_ROOT, owned_by="prorl-simllm", max_model_len=engine.max_model_len
        )
        return ModelList(data=[card])

    @app.post("/tokenize")
    async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
        engine.check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            text = tokenizer.render_chat(body.messages, add_generation_prompt=body.add_generation_prompt)
        else:
            text = body.prompt
        ids = tokenizer.encode(text)
        strs = [tokenizer.token_str(i) for i in ids] if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=engine.max_model_len, tokens=ids, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        engine.check_model(body.model)
        return DetokenizeResponse(prompt=tokenizer.decode(body.tokens))

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> SimCompletionResponse | Response:
        engine.check_model(body.model)
        given = check_completion_request(body)
        from_text = isinstance(given, str)
        prompt = tokenizer.encode(given) if from_text else list(given)
        max_tokens = fit_context(len(prompt), body.max_tokens, n_ctx=engine.max_model_len, from_text=from_text)
        params = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs, n_vocab=engine.n_vocab)
        check_prompt_ids(prompt, engine.n_vocab)
        request_id = random_id("cmpl")
        work = engine.generate(request_id, prompt, params, priority=body.priority, cache_salt=body.cache_salt)
        result = await until_disconnected(request, work)
        if result is None:
            return Response(status_code=CLIENT_CLOSED)
        gen, timing = result
        as_ids = bool(body.return_tokens_as_token_ids)

        def name(token: int) -> str:
            return f"token_id:{token}" if as_ids else tokenizer.token_str(token)

        choice = CompletionResponseChoice(
            text=gen.text,
            logprobs=completion_logprobs(gen, name) if body.logprobs is not None else None,  # type: ignore[arg-type]
            finish_reason=gen.finish_reason,
            stop_reason=gen.stop_reason,
            prompt_token_ids=prompt if body.return_token_ids else None,
            token_ids=gen.output_ids if body.return_token_ids else None,
        )
        return SimCompletionResponse(
            id=request_id, model=engine.model_name, choices=[choice], usage=usage(gen), sim=timing
        )

    return app
