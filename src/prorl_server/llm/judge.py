"""The LLM judge: a pool of OpenAI-compatible chat endpoints that EVAL asks to score a job (`ctx.judge`).

It is kept apart from the policy's backends: not in their pool, placement, health checks or weight
updates, and its tokens never enter a trajectory. A request goes to `POST {server}/chat/completions`;
its answer is read with the LLM layer's bounded reads and parsed strictly. Every request holds a slot of
the pool's quota (actions/quota.py, service "judge"): at most `max_concurrency` in flight, fewer while the
judge is overloaded (429, 503 and stalls cut the limit; successes grow it back), the rest queue. Connection
errors, 5xx, 429 and stalls are retried on the next judge server, with backoff, within a budget (time queued
for a slot is not spent from it); any other 4xx or a malformed answer fails at once (JudgeError).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, StrictStr, ValidationError

from prorl_server.actions import QuotaConfig, ServiceQuota
from prorl_server.errors import ProrlError
from prorl_server.llm import response_limits as limits
from prorl_server.llm.errors import (
    BackendProtocolError,
    BackendRequestError,
    BackendStalled,
    BackendUnavailable,
    LLMError,
)
from prorl_server.llm.retry import RetryBudget, RetryPolicy
from prorl_server.llm.vllm_client import VLLMClient

log = logging.getLogger(__name__)

JUDGE_API_KEY_ENV = "PRORL_JUDGE_API_KEY"
"""Environment variable holding the judge's API key (sent as `Authorization: Bearer`); never a flag."""
DEFAULT_MAX_TOKENS = 1024
BYTES_PER_CHAT_TOKEN = 256  # a token's text JSON-escaped, in `content` and maybe `reasoning_content`, with margin
HOW_TO_CONFIGURE = (
    "start the server with --judge-server URL (an OpenAI-compatible base URL such as http://host:8000/v1; "
    f"repeatable), plus --judge-model NAME and ${JUDGE_API_KEY_ENV} for a hosted API"
)


class JudgeError(LLMError):
    """A judge call failed: the judge refused it (`status_code`), answered malformed data, or no judge
    server answered within the retry budget."""

    def __init__(self, message: str, *, server: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.status_code = status_code


class JudgeUnavailable(JudgeError):
    """`ctx.judge` cannot be used here: no judge server is configured, or the stage is not EVAL."""


class JudgeConfigError(ProrlError, ValueError):
    """The judge settings cannot work (no server, a server that is not an http(s) URL)."""


class JudgeUsage(BaseModel):
    """Token counts the judge reported for one call."""

    model_config = ConfigDict(extra="ignore")

    prompt_tokens: NonNegativeInt = 0
    completion_tokens: NonNegativeInt = 0
    total_tokens: NonNegativeInt | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    content: StrictStr | None = None


class _Choice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    message: _Message
    finish_reason: StrictStr | None = None


class _ChatCompletion(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    choices: list[_Choice] = Field(min_length=1, max_length=1)
    usage: JudgeUsage | None = None


class _ModelCard(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: StrictStr = Field(min_length=1)


class _ModelList(BaseModel):
    model_config = ConfigDict(extra="ignore")

    data: list[_ModelCard]


@dataclass(frozen=True)
class JudgeReply:
    """The judge's answer: its text, why it stopped, the model and server that answered, token usage."""

    text: str
    finish_reason: str | None
    model: str
    server: str
    usage: JudgeUsage | None


class JudgePool:
    """The judge servers of one prorl-server. Calls rotate over the servers; on a connection error, a 5xx,
    a 429 or a stall the call moves to the next server after a backoff, until `retry.budget_s` is spent.

    `model`: the model name to request (default: the one model each server lists at `GET {server}/models`,
    looked up at first use). `api_key`: sent as a bearer token to every judge server. `max_concurrency`:
    requests in flight at most, over all the servers; `rate_per_s`: requests started per second at most
    (None: unlimited). Both are held by `quota`, whose limit AIMD lowers while the judge answers 429 or
    503 or stalls.
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        model: str | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        api_key: str | None = None,
        max_concurrency: int = 32,
        rate_per_s: float | None = None,
    ) -> None:
        if not servers:
            raise JudgeConfigError(f"a judge pool needs at least one server; {HOW_TO_CONFIGURE}")
        for server in servers:
            if urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).netloc:
                raise JudgeConfigError(f"judge server {server!r} is not an http(s) URL such as http://host:8000/v1")
        self.servers = tuple(s.rstrip("/") for s in servers)
        self.model = model
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy(budget_s=60.0)
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._served: dict[str, str] = {}  # server -> the model it serves, once looked up
        self._next = itertools.count()
        if max_concurrency < 1:
            raise JudgeConfigError(f"the judge's max_concurrency must be at least 1, got {max_concurrency}")
        try:
            self.quota = ServiceQuota("judge", QuotaConfig(max_concurrency=max_concurrency, rate_per_s=rate_per_s))
        except ValueError as exc:
            raise JudgeConfigError(f"judge quota: {exc}") from None

    def __repr__(self) -> str:
        return f"JudgePool(servers={list(self.servers)!r}, model={self.model!r})"  # never the API key

    async def chat(self, messages: Sequence[Mapping[str, Any]], **params: Any) -> JudgeReply:
        """Ask the judge: `messages` in OpenAI chat form, `params` any chat-completion parameters
        (default `max_tokens=1024`, `temperature=0`; a None value leaves a parameter out). Raises
        JudgeError when the judge refuses, answers malformed data, or none answers within the budget."""
        payload = _payload(messages, params)
        tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        limit = limits.ENVELOPE_BYTES + BYTES_PER_CHAT_TOKEN * tokens
        client = VLLMClient(request_timeout_s=self.timeout_s)
        try:
            return await self._with_retries(client, payload, limit)
        finally:
            await client.aclose_current_loop()

    async def ask(self, prompt: str, *, system: str | None = None, **params: Any) -> JudgeReply:
        """`chat` with one user message (after a system message, if given)."""
        messages = [{"role": "system", "content": system}] if system is not None else []
        return await self.chat([*messages, {"role": "user", "content": prompt}], **params)

    async def _with_retries(self, client: VLLMClient, payload: dict[str, Any], limit: int) -> JudgeReply:
        first = next(self._next)
        budget = RetryBudget(self.retry)  # time queued for a quota slot is not spent from it
        attempt = 0
        while True:
            server = self.servers[(first + attempt) % len(self.servers)]
            waited = time.monotonic()
            async with self.quota.slot() as slot:
                budget.extend(time.monotonic() - waited)
                try:
                    return await self._chat_once(client, server, payload, limit)
                except BackendProtocolError as exc:
                    raise JudgeError(f"judge {server} answered malformed data: {exc}", server=server) from None
                except BackendRequestError as exc:
                    if exc.status_code != 429:
                        raise JudgeError(f"judge {server}: {exc}", server=server, status_code=exc.status_code) from None
                    error: LLMError = exc
                    slot.overloaded(exc.retry_after_s)
                except BackendUnavailable as exc:
                    error = exc
                    if exc.status_code == 503 or isinstance(exc, BackendStalled):  # overloaded too
                        slot.overloaded(exc.retry_after_s)
            delay = budget.delay_s(attempt)
            if delay > budget.left():
                raise JudgeError(
                    f"no judge server answered within the {self.retry.budget_s:g}s retry budget "
                    f"({attempt + 1} attempts); last error: {error}",
                    server=server,
                ) from None
            log.warning("judge %s failed (%s); retrying in %.2fs", server, error, delay)
            await asyncio.sleep(delay)
            attempt += 1

    async def _chat_once(self, client: VLLMClient, server: str, payload: dict[str, Any], limit: int) -> JudgeReply:
        if "model" not in payload:
            payload = {"model": self.model or await self._served_model(client, server), **payload}
        content = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
        url = f"{server}/chat/completions"
        body = await client.call("POST", url, content, limit, self.timeout_s, self._headers)
        try:
            answer = _ChatCompletion.model_validate_json(body)
        except ValidationError as exc:
            raise BackendProtocolError(f"{url}: not a chat completion: {_errors(exc)}") from None
        choice = answer.choices[0]
        if choice.message.content is None:
            raise BackendProtocolError(f"{url}: the judge's message has no text content")
        return JudgeReply(choice.message.content, choice.finish_reason, answer.model, server, answer.usage)

    async def _served_model(self, client: VLLMClient, server: str) -> str:
        model = self._served.get(server)
        if model is None:
            url = f"{server}/models"
            body = await client.call("GET", url, None, limits.MODELS_BYTES, self.timeout_s, self._headers)
            try:
                cards = _ModelList.model_validate_json(body).data
            except ValidationError as exc:
                raise BackendProtocolError(f"{url}: not a model list: {_errors(exc)}") from None
            if len(cards) != 1:
                raise JudgeError(f"{url} lists {len(cards)} models; name the judge's with --judge-model", server=server)
            model = self._served[server] = cards[0].id
        return model


def _payload(messages: Sequence[Mapping[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """The request body without `model` (unless the caller names one): checked, defaults filled in."""
    if not messages or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError("judge messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    if params.get("stream") or params.get("n", 1) != 1:
        raise ValueError("the judge answers one non-streamed choice: leave out `stream` and `n`")
    defaults: dict[str, Any] = {"temperature": 0.0}
    if "max_completion_tokens" not in params:
        defaults["max_tokens"] = DEFAULT_MAX_TOKENS
    payload = {k: v for k, v in {**defaults, **params}.items() if v is not None}
    tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"judge max_tokens must be a positive integer (it bounds the answer), got {tokens!r}")
    payload["messages"] = [dict(m) for m in messages]
    return payload


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:3])


def parse_verdict(
    text: str, labels: Sequence[str] = ("correct", "incorrect"), *, keyword: str = "VERDICT"
) -> str | None:
    """The label after the last `VERDICT: <label>` in a judge's text, lowercased, or None when there is none.

    Case, markdown emphasis, brackets and quotes around the label are ignored (`**Verdict:** Correct.` gives
    "correct"); the last match wins, so a judge that restates the format before answering is read right.
    """
    alternatives = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    pattern = rf"\b{re.escape(keyword)}\b[\s*_`]*[:=][\s*_`\[\]\"'(]*({alternatives})(?![\w-])"
    found = re.findall(pattern, text, flags=re.IGNORECASE)
    return found[-1].lower() if found else None
