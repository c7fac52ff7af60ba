"""ScriptedBackend: a test double speaking the subset of vLLM's HTTP protocol prorl-server uses.

It returns token ids and logprobs the test controls (queue replies with `POST /script` or
`ScriptedBackend.push`), records every request, and notices when a client disconnects mid-generation
(as vLLM aborts the request then). Its tokenizer is a toy: ChatML specials are single ids, every other
character is its code point + 10. Told to (`inject`), it misbehaves: hangs, fails, or answers malformed or
oversized data (`misbehaving.py`). Run it standalone with `python -m prorl_server.testing`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from prorl_server.testing.misbehaving import Endpoint, Fault, FaultRecord, misbehave

MODEL_NAME = "scripted-test-double"
MODEL_ROOT = "/scripted/model"  # the checkpoint `GET /v1/models` names as `root` (vLLM: the model it started with)


class ToyChatTokenizer:
    """Character tokenizer with a ChatML template; specials are single tokens."""

    SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    OFFSET = 10
    VOCAB_SIZE = 0x110000 + OFFSET  # every code point has an id

    def __init__(self) -> None:
        self._by_id = {v: k for k, v in self.SPECIALS.items()}

    @property
    def eos_id(self) -> int:
        """The end-of-turn token (`<|im_end|>`)."""
        return self.SPECIALS["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        """Text -> ids, recognizing the special tokens."""
        ids: list[int] = []
        i = 0
        while i < len(text):
            for special, sid in self.SPECIALS.items():
                if text.startswith(special, i):
                    ids.append(sid)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]) + self.OFFSET)
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text (specials rendered as their strings)."""
        return "".join(self._by_id.get(i) or chr(i - self.OFFSET) for i in ids)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """ChatML rendering of a conversation."""
        text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ScriptedReply(BaseModel):
    """One scripted completion. Give `text` (tokenized, end-of-turn appended when `stop`) or `ids`."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    delay_s: float = Field(default=0.0, ge=0, description="Seconds to 'generate' (disconnects are noticed).")
    status_code: int = 200


@dataclass
class RequestRecord:
    """What the double saw of one completion request."""

    prompt: list[int]
    params: dict[str, Any]
    outcome: str = "running"  # running | done | aborted | faulted (see fault_log)
    started: float = field(default_factory=time.monotonic)


class ScriptedBackend:
    """State of the double: queued replies, request log, tokenizer."""

    def __init__(
        self, *, legacy_token_strings: bool = False, default_delay_s: float = 0.0, report_vocab_size: bool = False
    ) -> None:
        self.tokenizer = ToyChatTokenizer()
        self.legacy_token_strings = legacy_token_strings
        self.default_delay_s = default_delay_s
        self.report_vocab_size = report_vocab_size  # as llama.cpp does (meta.n_vocab); vLLM does not
        self.replies: collections.deque[ScriptedReply] = collections.deque()
        self.requests: list[RequestRecord] = []
        self.healthy = True
        self.faults: dict[Endpoint, collections.deque[Fault]] = collections.defaultdict(collections.deque)
        self.fault_log: list[FaultRecord] = []
        # vLLM's weight-update endpoints (VLLM_SERVER_DEV_MODE=1): off, they answer 404 as vLLM's do
        self.dev_mode = True
        self.weights_path = MODEL_ROOT  # the checkpoint loaded now
        self.bad_weight_paths: set[str] = set()  # reloading one of these fails (500) as a missing checkpoint does
        self.admin_log: list[str] = []  # "reload_weights <path>", "reset_prefix_cache", in order
        self._lock = threading.Lock()

    def inject(self, endpoint: Endpoint | str, *faults: Fault | str) -> None:
        """Make the next requests to `endpoint` misbehave, one fault each, in order."""
        with self._lock:
            self.faults[Endpoint(endpoint)].extend(Fault(f) for f in faults)

    def next_fault(self, endpoint: Endpoint) -> FaultRecord | None:
        """The fault the current request to `endpoint` must commit (now logged), if any."""
        with self._lock:
            queue = self.faults[endpoint]
            if not queue:
                return None
            record = FaultRecord(endpoint, queue.popleft())
            self.fault_log.append(record)
            return record

    def push(self, *replies: ScriptedReply | str) -> None:
        """Queue replies (a plain string is a `ScriptedReply(text=...)`)."""
        with self._lock:
            for reply in replies:
                self.replies.append(ScriptedReply(text=reply) if isinstance(reply, str) else reply)

    def _next_reply(self) -> ScriptedReply:
        with self._lock:
            if self.replies:
                return self.replies.popleft()
        n = len(self.requests)
        return ScriptedReply(text=f"reply {n}", delay_s=self.default_delay_s)

    def materialize(self, reply: ScriptedReply, max_tokens: int | None) -> tuple[list[int], list[float], str]:
        """The ids, logprobs and finish reason a reply stands for, cut to `max_tokens`."""
        if reply.ids is not None:
            ids = list(reply.ids)
        else:
            ids = self.tokenizer.encode(reply.text or "")
            if reply.finish_reason == "stop":
                ids.append(self.tokenizer.eos_id)
        logprobs = list(reply.logprobs) if reply.logprobs is not None else [-0.1 * (1 + i % 7) for i in range(len(ids))]
        finish = reply.finish_reason
        if max_tokens is not None and len(ids) > max_tokens:
            ids, logprobs, finish = ids[:max_tokens], logprobs[:max_tokens], "length"
        return ids, logprobs, finish


def create_scripted_backend_app(backend: ScriptedBackend | None = None) -> FastAPI:
    """A FastAPI app serving the double; `app.state.backend` is its ScriptedBackend."""
    backend = backend or ScriptedBackend()
    app = FastAPI(title="scripted vLLM-protocol test double")
    app.state.backend = backend
    tok = backend.tokenizer

    def error(message: str, status: int = 400) -> JSONResponse:
        err_type = "BadRequestError" if status < 500 else "InternalServerError"
        return JSONResponse({"error": {"message": message, "type": err_type, "code": status}}, status_code=status)

    async def answer(endpoint: Endpoint, body: dict[str, Any], request: Request, **context: Any) -> Any:
        record = backend.next_fault(endpoint)
        if record is None:
            return body
        vocab = tok.VOCAB_SIZE if backend.report_vocab_size else None
        return await misbehave(record.fault, endpoint, body, request, record, vocab_size=vocab, **context)

    @app.get("/health")
    async def health(request: Request) -> Any:
        if not backend.healthy:
            return JSONResponse({}, status_code=503)
        return await answer(Endpoint.HEALTH, {}, request)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        card: dict[str, Any] = {"id": MODEL_NAME, "object": "model", "root": MODEL_ROOT, "max_model_len": 32768}
        if backend.report_vocab_size:
            card["meta"] = {"n_vocab": tok.VOCAB_SIZE}
        return await answer(Endpoint.MODELS, {"object": "list", "data": [card]}, request)

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any], request: Request) -> Any:
        if "messages" in body:
            text = tok.render(body["messages"], bool(body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return error("tokenize needs 'prompt' (text) or 'messages'")
        ids = tok.encode(text)
        return await answer(
            Endpoint.TOKENIZE, {"count": len(ids), "max_model_len": 32768, "tokens": ids, "token_strs": None}, request
        )

    @app.post("/detokenize")
    async def detokenize(body: dict[str, Any], request: Request) -> Any:
        text = tok.decode([int(t) for t in body.get("tokens", [])])
        return await answer(Endpoint.DETOKENIZE, {"prompt": text}, request)

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any], request: Request) -> Any:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = tok.encode(prompt)
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return error("prompt must be a string or a list of token ids")
        record = RequestRecord(prompt=prompt, params={k: v for k, v in body.items() if k != "prompt"})
        backend.requests.append(record)
        reply = backend._next_reply()
        if reply.status_code != 200:
            record.outcome = "done"
            return error(f"scripted failure {reply.status_code}", reply.status_code)
        deadline = time.monotonic() + reply.delay_s
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                record.outcome = "aborted"
                return JSONResponse({}, status_code=499)
            await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        ids, logprobs, finish = backend.materialize(reply, body.get("max_tokens"))
        choice: dict[str, Any] = {
            "index": 0,
            "text": tok.decode([i for i in ids if i != tok.eos_id]),
            "finish_reason": finish,
            "stop_reason": None,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{i}" for i in ids] if backend.legacy_token_strings else [tok.decode([i]) for i in ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": logprobs,
                "top_logprobs": None,
                "text_offset": list(range(len(ids))),
            }
        response: dict[str, Any] = {
            "id": f"cmpl-{len(backend.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }
        if body.get("return_token_ids") and not backend.legacy_token_strings:
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = prompt
        answered = await answer(Endpoint.COMPLETIONS, response, request, max_tokens=body.get("max_tokens"))
        record.outcome = "done" if answered is response else "faulted"  # a fault's fate is in fault_log
        return answered

    @app.post("/collective_rpc")
    async def collective_rpc(body: dict[str, Any]) -> Any:
        if not backend.dev_mode:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        kwargs = body.get("kwargs") or {}
        if body.get("method") != "reload_weights" or not isinstance(kwargs.get("weights_path"), str):
            return error(f"the double runs only reload_weights(weights_path=...), not {body.get('method')!r}", 500)
        path = kwargs["weights_path"]
        backend.admin_log.append(f"reload_weights {path}")
        if path in backend.bad_weight_paths:
            return error(f"Call to collective_rpc method failed: Cannot find any model weights with `{path}`", 500)
        backend.weights_path = path
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Any:
        if not backend.dev_mode:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        backend.admin_log.append("reset_prefix_cache")
        return {"success": True}

    @app.post("/script")
    async def script(replies: list[ScriptedReply]) -> dict[str, int]:
        backend.push(*replies)
        return {"queued": len(backend.replies)}

    @app.get("/requests")
    async def requests() -> list[dict[str, Any]]:
        return [{"prompt": r.prompt, "params": r.params, "outcome": r.outcome} for r in backend.requests]

    return app
