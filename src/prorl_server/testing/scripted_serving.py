"""The scripted test double's answers on vLLM's routes (`devllm.vllm_routes`), from its `ScriptedBackend`.

Bodies are read as raw JSON objects, so a test can send the double anything. Answers are `protocol.vllm`'s
models built unchecked (`model_construct`): the double answers what it was scripted, right or wrong, and
the client's checks judge it; then an injected fault (`misbehaving.py`) may break the answer further.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote

from fastapi import Request
from fastapi.responses import JSONResponse

from prorl_server.devllm import VLLMServing
from prorl_server.llm import JOB_ID_HEADER, vllm_tool, without_claude_code_header
from prorl_server.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    CompletionLogProbs,
    CompletionResponse,
    CompletionResponseChoice,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    ModelMeta,
    TokenizeResponse,
    UsageInfo,
    VllmErrorInfo,
    VllmErrorResponse,
)
from prorl_server.testing.misbehaving import Endpoint, misbehave
from prorl_server.testing.scripts import (
    MODEL_NAME,
    ContextRefused,
    NoReplyQueued,
    RequestRecord,
    ScriptedReply,
)

if TYPE_CHECKING:
    from prorl_server.testing.scripted_backend import ScriptedBackend

Body = dict[str, Any]


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's error body: BadRequestError below 500, InternalServerError from 500."""
    err_type = "BadRequestError" if status < 500 else "InternalServerError"
    return VllmErrorResponse(error=VllmErrorInfo(message=message, type=err_type, param=param, code=status)).model_dump()


def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    """An error answer with vLLM's body."""
    return JSONResponse(error_body(message, status, param), status_code=status)


def _usage(prompt: list[int], ids: list[int]) -> UsageInfo:
    return UsageInfo.model_construct(
        prompt_tokens=len(prompt), completion_tokens=len(ids), total_tokens=len(prompt) + len(ids)
    )


class ScriptedServing(VLLMServing):
    """vLLM's routes answered from the queues of a `ScriptedBackend`, with its faults injected."""

    tokenize_body: ClassVar[Any] = Body
    detokenize_body: ClassVar[Any] = Body
    completion_body: ClassVar[Any] = Body
    chat_body: ClassVar[Any] = Body

    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        self.tok = backend.tokenizer

    async def answer(self, endpoint: Endpoint, body: dict[str, Any], request: Request, **context: Any) -> Any:
        """`body`, or what the next fault queued for `endpoint` makes of it."""
        record = self.backend.next_fault(endpoint)
        if record is None:
            return body
        vocab = self.tok.VOCAB_SIZE if self.backend.report_vocab_size else None
        return await misbehave(record.fault, endpoint, body, request, record, vocab_size=vocab, **context)

    async def health(self, request: Request) -> Any:
        if not self.backend.healthy:
            return JSONResponse({}, status_code=503)
        return await self.answer(Endpoint.HEALTH, {}, request)

    async def models(self, request: Request) -> Any:
        backend = self.backend
        card: dict[str, Any] = {
            "id": MODEL_NAME,
            "object": "model",
            "root": backend.model_root,
            "max_model_len": backend.max_model_len,
        }
        if backend.report_vocab_size:
            card["meta"] = ModelMeta.model_construct(n_vocab=self.tok.VOCAB_SIZE)
        models = ModelList.model_construct(object="list", data=[ModelCard.model_construct(**card)])
        return await self.answer(Endpoint.MODELS, models.model_dump(exclude_unset=True), request)

    async def tokenize(self, body: Body, request: Request) -> Any:
        tok = self.tok
        if "messages" in body:
            messages = [  # as vLLM prepares them (and the server's own tokenization does)
                {**m, "content": without_claude_code_header(m.get("role"), m["content"])}
                if isinstance(m.get("content"), str)
                else m
                for m in body["messages"]
            ]
            text = tok.render(messages, bool(body.get("add_generation_prompt", True)), _tools(body))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return error("tokenize needs 'prompt' (text) or 'messages'")
        ids = tok.encode(text)
        answer = TokenizeResponse.model_construct(
            count=len(ids), max_model_len=self.backend.max_model_len, tokens=ids, token_strs=None
        )
        return await self.answer(Endpoint.TOKENIZE, answer.model_dump(exclude_unset=True), request)

    async def detokenize(self, body: Body, request: Request) -> Any:
        text = self.tok.decode([int(t) for t in body.get("tokens", [])])
        answer = DetokenizeResponse.model_construct(prompt=text)
        return await self.answer(Endpoint.DETOKENIZE, answer.model_dump(exclude_unset=True), request)

    async def scripted_reply(self, record: RequestRecord, request: Request) -> ScriptedReply | JSONResponse:
        """Log the request, take its reply and wait its delay; an error response instead when it fails."""
        backend = self.backend
        job_id = request.headers.get(JOB_ID_HEADER)
        record.job_id = unquote(job_id) if job_id is not None else None
        backend.requests.append(record)
        backend.in_flight += 1
        backend.max_in_flight = max(backend.max_in_flight, backend.in_flight)
        try:
            return await self._wait_reply(record, request)
        finally:
            backend.in_flight -= 1

    async def _wait_reply(self, record: RequestRecord, request: Request) -> ScriptedReply | JSONResponse:
        backend = self.backend
        try:
            reply, record.source = backend.take(record.job_id, self.tok.decode(record.prompt))
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

    async def completion(self, body: Body, request: Request) -> Any:
        backend, tok = self.backend, self.tok
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = tok.encode(prompt)
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return error("prompt must be a string or a list of token ids")
        try:
            max_tokens = backend.fit_context(len(prompt), body.get("max_tokens"))
        except ContextRefused as exc:
            return error(str(exc), param=exc.param)
        record = RequestRecord(prompt=prompt, params={k: v for k, v in body.items() if k != "prompt"})
        reply = await self.scripted_reply(record, request)
        if not isinstance(reply, ScriptedReply):
            return reply
        ids, logprobs, finish = backend.materialize(reply, max_tokens)
        text = tok.decode([i for i in ids if i != tok.eos_id])
        stop_reason = reply.stop_reason if finish == "stop" else None
        block = None
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{i}" for i in ids] if backend.legacy_token_strings else [tok.decode([i]) for i in ids]
            block = CompletionLogProbs.model_construct(
                tokens=tokens, token_logprobs=logprobs, top_logprobs=None, text_offset=list(range(len(ids)))
            )
        choice: dict[str, Any] = {
            "index": 0,
            "text": text.removesuffix(stop_reason) if stop_reason is not None else text,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "logprobs": block,
        }
        if body.get("return_token_ids") and not backend.legacy_token_strings:
            choice |= {"token_ids": ids, "prompt_token_ids": prompt}
        response = CompletionResponse.model_construct(
            id=f"cmpl-{len(backend.requests)}",
            object="text_completion",
            created=int(time.time()),
            model=MODEL_NAME,
            choices=[CompletionResponseChoice.model_construct(**choice)],
            usage=_usage(prompt, ids),
        ).model_dump(exclude_unset=True)
        answered = await self.answer(Endpoint.COMPLETIONS, response, request, max_tokens=body.get("max_tokens"))
        record.outcome = "done" if answered is response else "faulted"  # a fault's fate is in fault_log
        return answered

    async def chat_completion(self, body: Body, request: Request) -> Any:
        backend, tok = self.backend, self.tok
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages and all(_is_message(m) for m in messages)):
            return error("messages must be a non-empty list of {'role': str, 'content': ...} objects")
        prompt = tok.encode(tok.render(messages, True, _tools(body)))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        try:
            max_tokens = backend.fit_context(len(prompt), body.get(name), name)
        except ContextRefused as exc:
            return error(str(exc), param=exc.param)
        record = RequestRecord(
            prompt=prompt, params={k: v for k, v in body.items() if k != "messages"}, messages=messages
        )
        reply = await self.scripted_reply(record, request)
        if not isinstance(reply, ScriptedReply):
            return reply
        ids, _, finish = backend.materialize(reply, max_tokens)
        text = tok.decode([i for i in ids if i != tok.eos_id])
        choice = ChatCompletionResponseChoice.model_construct(
            index=0,
            message=ChatMessage.model_construct(role="assistant", content=text),
            finish_reason=finish,
            logprobs=None,
        )
        response = ChatCompletionResponse.model_construct(
            id=f"chatcmpl-{len(backend.requests)}",
            object="chat.completion",
            created=int(time.time()),
            model=MODEL_NAME,
            choices=[choice],
            usage=_usage(record.prompt, ids),
        ).model_dump(exclude_unset=True)
        answered = await self.answer(Endpoint.COMPLETIONS, response, request, max_tokens=body.get(name))
        record.outcome = "done" if answered is response else "faulted"
        return answered


def _tools(body: Body) -> list[dict[str, Any]] | None:
    """A request's `tools` as vLLM hands them to the chat template (None without any)."""
    tools = body.get("tools")
    return [vllm_tool(t) for t in tools] if isinstance(tools, list) and tools else None


def _is_message(message: Any) -> bool:
    return isinstance(message, dict) and isinstance(message.get("role"), str)
