"""ScriptedBackend: a test double speaking the subset of vLLM's HTTP protocol prorl-server uses.

It returns token ids and logprobs the test controls, records every request, and notices when a client
disconnects mid-generation (as vLLM aborts the request then). Replies are queued (`ScriptedBackend.push` or
`POST /script`) for one job (prorl-server names the job in the X-Prorl-Job-Id header), for prompts that
contain a text or match a regex, or on a global queue; a completion nothing is queued for fails with HTTP 409
unless the double was given a `default_reply`. `GET /script` shows the queues and the requests seen,
`DELETE /script` empties them. Its tokenizer is a toy: ChatML specials are single ids, every other
character is its code point + 10. It also serves OpenAI's `POST /v1/chat/completions` (an LLM judge's
protocol), answering from the same queues with the reply's text as the message. Told to (`inject`), it
misbehaves: hangs, fails, or answers malformed or oversized data (`misbehaving.py`; faults injected for
`completions` apply to chat completions too). Run it standalone with `python -m prorl_server.testing`.
"""

from __future__ import annotations

import asyncio
import collections
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from prorl_server.llm.local_tokenizer import without_claude_code_header
from prorl_server.llm.vllm_client import JOB_ID_HEADER
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
    """One scripted completion: `text` (tokenized, end-of-turn appended when `finish_reason` is "stop") or `ids`.

    A `status_code` other than 200 answers that HTTP error instead (after `delay_s`).
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(default=None, description="What the model says (ignored when `ids` is given).")
    ids: list[int] | None = Field(default=None, description="The exact token ids to return, as they are.")
    logprobs: list[float] | None = Field(default=None, description="One per id (default: -0.1 .. -0.7 cycling).")
    finish_reason: str = Field(default="stop", description='"stop" (end-of-turn appended to `text`) or "length".')
    stop_reason: str | None = Field(
        default=None,
        description="A stop string the reply ends on, as vLLM reports it (give `ids`: no end-of-turn is sampled); "
        "the text sent ends before it, as vLLM's does.",
    )
    delay_s: float | None = Field(
        default=None, ge=0, description="Seconds to 'generate' (default: the backend's default_delay_s)."
    )
    status_code: int = Field(default=200, description="200, or 400 to 599: answer this HTTP error instead.")

    @field_validator("status_code")
    @classmethod
    def _an_answer_or_an_error(cls, status: int) -> int:
        if status != 200 and not 400 <= status <= 599:
            raise ValueError("status_code is 200 (a completion) or an error status, 400 to 599")
        return status


Reply = ScriptedReply | str
"""A reply as tests write it: a plain string is `ScriptedReply(text=...)`."""


def as_reply(reply: Reply) -> ScriptedReply:
    """`reply` as a ScriptedReply."""
    return ScriptedReply(text=reply) if isinstance(reply, str) else reply


@dataclass
class PromptScript:
    """Replies for completions whose decoded prompt matches: contains `text`, or `regex` finds a match."""

    text: str | None
    regex: re.Pattern[str] | None
    replies: collections.deque[ScriptedReply] = field(default_factory=collections.deque)

    def matches(self, prompt: str) -> bool:
        """Whether this script is for `prompt`."""
        return self.text in prompt if self.regex is None else self.regex.search(prompt) is not None

    def describe(self) -> str:
        """How it matches, e.g. `prompt containing 'x'`."""
        return f"prompt containing {self.text!r}" if self.regex is None else f"prompt matching /{self.regex.pattern}/"


@dataclass
class RequestRecord:
    """What the double saw of one completion request, and which script answered it (`source`)."""

    prompt: list[int]
    params: dict[str, Any]
    job_id: str | None = None  # from the X-Prorl-Job-Id header prorl-server sends
    messages: list[dict[str, Any]] | None = None  # of a chat completion (its `prompt` is their ChatML rendering)
    source: str = ""  # "job 'j'", "prompt containing 'x'", "global queue", "default reply" or "none"
    outcome: str = "running"  # running | done | aborted | faulted (see fault_log) | unscripted
    started: float = field(default_factory=time.monotonic)


class NoReplyQueued(LookupError):
    """A completion came in and no script had a reply for it (and there is no default reply)."""


class ScriptedBackend:
    """State of the double: queued replies (per job, per prompt match, global), request log, tokenizer.

    A completion takes the first reply of, in order: its job's queue (when that job was ever scripted), the
    first prompt script that matches and still has replies (when one matches), the global queue. A job or
    prompt script that is used up does not fall through to the global queue. With nothing left, the
    `default_reply` answers if there is one; otherwise the completion fails with HTTP 409 (NoReplyQueued).
    """

    def __init__(
        self,
        *,
        legacy_token_strings: bool = False,
        default_delay_s: float = 0.0,
        report_vocab_size: bool = False,
        default_reply: Reply | None = None,
        model_root: str = MODEL_ROOT,
    ) -> None:
        self.tokenizer = ToyChatTokenizer()
        self.model_root = model_root  # `root` of GET /v1/models: a directory of tokenizer files, if one was written
        self.legacy_token_strings = legacy_token_strings
        self.default_delay_s = default_delay_s  # the delay of replies that set no delay_s
        self.default_reply = as_reply(default_reply) if default_reply is not None else None
        self.report_vocab_size = report_vocab_size  # as llama.cpp does (meta.n_vocab); vLLM does not
        self.replies: collections.deque[ScriptedReply] = collections.deque()  # the global queue
        self.job_replies: dict[str, collections.deque[ScriptedReply]] = {}
        self.prompt_scripts: list[PromptScript] = []
        self.requests: list[RequestRecord] = []
        self.in_flight = 0  # completions (and chat completions) being answered now
        self.max_in_flight = 0  # the most at once
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

    def push(
        self, *replies: Reply, job: str | None = None, prompt: str | None = None, prompt_regex: str | None = None
    ) -> int:
        """Queue replies for one job (`job`, its job id), for prompts that contain `prompt` or match
        `prompt_regex` (re.search on the decoded prompt), or, with none of these, on the global queue.
        Returns how many replies that queue now holds."""
        if sum(key is not None for key in (job, prompt, prompt_regex)) > 1:
            raise ValueError("push(): give at most one of job, prompt and prompt_regex")
        parsed = [as_reply(r) for r in replies]
        regex = re.compile(prompt_regex) if prompt_regex is not None else None
        with self._lock:
            queue = self._queue(job, prompt, regex)
            queue.extend(parsed)
            return len(queue)

    def _queue(
        self, job: str | None, prompt: str | None, regex: re.Pattern[str] | None
    ) -> collections.deque[ScriptedReply]:
        if job is not None:
            return self.job_replies.setdefault(job, collections.deque())
        if prompt is None and regex is None:
            return self.replies
        for script in self.prompt_scripts:
            if script.text == prompt and script.regex == regex:
                return script.replies
        self.prompt_scripts.append(PromptScript(prompt, regex))
        return self.prompt_scripts[-1].replies

    def take(self, job_id: str | None, prompt: str) -> tuple[ScriptedReply, str]:
        """The reply for a completion of `job_id` with decoded `prompt`, and where it came from.

        Raises NoReplyQueued (its message names the job and the prompt) when no script has one."""
        with self._lock:
            if job_id is not None and job_id in self.job_replies:
                sources = [(f"job {job_id!r}", self.job_replies[job_id])]
            else:
                sources = [(s.describe(), s.replies) for s in self.prompt_scripts if s.matches(prompt)]
                sources = sources or [("global queue", self.replies)]
            for source, queue in sources:
                if queue:
                    return queue.popleft(), source
            if self.default_reply is not None:
                return self.default_reply, "default reply"
        what = "all used up" if sources[0][0] != "global queue" else "queue empty"
        raise NoReplyQueued(
            f"scripted backend: no reply queued for job {job_id!r} / prompt ...{prompt[-120:]!r} "
            f"({', '.join(s for s, _ in sources)}: {what}); push one (ScriptedBackend.push or POST /script) "
            "or give the double a default reply"
        )

    def reset(self) -> int:
        """Drop every queued reply (all queues), the request log and the in-flight high-water mark; returns how
        many replies were dropped."""
        with self._lock:
            queues = [self.replies, *self.job_replies.values(), *(s.replies for s in self.prompt_scripts)]
            dropped = sum(len(q) for q in queues)
            self.replies.clear()
            self.job_replies.clear()
            self.prompt_scripts.clear()
            self.requests.clear()
            self.max_in_flight = self.in_flight
            return dropped

    def script(self) -> dict[str, Any]:
        """The queued replies per key and the default reply, as JSON (what `GET /script` shows)."""

        def dump(replies: Iterable[ScriptedReply]) -> list[dict[str, Any]]:
            return [r.model_dump(exclude_none=True) for r in replies]

        with self._lock:
            prompts = [
                {"prompt": s.text} if s.regex is None else {"prompt_regex": s.regex.pattern}
                for s in self.prompt_scripts
            ]
            return {
                "global": dump(self.replies),
                "jobs": {job: dump(q) for job, q in self.job_replies.items()},
                "prompts": [
                    {**p, "replies": dump(s.replies)} for p, s in zip(prompts, self.prompt_scripts, strict=True)
                ],
                "default_reply": self.default_reply.model_dump(exclude_none=True) if self.default_reply else None,
            }

    def delay_of(self, reply: ScriptedReply) -> float:
        """Seconds `reply` takes: its own delay_s, else the backend's default_delay_s."""
        return reply.delay_s if reply.delay_s is not None else self.default_delay_s

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


class ScriptPush(BaseModel):
    """Body of `POST /script` that queues for one key: `job`, `prompt` (substring) or `prompt_regex`."""

    model_config = ConfigDict(extra="forbid")

    replies: list[Reply]
    job: str | None = None
    prompt: str | None = None
    prompt_regex: str | None = None


_SCRIPT_BODY: TypeAdapter[list[Reply] | ScriptPush] = TypeAdapter(list[Reply] | ScriptPush)


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
        card: dict[str, Any] = {
            "id": MODEL_NAME,
            "object": "model",
            "root": backend.model_root,
            "max_model_len": 32768,
        }
        if backend.report_vocab_size:
            card["meta"] = {"n_vocab": tok.VOCAB_SIZE}
        return await answer(Endpoint.MODELS, {"object": "list", "data": [card]}, request)

    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any], request: Request) -> Any:
        if "messages" in body:
            messages = [  # as vLLM prepares them (and the server's own tokenization does)
                {**m, "content": without_claude_code_header(m.get("role"), m["content"])}
                if isinstance(m.get("content"), str)
                else m
                for m in body["messages"]
            ]
            text = tok.render(messages, bool(body.get("add_generation_prompt", True)))
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

    async def scripted_reply(record: RequestRecord, request: Request) -> ScriptedReply | JSONResponse:
        """Log the request, take its reply and wait its delay; an error response instead when it fails."""
        job_id = request.headers.get(JOB_ID_HEADER)
        record.job_id = unquote(job_id) if job_id is not None else None
        backend.requests.append(record)
        backend.in_flight += 1
        backend.max_in_flight = max(backend.max_in_flight, backend.in_flight)
        try:
            return await wait_reply(record, request)
        finally:
            backend.in_flight -= 1

    async def wait_reply(record: RequestRecord, request: Request) -> ScriptedReply | JSONResponse:
        try:
            reply, record.source = backend.take(record.job_id, tok.decode(record.prompt))
        except NoReplyQueued as exc:
            record.source, record.outcome = "none", "unscripted"
            return error(str(exc), 409)
        deadline = time.monotonic() + backend.delay_of(reply)
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                record.outcome = "aborted"
                return JSONResponse({}, status_code=499)
            await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        if reply.status_code != 200:
            record.outcome = "done"
            return error(f"scripted backend: scripted failure {reply.status_code} ({record.source})", reply.status_code)
        return reply

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any], request: Request) -> Any:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = tok.encode(prompt)
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return error("prompt must be a string or a list of token ids")
        record = RequestRecord(prompt=prompt, params={k: v for k, v in body.items() if k != "prompt"})
        reply = await scripted_reply(record, request)
        if not isinstance(reply, ScriptedReply):
            return reply
        ids, logprobs, finish = backend.materialize(reply, body.get("max_tokens"))
        text = tok.decode([i for i in ids if i != tok.eos_id])
        stop_reason = reply.stop_reason if finish == "stop" else None
        choice: dict[str, Any] = {
            "index": 0,
            "text": text.removesuffix(stop_reason) if stop_reason is not None else text,
            "finish_reason": finish,
            "stop_reason": stop_reason,
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

    @app.post("/v1/chat/completions")
    async def chat_completions(body: dict[str, Any], request: Request) -> Any:
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages and all(_is_message(m) for m in messages)):
            return error("messages must be a non-empty list of {'role': str, 'content': ...} objects")
        record = RequestRecord(
            prompt=tok.encode(tok.render(messages, add_generation_prompt=True)),
            params={k: v for k, v in body.items() if k != "messages"},
            messages=messages,
        )
        reply = await scripted_reply(record, request)
        if not isinstance(reply, ScriptedReply):
            return reply
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        ids, _, finish = backend.materialize(reply, max_tokens)
        text = tok.decode([i for i in ids if i != tok.eos_id])
        response: dict[str, Any] = {
            "id": f"chatcmpl-{len(backend.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(record.prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(record.prompt) + len(ids),
            },
        }
        answered = await answer(Endpoint.COMPLETIONS, response, request, max_tokens=max_tokens)
        record.outcome = "done" if answered is response else "faulted"
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
    async def push_script(request: Request) -> Any:
        try:
            pushed = _SCRIPT_BODY.validate_json(await request.body())
            if isinstance(pushed, list):
                return {"queued": backend.push(*pushed)}
            keys = {"job": pushed.job, "prompt": pushed.prompt, "prompt_regex": pushed.prompt_regex}
            return {"queued": backend.push(*pushed.replies, **keys)}
        except ValidationError as exc:
            return JSONResponse({"detail": exc.errors(include_url=False, include_context=False)}, status_code=422)
        except (ValueError, re.error) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.get("/script")
    async def show_script() -> dict[str, Any]:
        return {**backend.script(), "requests": [_seen(r, tok) for r in backend.requests]}

    @app.delete("/script")
    async def reset_script() -> dict[str, int]:
        return {"dropped": backend.reset()}

    @app.get("/requests")
    async def requests() -> list[dict[str, Any]]:
        return [
            {
                "prompt": r.prompt,
                "params": r.params,
                "outcome": r.outcome,
                "job_id": r.job_id,
                "source": r.source,
                **({"messages": r.messages} if r.messages is not None else {}),
            }
            for r in backend.requests
        ]

    return app


def _is_message(message: Any) -> bool:
    return isinstance(message, dict) and isinstance(message.get("role"), str)


def _seen(record: RequestRecord, tok: ToyChatTokenizer) -> dict[str, Any]:
    return {
        "job_id": record.job_id,
        "prompt_text": tok.decode(record.prompt),
        "source": record.source,
        "outcome": record.outcome,
    }
