"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from prorl_server._version import __version__
from prorl_server.api import dashboard, groups, jobs, lifecycle, llm_servers, metrics
from prorl_server.api.auth import ApiKeyMiddleware
from prorl_server.api.body_limit import BodyLimitMiddleware
from prorl_server.api.errors import install_error_handlers
from prorl_server.api.state import ServerState
from prorl_server.api.weights import router as weights_router
from prorl_server.config import ServerSettings
from prorl_server.gateway import router as gateway
from prorl_server.pipeline import probe


def create_app(settings: ServerSettings | None = None, state: ServerState | None = None) -> FastAPI:
    """Build the app; its lifespan starts the pipeline and health checks, and stops them on shutdown.

    With `settings.api_key`, every request but `GET /health` and the dashboard's static page needs the key
    (checked first, before the body is read), and a gateway session's OpenAI paths take that session's own
    key too (checked by the gateway); bodies over `settings.max_body_bytes` get 413.
    """
    state = state or ServerState.build(settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.open()
        lag_probe = asyncio.create_task(probe(state.metrics.api_lag), name="prorl-api-lag-probe")
        try:
            yield
        finally:
            lag_probe.cancel()
            await state.close()

    app = FastAPI(title="prorl-server", version=__version__, lifespan=lifespan)
    app.state.server = state
    app.state.groups = state.groups
    install_error_handlers(app)
    for module in (jobs, groups, llm_servers, lifecycle, metrics, dashboard):
        app.include_router(module.router)
    app.include_router(weights_router)
    gateway.install(app, state.gateway)
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.settings.max_body_bytes)
    if state.settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=state.settings.api_key)  # added last: runs first
    return app
