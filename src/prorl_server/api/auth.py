"""API-key access control: a pure ASGI middleware (no per-request task or body copy)."""

from __future__ import annotations

import hmac
import re

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from prorl_server.auth_key import API_KEY_FILE_ENV, DEFAULT_LOCATION
from prorl_server.protocol import API_KEY_ENV

OPEN_PATHS = frozenset({"/health", "/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"})
"""Paths answered without the key (GET and HEAD): `/health`, so supervisors can probe liveness, and the
dashboard's static page, script and style sheet, which hold no server data (its data, `/dashboard/data`,
needs the key)."""

GATEWAY_PATH = re.compile(r"/sessions/[^/]+/v1/(chat/completions|responses|models|messages)")
"""A gateway session's OpenAI and Anthropic paths: the gateway checks their key itself (the session's own key or
this one), so a session key opens these paths of its session and nothing else."""

GATEWAY_ROOT = re.compile(r"/sessions/[^/]+(/v1)?")
"""A gateway session's base URLs: their GET and HEAD (a harness's probe) go on to the gateway, which checks the
key; DELETE of `/sessions/{id}` is the trainer's, behind this key."""


class ApiKeyMiddleware:
    """Require `Authorization: Bearer <key>` on every request but GET of `OPEN_PATHS` (401 otherwise);
    requests to `GATEWAY_PATH`, and GET and HEAD of `GATEWAY_ROOT`, go on to the gateway, which checks their
    key.

    The presented key is compared with `hmac.compare_digest`, in time independent of where it differs.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or self._authorized(scope):
            await self.app(scope, receive, send)
        else:  # HTTP, or a WebSocket handshake (denied with the same answer)
            await _UNAUTHORIZED(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        if scope["path"] in OPEN_PATHS and scope.get("method") in ("GET", "HEAD"):
            return True
        if GATEWAY_PATH.fullmatch(scope["path"]):
            return True
        if GATEWAY_ROOT.fullmatch(scope["path"]) and scope.get("method") in ("GET", "HEAD"):
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False


_UNAUTHORIZED = JSONResponse(
    {
        "detail": "missing or wrong API key: send 'Authorization: Bearer <key>' with the key the server was "
        f"started with (${API_KEY_ENV} or --api-key, else the key in the key file of the user who started it: "
        f"${API_KEY_FILE_ENV}, else {DEFAULT_LOCATION})"
    },
    status_code=401,
    headers={"WWW-Authenticate": "Bearer"},
)
