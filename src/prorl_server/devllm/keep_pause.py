"""The keep pause and weight-version labels of the dev engine and the simulator, on vLLM's RL routes.

vLLM (with `VLLM_SERVER_DEV_MODE=1`) serves `POST /pause?mode=...`, `POST /resume`, `GET /is_paused` and
`POST /update_weight_version {"new_version": ...}`, and labels every sampled token with the version last
set. These engines serve the same routes for mode "keep" only (the requests stop between two tokens and go
on after `/resume`; other modes are a 400), and report the labels of a completion's tokens as vLLM's
`weight_versions` spans on its choice: tokens sampled before any label was set are unlabelled, and a
completion with unlabelled tokens reports none (as vLLM does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Body, FastAPI, Query
from fastapi.responses import JSONResponse

from prorl_server.devllm.errors import DevLLMRequestError
from prorl_server.protocol import WeightVersionSpan

DEFAULT_LABEL = "default"  # vLLM's label before any `update_weight_version`

VersionStarts = list[tuple[str, int]]


def track(starts: VersionStarts, label: str, index: int) -> None:
    """Token `index` of a completion was sampled under `label`: start a span when the label changes."""
    if not starts or starts[-1][0] != label:
        starts.append((label, index))


def spans(starts: VersionStarts, n_tokens: int) -> list[WeightVersionSpan] | None:
    """The labelled spans over `n_tokens` output tokens (None for no token)."""
    if not starts:
        return None
    ends = [start for _, start in starts[1:]] + [n_tokens]
    return [WeightVersionSpan(version=label, start=s, end=e) for (label, s), e in zip(starts, ends, strict=True)]


def add_keep_routes(
    app: FastAPI,
    *,
    pause: Callable[[], Awaitable[None]],
    resume: Callable[[], None],
    is_paused: Callable[[], bool],
    set_label: Callable[[str], None],
) -> None:
    """vLLM's pause, resume and version-label routes over an engine's own `pause` (answers once no token is
    being sampled), `resume`, `is_paused` and `set_label`."""

    @app.post("/pause")
    async def pause_generation(mode: Annotated[str, Query()] = "abort") -> JSONResponse:
        if mode != "keep":
            raise DevLLMRequestError(f"this engine pauses with mode=keep only, not {mode!r}", param="mode")
        await pause()
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume_generation() -> JSONResponse:
        resume()
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def paused() -> JSONResponse:
        return JSONResponse({"is_paused": is_paused()})

    @app.post("/update_weight_version")
    async def update_weight_version(new_version: Annotated[str, Body(embed=True, max_length=256)]) -> JSONResponse:
        set_label(new_version)
        return JSONResponse({"success": True, "new_version": new_version})
