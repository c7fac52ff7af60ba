"""FastAPI routes of the simulator: vLLM's paths, field names and error shape over a `SimEngine`.

The request models, checks, logprobs blocks and error bodies are the dev engine's (prorl_server.devllm);
a completion also carries `sim`, the request's simulated times (`SimTiming`), which vLLM clients ignore.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

from prorl_server.devllm.app import add_engine_basics, completion_logprobs, usage
from prorl_server.devllm.keep_pause import add_keep_routes, spans
from prorl_server.devllm.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    random_id,
)
from prorl_server.devllm.validation import (
    check_completion_request,
    check_prompt_ids,
    fit_context,
    sampling_params,
)
from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.simllm.engine import SimEngine, SimTiming
from prorl_server.simllm.metrics import sim_registry
from prorl_server.testing.tokenizer_files import write_tokenizer_files

MODEL_ROOT = "simulated"  # the `root` of the model card without a tokenizer directory: there is no checkpoint


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
    tokenizer = engine.tokenizer
    root = engine.settings.tokenizer_dir
    if root is not None:
        write_tokenizer_files(Path(root))
    card = ModelCard(
        id=engine.model_name, root=root or MODEL_ROOT, owned_by="prorl-simllm", max_model_len=engine.max_model_len
    )
    add_engine_basics(app, sim_registry(engine), card)
    add_keep_routes(
        app, pause=engine.pause, resume=engine.resume, is_paused=lambda: engine.paused, set_label=engine.set_label
    )

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
            weight_versions=spans(gen.version_starts, len(gen.output_ids)),
        )
        return SimCompletionResponse(
            id=request_id, model=engine.model_name, choices=[choice], usage=usage(gen), sim=timing
        )

    return app
