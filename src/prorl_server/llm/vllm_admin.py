"""vLLM's weight-update endpoints: reload the weights from a checkpoint directory, reset the prefix cache.

vLLM 0.32 offers both only with `VLLM_SERVER_DEV_MODE=1` in its environment (its development routers,
`vllm/entrypoints/serve/dev/`): without it they answer 404.

- `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` runs the worker's
  `reload_weights` (`vllm/v1/worker/gpu_worker.py`, which the CPU worker inherits): the checkpoint in DIR
  (same architecture, safetensors) is loaded in place. It answers `{"results": [null, ...]}` (one entry per
  worker), or 500 naming the worker's error. No `timeout` is sent: vLLM treats an RPC timeout as fatal and
  stops its engine. A failed reload leaves the model half torn down (its next forward pass kills the
  engine), so `reload_weights` below loads the previous checkpoint again at once.
- `POST /reset_prefix_cache` answers `{"success": bool}`; false while running requests hold cached blocks,
  so it is tried again for a few seconds.

Answers are bounded and checked like the rest of the client's (`vllm_client.py`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from prorl_server.llm import response_limits as limits
from prorl_server.llm.errors import BackendProtocolError, BackendRequestError, LLMError
from prorl_server.llm.vllm_client import VLLMClient, server_root

RPC_BYTES = 64 * 1024  # `{"results": [null, ...]}`: one entry per worker
RESET_BYTES = 4 * 1024  # `{"success": true}`
RESET_TRIES_S = 10.0  # how long a refused prefix-cache reset (blocks still held) is tried again
RESET_RETRY_S = 0.25
SHORT_CALL_S = 30.0  # stall timeout of a prefix-cache reset and of `GET /v1/models`
DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (prorl-server vllm start --weight-reload)"


class ReloadFailed(LLMError):
    """The engine did not load the checkpoint (or did not reset its prefix cache); the message says why and
    whether the previous weights were loaded back."""


@dataclass(frozen=True, slots=True)
class Reloaded:
    """One engine loaded the checkpoint and reset its prefix cache."""

    address: str
    seconds: float


async def reload_weights(
    client: VLLMClient,
    address: str,
    path: str,
    *,
    previous: str | None = None,
    timeout_s: float = 600.0,
    reset_prefix: bool = True,
) -> Reloaded:
    """Load the checkpoint in `path` into the engine at `address`, then reset its prefix cache (not with
    `reset_prefix` false: while a keep pause freezes requests, they hold its blocks and vLLM refuses the reset;
    the new version's `cache_salt` keeps later requests off the old prefixes anyway).

    On a failed load the engine's previous checkpoint (`previous`, else the model it was started with, as
    `GET /v1/models` names it) is loaded again, so that the engine keeps serving the old weights; the
    ReloadFailed message says whether that worked."""
    root = server_root(address)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await _collective_reload(client, root, path, timeout_s)
    except LLMError as exc:
        if isinstance(exc, BackendRequestError) and exc.status_code in (404, 405):  # no endpoint: nothing touched
            raise ReloadFailed(f"{address}: cannot reload weights: {_hint(exc)}") from exc
        _, now_serving = await restore_weights(client, address, previous, timeout_s)
        raise ReloadFailed(f"{address}: reloading weights from {path!r} failed: {exc}; {now_serving}") from exc
    if reset_prefix:
        try:
            await reset_prefix_cache(client, address)
        except LLMError as exc:
            raise ReloadFailed(f"{address}: loaded {path!r} but {exc}") from exc
    return Reloaded(address, loop.time() - started)


async def reset_prefix_cache(client: VLLMClient, address: str, *, tries_s: float = RESET_TRIES_S) -> None:
    """`POST /reset_prefix_cache`, tried again while vLLM refuses it (running requests hold blocks)."""
    url = f"{server_root(address)}/reset_prefix_cache"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + tries_s
    while True:
        try:
            body = await client.call("POST", url, None, RESET_BYTES, SHORT_CALL_S)
        except LLMError as exc:
            raise LLMError(f"resetting its prefix cache failed: {_hint(exc)}") from exc
        if _parse_reset(url, body):
            return
        if loop.time() >= deadline:
            raise LLMError(
                f"vLLM refused to reset its prefix cache for {tries_s:g}s (running requests hold cached blocks)"
            )
        await asyncio.sleep(RESET_RETRY_S)


async def _collective_reload(client: VLLMClient, root: str, path: str, timeout_s: float) -> None:
    payload = {"method": "reload_weights", "kwargs": {"weights_path": path}}
    content = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    body = await client.call("POST", f"{root}/collective_rpc", content, RPC_BYTES, timeout_s)
    _parse_rpc(f"{root}/collective_rpc", body)


async def restore_weights(
    client: VLLMClient, address: str, previous: str | None, timeout_s: float = 600.0, *, reset: bool = False
) -> tuple[bool, str]:
    """Load `previous` (default: the model the engine started with) into the engine at `address` again, and
    with `reset` its prefix cache after; (whether it worked, a sentence saying what the engine serves now)."""
    if previous is None:
        previous = await _started_model(client, address)
    if previous is None:
        return False, "the engine named no model to load back: it may fail its next request"
    try:
        await _collective_reload(client, server_root(address), previous, timeout_s)
    except LLMError as exc:
        return (
            False,
            f"loading the previous weights ({previous!r}) back failed too ({exc}): it may fail its next request",
        )
    if reset:
        try:
            await reset_prefix_cache(client, address)
        except LLMError as exc:
            return False, f"it serves the previous weights ({previous!r}) again, but {exc}"
    return True, f"it serves the previous weights ({previous!r}) again"


async def _started_model(client: VLLMClient, address: str) -> str | None:
    """The checkpoint the engine was started with (`root` of `GET /v1/models`), None if it names none."""
    try:
        body = await client.call("GET", f"{address.rstrip('/')}/models", None, limits.MODELS_BYTES, SHORT_CALL_S)
        data = json.loads(body)["data"][0]
    except (LLMError, ValueError, KeyError, IndexError, TypeError):
        return None
    root = data.get("root") if isinstance(data, dict) else None
    return root if isinstance(root, str) and root else None


def _parse_rpc(url: str, body: bytes | bytearray) -> None:
    """vLLM answers `{"results": [...]}`, or an empty 200 when the method returned nothing at all."""
    if not body.strip():
        return
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise BackendProtocolError(f"{url}: answer is not JSON: {exc}") from None
    if not (isinstance(parsed, dict) and isinstance(parsed.get("results"), list)):
        raise BackendProtocolError(f"{url}: expected {{'results': [...]}}, got {str(parsed)[:200]}")


def _parse_reset(url: str, body: bytes | bytearray) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise BackendProtocolError(f"{url}: answer is not JSON: {exc}") from None
    if not (isinstance(parsed, dict) and isinstance(parsed.get("success"), bool)):
        raise BackendProtocolError(f"{url}: expected {{'success': bool}}, got {str(parsed)[:200]}")
    return parsed["success"]


def _hint(exc: LLMError) -> str:
    if isinstance(exc, BackendRequestError) and exc.status_code in (404, 405):
        return f"{exc} (the endpoint is missing: {DEV_MODE_HINT})"
    return str(exc)
