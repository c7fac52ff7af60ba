"""Faults the scripted backend (a TEST DOUBLE, not an LLM) commits on request: a misbehaving vLLM.

`ScriptedBackend.inject(endpoint, *faults)` queues faults for one endpoint; each of the next requests to
it takes one and answers with the fault applied to what it would have answered. The faults are the ways
a real backend can break a client: hang, fail, send malformed or out-of-range data, or send far more
than was asked for. Every fault served is recorded in `ScriptedBackend.fault_log`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

HUGE_BODY_BYTES = 32 * 1024 * 1024  # what HUGE_BODY sends in all, if the client reads it all
HUGE_DECLARED_BYTES = 10**12  # the Content-Length HUGE_CONTENT_LENGTH announces
_CHUNK = b" " * (64 * 1024)  # JSON whitespace: the padded answer is still valid JSON
_NO_VOCABULARY_BOUND = 2**31


class Endpoint(StrEnum):
    """The endpoints of the double that can misbehave."""

    COMPLETIONS = "completions"
    TOKENIZE = "tokenize"
    DETOKENIZE = "detokenize"
    MODELS = "models"
    HEALTH = "health"


class Fault(StrEnum):
    """One way to break an answer. Data faults apply to the token ids / logprobs the endpoint returns."""

    HANG = "hang"  # never answer (until the client disconnects)
    SERVER_ERROR = "server_error"  # HTTP 500 with a vLLM-style error body
    NOT_JSON = "not_json"  # HTTP 200 with an HTML page
    MISSING_FIELD = "missing_field"  # the field the client needs is absent
    WRONG_TYPE = "wrong_type"  # the field the client needs has another JSON type
    CHOICE_NOT_OBJECT = "choice_not_object"  # completions: "choices": [1]
    FLOAT_ID = "float_id"  # a token id sent as 5.0
    BOOL_ID = "bool_id"  # a token id sent as true
    NEGATIVE_ID = "negative_id"
    OUT_OF_VOCAB_ID = "out_of_vocab_id"  # the reported vocabulary size (2**31 when none is reported)
    NAN_LOGPROB = "nan_logprob"
    POSITIVE_LOGPROB = "positive_logprob"
    NULL_LOGPROB = "null_logprob"
    LENGTH_MISMATCH = "length_mismatch"  # one logprob more than there are ids
    TOO_MANY_IDS = "too_many_ids"  # one id more than max_tokens
    HUGE_BODY = "huge_body"  # the answer, then HUGE_BODY_BYTES of whitespace, streamed without a length
    HUGE_CONTENT_LENGTH = "huge_content_length"  # announces HUGE_DECLARED_BYTES, sends the answer, waits


@dataclass
class FaultRecord:
    """One fault served: `outcome` is running, done (sent in full) or aborted (the client went away)."""

    endpoint: Endpoint
    fault: Fault
    outcome: str = "running"
    bytes_sent: int = 0


_MISSING = {
    Endpoint.COMPLETIONS: ("choices",),
    Endpoint.TOKENIZE: ("tokens",),
    Endpoint.DETOKENIZE: ("prompt",),
    Endpoint.MODELS: ("data", 0, "id"),
}
_WRONG_TYPE: dict[Endpoint, tuple[tuple[Any, ...], Any]] = {
    Endpoint.COMPLETIONS: (("choices", 0, "token_ids"), "40 41 2"),
    Endpoint.TOKENIZE: (("tokens",), "40 41 2"),
    Endpoint.DETOKENIZE: (("prompt",), 123),
    Endpoint.MODELS: (("data", 0, "max_model_len"), "32768"),
}


async def misbehave(
    fault: Fault,
    endpoint: Endpoint,
    answer: dict[str, Any],
    request: Request,
    record: FaultRecord,
    *,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
) -> Response:
    """The response of `endpoint` with `fault` applied to its well-formed `answer`."""
    if fault is Fault.HANG:
        await _until_disconnect(request.receive)
        record.outcome = "aborted"
        return Response(status_code=499)
    if fault is Fault.SERVER_ERROR:
        record.outcome = "done"
        body = {"error": {"message": "scripted server error (a test double's fault)", "type": "Internal", "code": 500}}
        return JSONResponse(body, status_code=500)
    if fault is Fault.NOT_JSON:
        record.outcome = "done"
        return Response("<html><body>502 Bad Gateway</body></html>", media_type="text/html")
    if fault in (Fault.HUGE_BODY, Fault.HUGE_CONTENT_LENGTH):
        return _OversizedResponse(json.dumps(answer).encode(), record, announce=fault is Fault.HUGE_CONTENT_LENGTH)
    _corrupt(fault, endpoint, answer, max_tokens, vocab_size)
    record.outcome = "done"
    return Response(json.dumps(answer), media_type="application/json")  # json.dumps writes NaN


def _corrupt(
    fault: Fault, endpoint: Endpoint, answer: dict[str, Any], max_tokens: int | None, vocab_size: int | None
) -> None:
    if fault is Fault.MISSING_FIELD:
        *path, last = _MISSING[endpoint]
        del _at(answer, path)[last]
    elif fault is Fault.WRONG_TYPE:
        (*path, last), value = _WRONG_TYPE[endpoint]
        _at(answer, path)[last] = value
    elif fault is Fault.CHOICE_NOT_OBJECT:
        answer["choices"] = [1]
    elif fault in _BAD_IDS or fault is Fault.OUT_OF_VOCAB_ID:
        bad = _BAD_IDS.get(fault, vocab_size or _NO_VOCABULARY_BOUND)
        ids = _ids(endpoint, answer)
        ids[0] = bad if not isinstance(ids[0], str) else f"token_id:{json.dumps(bad)}"
    elif fault in _BAD_LOGPROBS:
        _logprobs(answer)[0] = _BAD_LOGPROBS[fault]
    elif fault is Fault.LENGTH_MISMATCH:
        _logprobs(answer).append(-0.5)
    elif fault is Fault.TOO_MANY_IDS:
        ids, logprobs = _ids(endpoint, answer), _logprobs(answer)
        extra = (max_tokens or len(ids)) + 1 - len(ids)
        ids.extend([ids[-1]] * extra)
        logprobs.extend([-0.5] * extra)
    else:
        raise ValueError(f"fault {fault} does not apply to /{endpoint}")


_BAD_IDS: dict[Fault, Any] = {
    Fault.FLOAT_ID: 40.0,
    Fault.BOOL_ID: True,
    Fault.NEGATIVE_ID: -1,
}
_BAD_LOGPROBS: dict[Fault, Any] = {
    Fault.NAN_LOGPROB: float("nan"),
    Fault.POSITIVE_LOGPROB: 0.5,
    Fault.NULL_LOGPROB: None,
}


def _at(answer: dict[str, Any], path: list[Any]) -> Any:
    node: Any = answer
    for key in path:
        node = node[key]
    return node


def _ids(endpoint: Endpoint, answer: dict[str, Any]) -> list[Any]:
    if endpoint is Endpoint.TOKENIZE:
        return answer["tokens"]
    choice = answer["choices"][0]
    return choice["token_ids"] if "token_ids" in choice else choice["logprobs"]["tokens"]


def _logprobs(answer: dict[str, Any]) -> list[Any]:
    return answer["choices"][0]["logprobs"]["token_logprobs"]


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)


class _OversizedResponse(Response):
    """The answer padded with whitespace up to HUGE_BODY_BYTES, sent while the client reads; or, with
    `announce`, a Content-Length of HUGE_DECLARED_BYTES and then only the answer, until the client gives up."""

    def __init__(self, answer: bytes, record: FaultRecord, *, announce: bool) -> None:
        super().__init__(media_type="application/json")
        self.answer, self.record, self.announce = answer, record, announce

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json")]
        if self.announce:
            headers.append((b"content-length", str(HUGE_DECLARED_BYTES).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            chunk = self.answer
            while not gone.done() and self.record.bytes_sent < HUGE_BODY_BYTES:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.record.bytes_sent += len(chunk)
                if self.announce:
                    await gone
                chunk = _CHUNK
                await asyncio.sleep(0)  # lets the disconnect be noticed: sends after it return at once
            if gone.done():
                self.record.outcome = "aborted"
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.record.outcome = "done"
        finally:
            gone.cancel()
