"""LLM backend routes: register, clear, list."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from prorl_server.api.body import openapi_body, parse_body
from prorl_server.api.state import ServerState, get_state
from prorl_server.protocol import AddLLMServerRequest, LLMServerInfo, LLMServerList

router = APIRouter(tags=["llm servers"])
State = Annotated[ServerState, Depends(get_state)]


@router.post("/add_llm_server", response_model=LLMServerInfo, openapi_extra=openapi_body(AddLLMServerRequest))
async def add_llm_server(request: Request, state: State) -> LLMServerInfo:
    """Register a backend (or update the weight version of a known one); kept across /stop and /start."""
    body = await parse_body(request, AddLLMServerRequest)
    backend = state.backends.add(body.address, body.weight_version, body.tags)
    state.probe_soon()
    return backend.info()


@router.post("/clear_llm_server")
async def clear_llm_server(state: State) -> dict[str, int]:
    """Forget every backend; jobs in flight move to backends registered next."""
    return {"removed": state.backends.clear()}


@router.get("/llm_servers", response_model=LLMServerList)
async def llm_servers(state: State) -> LLMServerList:
    """Registered backends with weight version, jobs assigned, jobs in flight and health."""
    return LLMServerList(policy=state.backends.policy.name, servers=[b.info() for b in state.backends.backends()])
