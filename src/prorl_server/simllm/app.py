"""The simulator's answers on vLLM's routes (`devllm.vllm_routes`): vLLM's field names and error shape over a `SimEngine`.

The request models are `protocol.vllm`'s; the checks, logprobs blocks and error bodies are the dev engine's (prorl_server.devllm);
a completion also carries `sim`, the request's simulated times (`SimTiming`), which vLLM clients ignore.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

from prorl_server.devllm import (
    VLLMServing,
    add_engine_basics,
    add_keep_routes,
    add_vllm_routes,
    check_completion_request,
    check_prompt_ids,
    completion_logprobs,
    fit_context,
    sampling_params,
    spans,
    usage,
)
from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.protocol import (
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
from prorl_server.simllm.engine import SimEngine, SimTiming
from prorl_server.simllm.metrics import sim_registry
from prorl_server.testing import write_tokenizer_files

MODEL_ROOT = "simulated"  # the `root` of the model card without a tokenizer directory: there is no checkpoint


class SimCompletionResponse(CompletionResponse):
    """`/v1/completions` answer with the request's simulated times."""

    sim: SimTiming


class SimServing(VLLMServing):
    """vLLM's routes (no chat) answered by a `SimEngine`."""

    chats = False

    def __init__(self, engine: SimEngine, card: ModelCard) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.card = card

    async def tokenize(
        self, body: TokenizeCompletionRequest | TokenizeChatRequest, request: Request
    ) -> TokenizeResponse:
        self.engine.check_model(body.model)
        tokenizer = self.tokenizer
        if isinstance(body, TokenizeChatRequest):
            text = tokenizer.render_chat(
                body.messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools
            )
        else:
            text = body.prompt
        ids = tokenizer.encode(text)
        strs = [tokenizer.token_str(i) for i in ids] if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.engine.max_model_len, tokens=ids, token_strs=strs)

    async def detokenize(self, body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        self.engine.check_model(body.model)
        return DetokenizeResponse(prompt=self.tokenizer.decode(body.tokens))

    async def completion(self, body: CompletionRequest, request: Request) -> SimCompletionResponse | Response:
        engine, tokenizer = self.engine, self.tokenizer
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
    root = engine.settings.tokenizer_dir
    if root is not None:
        write_tokenizer_files(Path(root))
    card = ModelCard(
        id=engine.model_name, root=root or MODEL_ROOT, owned_by="prorl-simllm", max_model_len=engine.max_model_len
    )
    add_engine_basics(app, sim_registry(engine))
    add_vllm_routes(app, SimServing(engine, card))
    add_keep_routes(
        app, pause=engine.pause, resume=engine.resume, is_paused=lambda: engine.paused, set_label=engine.set_label
    )
    return app
