"""EngineFreeze: the engines a keep pause froze, and the calls that freeze and resume them.

A weight-update pause in mode "keep" leaves the LLM calls in flight open: each engine stops stepping and
holds its requests (and their KV cache) until it is resumed, after the update. The engine endpoints are
vLLM's RL routes (`vllm/entrypoints/rl/online/api_router.py`, served with `VLLM_SERVER_DEV_MODE=1`), which
the dev engine and the simulator serve too:

- `POST /update_weight_version {"new_version": "<v>"}`: the label the engine gives the tokens it samples
  from now on; sent before the freeze (the version the frozen requests started under) and before the resume
  (the new one), so an engine that reports per-token versions splits a kept completion where it switched.
- `POST /pause?mode=keep`: freeze; it answers once no step runs. `POST /resume`: go on.

An engine without them (vLLM without dev mode answers 404) cannot keep: `freeze` then resumes the engines it
did freeze and raises FreezeRefused naming every engine that failed, so the pause is refused (409) and no
call is aborted. Every engine call runs through `submit` (the server's health-check loop, as reloads do).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from prorl_server.llm.errors import BackendRequestError, LLMError
from prorl_server.llm.vllm_admin import DEV_MODE_HINT
from prorl_server.llm.vllm_client import VLLMClient, server_root

ANSWER_BYTES = 4 * 1024  # `{"status": "paused"}` and the like
CALL_TIMEOUT_S = 60.0  # a keep pause answers once the engine's running step is over
_SHOWN = 8

Submit = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]


class FreezeRefused(LLMError):
    """Some engines could not freeze their requests; none is left frozen. The message names them."""

    http_status = 409


class EngineFreeze:
    """Which engines are frozen now; `freeze` and `thaw` change that (one at a time, on the API loop)."""

    def __init__(self, client: VLLMClient, submit: Submit) -> None:
        self.client = client
        self.submit = submit
        self.frozen: list[str] = []  # backend addresses, as the pool knows them
        self._lock = asyncio.Lock()

    async def freeze(self, addresses: list[str], version: str | int | None) -> None:
        """Label (`version`, when one is set) and freeze every engine of `addresses` not frozen yet; raises
        FreezeRefused (every engine frozen by this call resumed again) when one of them fails."""
        async with self._lock:
            todo = [a for a in dict.fromkeys(addresses) if a not in self.frozen]
            outcomes = await self.submit(_all(_freeze(self.client, a, version) for a in todo))
            done = [a for a, o in zip(todo, outcomes, strict=True) if o is None]
            failed = [f"{a}: {o}" for a, o in zip(todo, outcomes, strict=True) if o is not None]
            if failed:
                await self.submit(_all(_thaw(self.client, a, None) for a in done))
                raise FreezeRefused(
                    f"{len(failed)} of {len(todo)} LLM backend(s) cannot keep their requests across a weight "
                    f"update (pause mode keep): {_shown(failed)}; pause with mode wait or abort instead"
                )
            self.frozen += done

    async def thaw(self, version: str | int | None) -> list[str]:
        """Label every frozen engine with `version` (when one is set) and resume it; returns the failures
        (`address: why`), after which those engines count as resumed anyway (a later resume cannot do better)."""
        async with self._lock:
            frozen, self.frozen = self.frozen, []
            if not frozen:
                return []
            outcomes = await self.submit(_all(_thaw(self.client, a, version) for a in frozen))
            return [f"{a}: {o}" for a, o in zip(frozen, outcomes, strict=True) if o is not None]


async def _all(calls: Any) -> list[str | None]:
    return list(await asyncio.gather(*calls))


async def _freeze(client: VLLMClient, address: str, version: str | int | None) -> str | None:
    """None when the engine at `address` is labelled and frozen, else why not."""
    root = server_root(address)
    try:
        if version is not None:
            await _post(client, f"{root}/update_weight_version", {"new_version": str(version)})
        await _post(client, f"{root}/pause?mode=keep", None)
    except LLMError as exc:
        return _why(exc)
    return None


async def _thaw(client: VLLMClient, address: str, version: str | int | None) -> str | None:
    """None when the engine at `address` is labelled and resumed, else why not (resuming is tried anyway)."""
    root = server_root(address)
    label: str | None = None
    if version is not None:
        try:
            await _post(client, f"{root}/update_weight_version", {"new_version": str(version)})
        except LLMError as exc:
            label = f"labelling its tokens {version!r} failed: {_why(exc)}"
    try:
        await _post(client, f"{root}/resume", None)
    except LLMError as exc:
        return f"resuming failed: {_why(exc)}" + (f"; {label}" if label else "")
    return label


async def _post(client: VLLMClient, url: str, payload: dict[str, str] | None) -> None:
    content = None if payload is None else json.dumps(payload).encode()
    await client.call("POST", url, content, ANSWER_BYTES, CALL_TIMEOUT_S)


def _why(exc: LLMError) -> str:
    if isinstance(exc, BackendRequestError) and exc.status_code in (404, 405):
        return f"{exc} (no keep-pause endpoint: {DEV_MODE_HINT})"
    return str(exc)


def _shown(items: list[str]) -> str:
    more = len(items) - _SHOWN
    return " | ".join(items[:_SHOWN]) + (f" | and {more} more" if more > 0 else "")
