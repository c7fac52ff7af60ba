"""ScriptedBackend: a test double speaking the subset of vLLM's HTTP protocol prorl-server uses.

It returns token ids and logprobs the test controls, records every request, and notices when a client
disconnects mid-generation (as vLLM aborts the request then). Replies are queued (`ScriptedBackend.push` or
`POST /script`) for one job (prorl-server names the job in the X-Prorl-Job-Id header), for prompts that
contain a text or match a regex, or on a global queue; a completion nothing is queued for fails with HTTP 409
unless the double was given a `default_reply`. `GET /script` shows the queues and the requests seen,
`DELETE /script` empties them. Its tokenizer is a toy: ChatML specials are single ids, every other
character is its code point + 10; its chat template renders `tools` into the system turn as Hermes/Qwen
templates do. Like vLLM, it enforces its context length (`max_model_len`, 32,768 unless told): a prompt
longer than it, a `max_tokens` above it or a prompt that leaves no room gets vLLM's 400, and `max_tokens`
is cut to the room the prompt leaves. It also serves OpenAI's `POST /v1/chat/completions` (an LLM judge's
protocol), answering from the same queues with the reply's text as the message. Told to (`inject`), it
misbehaves: hangs, fails, or answers malformed or oversized data (`misbehaving.py`; faults injected for
`completions` apply to chat completions too). Run it standalone with `python -m prorl_server.testing`.

This module holds the double's state and its control routes (`/script`, `/requests`, vLLM's weight-update
routes); vLLM's routes are the engines' skeleton (`devllm.vllm_routes`) filled by `scripted_serving`, the
script's pieces are in `scripts`, the tokenizer in `toy_tokenizer`.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from prorl_server.devllm import add_vllm_routes
from prorl_server.testing.misbehaving import Endpoint, Fault, FaultRecord
from prorl_server.testing.scripted_serving import ScriptedServing, error_body
from prorl_server.testing.scripts import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    MODEL_ROOT,
    ContextRefused,
    NoReplyQueued,
    PromptScript,
    Reply,
    RequestRecord,
    ScriptedReply,
    as_reply,
)
from prorl_server.testing.toy_tokenizer import ToyChatTokenizer

__all__ = [  # the double's names, wherever they are defined
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "MODEL_ROOT",
    "ContextRefused",
    "NoReplyQueued",
    "Reply",
    "RequestRecord",
    "ScriptPush",
    "ScriptedBackend",
    "ScriptedReply",
    "ToyChatTokenizer",
    "as_reply",
    "create_scripted_backend_app",
]


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
        max_model_len: int = MAX_MODEL_LEN,
    ) -> None:
        self.tokenizer = ToyChatTokenizer()
        self.max_model_len = max_model_len  # advertised (GET /v1/models, /tokenize) and enforced, as vLLM's
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

    def fit_context(self, prompt_len: int, requested: int | None, name: str = "max_tokens") -> int:
        """The `max_tokens` vLLM uses for a prompt of `prompt_len` ids: `requested` (field `name`) cut to the
        room the prompt leaves; ContextRefused, worded as vLLM's (and the dev engine's
        `devllm.validation.fit_context`), when `requested` exceeds the context, the prompt is longer than
        it, or it leaves no room."""
        limit = self.max_model_len
        if requested is not None and requested > limit:
            raise ContextRefused(
                f"{name}={requested} cannot be greater than max_model_len={limit}. Please request fewer output "
                f"tokens. (parameter={name}, value={requested})",
                name,
            )
        if prompt_len > limit:
            raise ContextRefused(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={prompt_len})",
                "input_tokens",
            )
        room = limit - prompt_len
        max_tokens = room if requested is None else min(requested, room)
        if max_tokens < 1:
            raise ContextRefused(
                f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        return max_tokens

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
        return JSONResponse(error_body(message, status), status_code=status)

    add_vllm_routes(app, ScriptedServing(backend))

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


def _seen(record: RequestRecord, tok: ToyChatTokenizer) -> dict[str, Any]:
    return {
        "job_id": record.job_id,
        "prompt_text": tok.decode(record.prompt),
        "source": record.source,
        "outcome": record.outcome,
    }
