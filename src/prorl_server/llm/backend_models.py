"""Each backend's served model, asked once, and how its chats are tokenized, decided once.

The model's name, context length, vocabulary size and root come from the backend's `/v1/models`. With the
pool's tokenizer cache, each backend's chat tokenization is then decided (`tokenizer_check`): in the server
when a local tokenizer gives the backend's own ids on every probe, else by the backend's `/tokenize`; each
decision is logged and told to the pool's `on_tokenization`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from prorl_server.llm.backend import Backend
from prorl_server.llm.errors import LLMError
from prorl_server.llm.tokenizer_check import TokenizerChoice, choose_tokenizer
from prorl_server.llm.vllm_client import VLLMClient

if TYPE_CHECKING:
    from prorl_server.llm.backend_pool import BackendPool

log = logging.getLogger("prorl_server.llm.backend_pool")  # the pool's log, as before the split


class BackendModels:
    """The served models and tokenization decisions of `pool`'s backends (their fields are set under `lock`,
    the pool's)."""

    def __init__(self, pool: BackendPool, lock: threading.Lock) -> None:
        self.pool = pool
        self._lock = lock
        self._deciding: dict[Backend, concurrent.futures.Future[None]] = {}

    async def resolve(self, backend: Backend) -> str | None:
        """The served model name (and context length, vocabulary size, root), asked once per backend; then,
        with a tokenizer cache, its tokenization decided once (a call that comes meanwhile waits for it)."""
        if backend.model is None:
            served = await self.pool.client.served_model(backend.address, timeout_s=self.pool.short_call_timeout)
            with self._lock:
                backend.max_model_len, backend.vocab_size = served.max_model_len, served.vocab_size
                backend.root = served.root
                backend.model = served.id
        if self.pool.tokenizer_cache is not None and backend.tokenization is None:
            await self._decide_tokenization(backend)
        return backend.model

    def tokenize_chat(
        self,
        backend: Backend,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        client: VLLMClient | None = None,
    ) -> Awaitable[list[int]]:
        """`backend`'s `/tokenize` of the chat template of `messages`, as ids checked against its vocabulary
        (sent by `client`, default the pool's)."""
        return (client or self.pool.client).tokenize_messages(
            backend.address,
            backend.model,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            vocab_size=backend.vocab_size,
            timeout_s=self.pool.short_call_timeout,
        )

    async def _decide_tokenization(self, backend: Backend) -> None:
        """Decide how `backend`'s chats are tokenized (once; concurrent callers, on any loop, wait for the
        first). A backend whose probe request fails (unreachable, 5xx, stalled; not a refusal) stays undecided
        (its /tokenize is used) and is probed again at its next call or health check."""
        assert self.pool.tokenizer_cache is not None
        with self._lock:
            pending = self._deciding.get(backend)
            first = pending is None
            if pending is None:
                pending = self._deciding[backend] = concurrent.futures.Future()
        if not first:
            await asyncio.wrap_future(pending)
            return
        try:
            choice = await choose_tokenizer(
                self.pool.tokenizer_cache,
                self.pool.tokenizer_path,
                backend.root,
                backend.model,
                lambda messages, add_generation_prompt, tools: self.tokenize_chat(
                    backend, messages, add_generation_prompt, tools
                ),
            )
        except LLMError as exc:
            log.info("LLM backend %s: tokenization not decided yet (probing it failed: %s)", backend.address, exc)
        else:
            self._settle_tokenization(backend, choice)
        finally:
            with self._lock:
                del self._deciding[backend]
            pending.set_result(None)

    def _settle_tokenization(self, backend: Backend, choice: TokenizerChoice) -> None:
        with self._lock:
            backend.chat_tokenizer = choice.tokenizer
            backend.tokenization = "local" if choice.tokenizer is not None else "backend"
        if choice.tokenizer is not None:
            log.info("LLM backend %s: chats tokenized in the server with %s", backend.address, choice.detail)
        elif choice.reason == "not_found":
            log.info("LLM backend %s: chats tokenized by its /tokenize: %s", backend.address, choice.detail)
        else:
            log.warning(
                "LLM backend %s: chats tokenized by its /tokenize, not in the server (%s): %s",
                backend.address,
                choice.reason,
                choice.detail,
            )
        if self.pool.on_tokenization is not None:
            self.pool.on_tokenization(backend.address, choice.reason)
