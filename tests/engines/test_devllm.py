"""The dev engine (prorl_server.devllm): a real SmolLM2-135M on the CPU speaking vLLM's protocol.

One engine with two slots serves every test (in-process uvicorn); generations are kept short.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

pytest.importorskip("llama_cpp", reason="the dev engine needs llama-cpp-python: pip install 'prorl-server[devllm]'")

from llama_cpp import Llama
from prometheus_client import REGISTRY

from prorl_server.devllm import DevEngine, DevLLMSettings, create_app
from prorl_server.devllm.engine import SlotScheduler
from prorl_server.devllm.metrics import engine_registry
from prorl_server.llm.errors import BackendRequestError
from prorl_server.llm.vllm_client import VLLMClient
from prorl_server.testing.uvicorn_thread import UvicornThread, free_port

N_CTX = 1024
N_VOCAB = 49152  # SmolLM2's
IM_END = 2  # SmolLM2's <|im_end|>, its end-of-sequence id
MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a fruit."},
]


class DevServer:
    """The running engine and an HTTP client on it."""

    def __init__(self, engine: DevEngine, server: UvicornThread) -> None:
        self.engine = engine
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=60)

    def complete(self, expect: int = 200, **payload: Any) -> dict[str, Any]:
        response = self.http.post("/v1/completions", json=payload)
        assert response.status_code == expect, response.text
        return response.json()

    def tokenize_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        body = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        return self.http.post("/tokenize", json=body).json()["tokens"]

    def record(self, response_id: str) -> dict[str, Any]:
        records = self.http.get("/debug/sampled").json()
        return next(r for r in records if r["request_id"] == response_id)


@pytest.fixture(scope="module")
def dev() -> Iterator[DevServer]:
    engine = DevEngine(DevLLMSettings(slots=2, n_ctx=N_CTX, debug_sampled=200))
    server = UvicornThread(create_app(engine)).start()
    client = DevServer(engine, server)
    yield client
    client.http.close()
    server.stop()
    engine.close()


def wait_until_free(engine: DevEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(slot.busy for slot in engine.slots):
        assert time.monotonic() < deadline, "a slot stayed busy"
        time.sleep(0.01)


def wait_until_busy(engine: DevEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(slot.busy for slot in engine.slots):
        assert time.monotonic() < deadline, "no request started"
        time.sleep(0.005)


def test_models_and_health(dev):
    models = dev.http.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == N_CTX
    assert dev.http.get("/health").status_code == 200


def test_token_id_prompt_returns_ids_and_sampled_logprobs(dev):
    prompt = dev.tokenize_chat(MESSAGES)
    body = dev.complete(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0.8, seed=7, logprobs=0, return_token_ids=True
    )
    choice = body["choices"][0]
    assert body["object"] == "text_completion"
    assert choice["prompt_token_ids"] == prompt
    ids, block = choice["token_ids"], choice["logprobs"]
    assert 1 <= len(ids) <= 8
    assert len(block["token_logprobs"]) == len(block["tokens"]) == len(block["text_offset"]) == len(ids)
    assert all(len(top) == 1 for top in block["top_logprobs"])  # logprobs: 0 -> the sampled token only
    assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }
    record = dev.record(body["id"])
    assert record["output_ids"] == ids
    assert record["logprobs"] == block["token_logprobs"]
    assert record["prompt_ids"] == prompt


def test_reported_logprobs_equal_a_fresh_rescoring(dev):
    """Replay the engine's schedule (prompt in one batch, then one token at a time) on a fresh context.

    llama.cpp's CPU kernels depend on the batch size, so a single-batch pass over prompt + output
    differs from token-by-token decoding by up to ~0.2 nats: the replay must decode token by token.
    """
    body = dev.complete(
        prompt="Xylophone rescoring check: name a color.",
        max_tokens=6,
        temperature=1.0,
        seed=3,
        logprobs=0,
        return_token_ids=True,
    )
    choice = body["choices"][0]
    prompt, ids, reported = choice["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert dev.record(body["id"])["reused_prefix"] == 0  # the prompt was evaluated in one batch
    scorer = Llama(model_path=str(dev.engine.model_path), n_ctx=N_CTX, logits_all=True, n_threads=1, verbose=False)
    try:
        scorer.eval(prompt)
        for token in ids[:-1]:
            scorer.eval([token])
        rows = Llama.logits_to_logprobs(scorer.scores[len(prompt) - 1 : len(prompt) - 1 + len(ids)])
    finally:
        scorer.close()
    rescored = [float(row[token]) for row, token in zip(rows, ids, strict=True)]
    assert rescored == pytest.approx(reported, abs=1e-3)


def test_text_prompt_and_greedy_determinism(dev):
    first = dev.complete(prompt="The capital of France is", max_tokens=5, temperature=0, return_token_ids=True)
    second = dev.complete(prompt="The capital of France is", max_tokens=5, temperature=0, return_token_ids=True)
    choice = first["choices"][0]
    assert isinstance(choice["text"], str) and choice["text"]
    assert (
        choice["prompt_token_ids"]
        == dev.http.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    )
    assert choice["logprobs"] is None  # not requested
    assert second["choices"][0]["token_ids"] == choice["token_ids"]


def test_seed_makes_sampling_reproducible(dev):
    payload = {
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 1234,
        "return_token_ids": True,
    }
    runs = [dev.complete(**payload)["choices"][0]["token_ids"] for _ in range(2)]
    assert runs[0] == runs[1]


def test_stop_token_ids_and_stop_strings(dev):
    base = {"prompt": "List three colors:", "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    full = dev.complete(max_tokens=8, **base)["choices"][0]
    ids, text = full["token_ids"], full["text"]
    assert full["finish_reason"] == "length" and len(ids) == 8

    by_id = dev.complete(max_tokens=8, stop_token_ids=[ids[2]], **base)["choices"][0]
    assert by_id["token_ids"] == ids[: ids.index(ids[2]) + 1]
    assert by_id["finish_reason"] == "stop" and by_id["stop_reason"] == ids[2]

    stop = text.strip()[:3]
    by_text = dev.complete(max_tokens=8, stop=[stop], **base)["choices"][0]
    assert by_text["finish_reason"] == "stop" and by_text["stop_reason"] == stop
    assert by_text["text"] == text[: text.index(stop)]
    assert by_text["token_ids"] == ids[: len(by_text["token_ids"])]


def test_top_logprobs_and_token_id_strings(dev):
    choice = dev.complete(
        prompt="Hello", max_tokens=4, temperature=0, logprobs=3, return_tokens_as_token_ids=True, return_token_ids=True
    )["choices"][0]
    ids, block = choice["token_ids"], choice["logprobs"]
    assert block["tokens"] == [f"token_id:{i}" for i in ids]
    offsets = [sum(len(t) for t in block["tokens"][:i]) for i in range(len(ids))]
    assert block["text_offset"] == offsets
    for token, logprob, top in zip(block["tokens"], block["token_logprobs"], block["top_logprobs"], strict=True):
        assert token in top and top[token] == logprob
        assert len(top) <= 4 and all(k.startswith("token_id:") for k in top)
        assert logprob == pytest.approx(max(top.values()))  # greedy: the sampled token is the most likely


def test_chat_completion(dev):
    body = dev.http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
            "return_token_ids": True,
        },
    ).json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert body["prompt_token_ids"] == dev.tokenize_chat(MESSAGES)
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(len(entry["top_logprobs"]) == 2 for entry in choice["logprobs"]["content"])


def test_tokenize_messages_equals_tokenizing_the_rendered_template(dev):
    template = dev.engine.chat_template.template
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for add in (True, False):
        text = env.from_string(template).render(
            messages=MESSAGES, add_generation_prompt=add, bos_token="", eos_token=""
        )
        by_text = dev.http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        assert dev.tokenize_chat(MESSAGES, add_generation_prompt=add) == by_text["tokens"]
    assert text.startswith("<|im_start|>system\n")
    with_prompt = dev.tokenize_chat(MESSAGES)
    without = dev.tokenize_chat(MESSAGES, add_generation_prompt=False)
    assert with_prompt[: len(without)] == without
    assert dev.http.post("/detokenize", json={"tokens": with_prompt[len(without) :]}).json()["prompt"] == (
        "<|im_start|>assistant\n"
    )


def test_detokenize_round_trip(dev):
    text = "<|im_start|>user\nHéllo, wörld! 12345 ✓<|im_end|>\n"
    tokens = dev.http.post("/tokenize", json={"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    body = tokens.json()
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) and body["max_model_len"] == N_CTX
    assert body["token_strs"][0] == "<|im_start|>"  # special tokens written in the text are single tokens
    assert dev.http.post("/detokenize", json={"tokens": body["tokens"]}).json() == {"prompt": text}


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        (
            {"max_tokens": 3},
            "prompt",
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        ),
        ({"prompt": ""}, "prompt", "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"),
        ({"prompt": []}, None, "You must pass at least one prompt"),
        ({"prompt": [[]]}, None, "The decoder prompt cannot be empty"),
        (
            {"prompt": "hi", "cache_salt": ""},
            "cache_salt",
            "Parameter 'cache_salt' must be a non-empty string if provided.",
        ),
        (
            {"prompt": "hi", "cache_salt": 7},
            "cache_salt",
            "Parameter 'cache_salt' must be a non-empty string if provided.",
        ),
        ({"prompt": "hi", "temperature": -1}, "temperature", "temperature must be non-negative, got -1.0."),
        ({"prompt": "hi", "top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
        ({"prompt": "hi", "top_k": -2}, None, "top_k must be 0 (disable), or at least 1, got -2."),
        ({"prompt": "hi", "min_p": 2}, None, "min_p must be in [0, 1], got 2.0."),
        (
            {"prompt": "hi", "max_tokens": 0},
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        ({"prompt": "hi", "max_tokens": -1}, "max_tokens", "max_tokens must be at least 1, got -1."),
        (
            {"prompt": "hi", "logprobs": 21},
            "logprobs",
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
        ),
        ({"prompt": "hi", "logprobs": -1}, "logprobs", f"Requested sample logprobs of {N_VOCAB}, which is greater"),
        ({"prompt": "hi", "stop": [""]}, None, "stop cannot contain an empty string."),
        ({"prompt": "hi", "stop_token_ids": [5, 10**8]}, "stop_token_ids", "token_id(s) [100000000] in stop_token_ids"),
        ({"prompt": "hi", "n": 0}, None, "n must be at least 1, got 0."),
        ({"prompt": [1, 2, 10**9]}, None, "Token id 1000000000 is out of vocabulary"),
        ({"prompt": [5, 10**8, 10**9, 7]}, None, "Token id 1000000000 is out of vocabulary"),  # the highest, as vLLM
        # what the dev engine does not do: refused, never silently dropped
        ({"prompt": "hi", "n": 2}, "n", "one choice per request"),
        ({"prompt": "hi", "stream": True}, "stream", "does not stream"),
        ({"prompt": "hi", "echo": True}, "echo", "does not echo"),
        ({"prompt": [[1, 2], [3, 4]]}, "prompt", "one prompt per request"),
    ],
)
def test_bad_requests_get_vllms_400(dev, payload, param, message):
    error = dev.complete(expect=400, **payload)["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param
    assert message in error["message"], error["message"]


def test_checks_answer_in_vllms_order(dev):
    """When several things are wrong, vLLM's first failing stage answers: the request, the context, the
    sampling parameters, then the prompt's ids."""
    cases = [
        ({"prompt": "", "cache_salt": ""}, "prompt"),
        ({"prompt": [10**8], "max_tokens": 2, "cache_salt": ""}, "cache_salt"),
        ({"prompt": "hi", "max_tokens": 10**5, "temperature": -1}, "max_tokens"),
        ({"prompt": [42] * (N_CTX + 5), "max_tokens": 0}, "input_tokens"),
        ({"prompt": [10**8] * (N_CTX + 5), "max_tokens": 5}, "input_tokens"),
        ({"prompt": "hi", "max_tokens": 0, "temperature": -1}, "temperature"),
        ({"prompt": [10**8], "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "logprobs": 21, "stop_token_ids": [10**8]}, "logprobs"),
        ({"prompt": [10**8], "stop_token_ids": [10**8]}, "stop_token_ids"),
    ]
    for payload, param in cases:
        assert dev.complete(expect=400, **payload)["error"]["param"] == param, payload


@pytest.mark.parametrize(
    ("payload", "param", "first_error"),
    [
        (
            {"prompt": "hi", "temperature": "hot"},
            "body.temperature",
            "{'type': 'float_parsing', 'loc': 'body.temperature', 'msg': 'Input should be a valid number, "
            "unable to parse string as a number', 'input': 'hot'}",
        ),
        (
            {"prompt": "hi", "seed": 2**70},
            "body.seed",
            "{'type': 'less_than_equal', 'loc': 'body.seed', 'msg': 'Input should be less than or equal to "
            f"9223372036854775807', 'input': '{2**70}', 'ctx': {{'le': 9223372036854775807}}}}",
        ),
        (
            {"prompt": [5, -1]},
            "body.prompt.1",
            "{'type': 'greater_than_equal', 'loc': 'body.prompt.1', 'msg': 'Input should be greater than or "
            "equal to 0', 'input': '-1', 'ctx': {'ge': 0}}",
        ),
        (
            {"prompt": "hi", "priority": "x"},
            "body.priority",
            "{'type': 'int_parsing', 'loc': 'body.priority', 'msg': 'Input should be a valid integer, unable "
            "to parse string as an integer', 'input': 'x'}",
        ),
    ],
)
def test_wrong_types_get_vllms_pydantic_400(dev, payload, param, first_error):
    error = dev.complete(expect=400, **payload)["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", param, 400)
    lines = error["message"].split("\n")
    assert lines[0] in ("1 validation error:", f"{len(lines) - 1} validation errors:")
    assert lines[1] == f"  {first_error}"


def test_other_endpoints_refuse_in_vllms_shape(dev):
    error = dev.complete(expect=404, model="gpt-17", prompt="hi")["error"]
    assert error == {
        "message": "The model `gpt-17` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    not_json = dev.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    assert (not_json.json()["error"]["type"], not_json.json()["error"]["param"]) == ("Bad Request", "body.1")
    tokenize = dev.http.post("/tokenize", json={"nothing": 1}).json()["error"]
    assert tokenize["param"] == "body.prompt" and "'loc': 'body.messages'" in tokenize["message"]
    assert dev.http.post("/tokenize", json={"messages": [{"content": "no role"}]}).json()["error"]["code"] == 400
    negative = dev.http.post("/detokenize", json={"tokens": [-1]}).json()["error"]
    assert (negative["type"], negative["param"]) == ("Bad Request", "body.tokens.0")
    # vLLM's tokenizer skips ids it does not know
    assert dev.http.post("/detokenize", json={"tokens": [28, 10**8, 29]}).json() == {"prompt": ",-"}
    chat = dev.http.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2}).json()["error"]
    assert chat["message"] == "Cannot apply chat template to an empty conversation. Provide at least one message."
    assert chat["param"] is None


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
        ({"max_completion_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
        ({"max_tokens": N_CTX + 1}, "max_tokens", f"max_tokens={N_CTX + 1} cannot be greater than max_model_len"),
        (
            {"max_completion_tokens": N_CTX + 1},
            "max_completion_tokens",
            f"max_completion_tokens={N_CTX + 1} cannot be greater than max_model_len={N_CTX}.",
        ),
        ({"top_logprobs": 2}, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."),
        ({"top_logprobs": -2, "logprobs": True}, "top_logprobs", "`top_logprobs` must be a positive value or -1."),
        ({"top_logprobs": 21, "logprobs": True}, "logprobs", "Requested sample logprobs of 21"),
        ({"cache_salt": ""}, "cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided."),
    ],
)
def test_bad_chat_requests_get_vllms_400(dev, payload, param, message):
    response = dev.http.post("/v1/chat/completions", json={"messages": MESSAGES, **payload})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert message in error["message"], error["message"]


def test_context_length_as_vllm(dev):
    """max_tokens beyond the context and a prompt beyond it are 400s; a prompt filling it leaves max_tokens 0
    (a 400 on max_tokens); otherwise max_tokens is cut to the room left and the request ends with "length"."""
    error = dev.complete(expect=400, prompt="hi", max_tokens=N_CTX + 1)["error"]
    assert error["message"] == (
        f"max_tokens={N_CTX + 1} cannot be greater than max_model_len={N_CTX}. Please request fewer output "
        f"tokens. (parameter=max_tokens, value={N_CTX + 1})"
    )
    error = dev.complete(expect=400, prompt=[42] * (N_CTX + 5), max_tokens=4)["error"]
    assert (error["param"], error["message"]) == (
        "input_tokens",
        f"This model's maximum context length is {N_CTX} tokens. However, your prompt contains {N_CTX + 5} input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        f"prompt. (parameter=input_tokens, value={N_CTX + 5})",
    )
    # a text prompt is tokenized one token past the limit: "at least N+1", as vLLM says it
    error = dev.complete(expect=400, prompt="hi " * (N_CTX + 50), max_tokens=4)["error"]
    assert f"your prompt contains at least {N_CTX + 1} input tokens" in error["message"]
    assert error["param"] == "input_tokens"
    for payload in ({"max_tokens": 5}, {}):
        error = dev.complete(expect=400, prompt=[42] * N_CTX, **payload)["error"]
        assert (error["param"], error["message"]) == (
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        )
    for room, max_tokens in ((3, 50), (1, 5), (4, None)):
        payload = {"max_tokens": max_tokens} if max_tokens else {}  # the default, 16, is cut too
        choice = dev.complete(
            prompt=[42] * (N_CTX - room), ignore_eos=True, return_token_ids=True, temperature=0, **payload
        )["choices"][0]
        assert (len(choice["token_ids"]), choice["finish_reason"]) == (room, "length")


def test_chat_max_tokens_defaults_to_the_room_left(dev):
    content = "hi " * (N_CTX - 40)
    messages = [{"role": "user", "content": content}]
    room = N_CTX - len(dev.tokenize_chat(messages))
    assert 0 < room < 40
    body = dev.http.post(
        "/v1/chat/completions", json={"messages": messages, "ignore_eos": True, "temperature": 0}
    ).json()
    assert body["usage"]["completion_tokens"] == room and body["choices"][0]["finish_reason"] == "length"
    over = dev.http.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": room + 20})
    assert over.status_code == 200 and over.json()["usage"]["completion_tokens"] <= room


def test_a_batch_of_one_prompt_is_that_prompt(dev):
    ids = dev.http.post("/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    plain = dev.complete(prompt=ids, max_tokens=3, temperature=0, return_token_ids=True)["choices"][0]
    for prompt in ([ids], ["Hello there"]):
        choice = dev.complete(prompt=prompt, max_tokens=3, temperature=0, return_token_ids=True)["choices"][0]
        assert choice["prompt_token_ids"] == ids and choice["token_ids"] == plain["token_ids"]


def test_eos_ends_with_stop_and_is_in_the_ids(dev):
    """As vLLM: the EOS id is the last of `token_ids`, the text leaves it out, `stop_reason` is null."""
    prompt = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\nYes."
    choice = dev.complete(prompt=prompt, max_tokens=10, temperature=0, return_token_ids=True, logprobs=0)["choices"][0]
    assert choice["token_ids"][-1] == IM_END and choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert "<|im_end|>" not in choice["text"] and choice["logprobs"]["tokens"][-1] == "<|im_end|>"
    ignored = dev.complete(prompt=prompt, max_tokens=3, temperature=0, return_token_ids=True, ignore_eos=True)
    assert ignored["choices"][0]["finish_reason"] == "length" and len(ignored["choices"][0]["token_ids"]) == 3


def test_two_slots_generate_concurrently(dev):
    wait_until_free(dev.engine)
    long_result: dict[str, Any] = {}

    def long_request() -> None:
        payload = {"prompt": "Count: one, two,", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        long_result.update(httpx.post(f"{dev.url}/v1/completions", json=payload, timeout=60).json())

    worker = threading.Thread(target=long_request)
    worker.start()
    wait_until_busy(dev.engine)
    short = dev.complete(prompt="Say yes.", max_tokens=2, temperature=0, ignore_eos=True)
    assert worker.is_alive(), "the short request waited for the long one"
    worker.join()
    slots = {dev.record(short["id"])["slot"], dev.record(long_result["id"])["slot"]}
    assert slots == {0, 1}


class FakeSlot:
    """What SlotScheduler reads of a slot."""

    def __init__(self, cached: list[int], salt: str | None = None) -> None:
        self.cached, self.salt, self.busy, self.last_used = cached, salt, False, -1

    def reusable_prefix(self, prompt: list[int], salt: str | None) -> int:
        if salt != self.salt:
            return 0
        return next(
            (i for i, (a, b) in enumerate(zip(self.cached, prompt, strict=False)) if a != b),
            min(len(self.cached), len(prompt)),
        )


async def test_scheduler_prefers_cached_prefix_then_lru_and_queues_by_priority():
    a, b = FakeSlot([1, 2, 3]), FakeSlot([7, 8])
    scheduler = SlotScheduler([a, b])
    assert await scheduler.acquire([7, 8, 9], priority=0) is b  # longest cached prefix
    assert await scheduler.acquire([5], priority=0) is a
    late = asyncio.ensure_future(scheduler.acquire([5], priority=3))
    urgent = asyncio.ensure_future(scheduler.acquire([5], priority=0))
    cancelled = asyncio.ensure_future(scheduler.acquire([5], priority=-1))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    scheduler.release(b)
    assert await urgent is b and not late.done()  # the cancelled waiter was skipped, priority 0 before 3
    scheduler.release(a)
    assert await late is a
    scheduler.release(a)
    scheduler.release(b)
    assert await scheduler.acquire([9], priority=0) is b  # no shared prefix: least recently used


async def test_scheduler_reuses_a_prefix_only_under_the_same_salt():
    salted, plain = FakeSlot([1, 2, 3], salt="tenant-a"), FakeSlot([1, 2])
    scheduler = SlotScheduler([salted, plain])
    for salt, expected in (("tenant-a", salted), (None, plain)):
        slot = await scheduler.acquire([1, 2, 3, 4], priority=0, salt=salt)
        assert slot is expected  # the longest prefix this salt may reuse
        scheduler.release(slot)
    # another salt may reuse nothing: the least recently used slot (`salted`, used first)
    assert await scheduler.acquire([1, 2, 3, 4], priority=0, salt="tenant-b") is salted


def test_cache_salt_keys_prefix_reuse(dev):
    """A slot's cached tokens serve only requests with the salt they were computed under (none is a salt too)."""
    wait_until_free(dev.engine)
    text = "Salted prefix check: " + " ".join(f"item {i} is {i * 7 % 13}." for i in range(20))

    def run(salt: str | None, **extra: Any) -> dict[str, Any]:
        payload = {"prompt": text, "max_tokens": 1, "temperature": 0, **extra}
        if salt is not None:
            payload["cache_salt"] = salt
        return dev.record(dev.complete(**payload)["id"])

    first = run("tenant-a")
    n_prompt = len(first["prompt_ids"])
    assert run("tenant-a")["reused_prefix"] == n_prompt - 1  # all but the last token, which is evaluated
    assert run("tenant-b")["reused_prefix"] == 0  # same tokens, other salt: nothing reused
    assert run(None)["reused_prefix"] == 0  # no salt is its own group
    assert run(None)["reused_prefix"] == n_prompt - 1
    chat = dev.http.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "cache_salt": "tenant-c"}
    ).json()
    again = dev.http.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "cache_salt": "tenant-c"}
    ).json()
    assert dev.record(chat["id"])["reused_prefix"] == 0
    assert dev.record(again["id"])["reused_prefix"] == len(dev.record(again["id"])["prompt_ids"]) - 1


def metrics(dev: DevServer) -> dict[str, float]:
    """`/metrics` samples by name with labels, e.g. `vllm:request_success_total{finished_reason="stop"}`."""
    response = dev.http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_have_vllms_names_and_labels(dev):
    labels = f'engine="0",model_name="{MODEL}"'
    before = metrics(dev)
    for name in ("num_requests_running", "num_requests_waiting"):
        assert f"vllm:{name}{{{labels}}}" in before
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens"):
        assert f"vllm:{name}_total{{{labels}}}" in before
    for reason in ("stop", "length", "abort"):
        assert f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{MODEL}"}}' in before

    wait_until_free(dev.engine)
    prompt = dev.tokenize_chat([{"role": "user", "content": "Metrics check, tell me a story."}])
    first = dev.complete(prompt=prompt, max_tokens=5, ignore_eos=True, return_token_ids=True)
    second = dev.complete(prompt=prompt, max_tokens=5, ignore_eos=True, return_token_ids=True)
    after = metrics(dev)

    def delta(name: str) -> float:
        return after[f"vllm:{name}"] - before[f"vllm:{name}"]

    assert delta(f"prompt_tokens_total{{{labels}}}") == 2 * len(prompt)
    assert delta(f"prefix_cache_queries_total{{{labels}}}") == 2 * len(prompt)
    hits = dev.record(first["id"])["reused_prefix"] + dev.record(second["id"])["reused_prefix"]
    assert delta(f"prefix_cache_hits_total{{{labels}}}") == hits >= len(prompt) - 1
    assert delta(f"generation_tokens_total{{{labels}}}") == 10
    success = f'request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}}'
    assert delta(success) == 2
    assert after[f"vllm:num_requests_running{{{labels}}}"] == 0


def test_metrics_count_running_waiting_and_aborted_requests(dev):
    """Three long requests on two slots: two run, one waits; the clients go away and all three are aborts."""
    wait_until_free(dev.engine)
    labels = f'engine="0",model_name="{MODEL}"'
    abort = f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}}'
    aborted_before = metrics(dev)[abort]
    host, port = dev.url.removeprefix("http://").split(":")
    sockets = []
    try:
        for i in range(3):
            body = f'{{"prompt": "Story {i}:", "max_tokens": 900, "ignore_eos": true}}'.encode()
            sock = socket.create_connection((host, int(port)))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            sockets.append(sock)
        deadline = time.monotonic() + 10
        while True:
            now = metrics(dev)
            if (now[f"vllm:num_requests_running{{{labels}}}"], now[f"vllm:num_requests_waiting{{{labels}}}"]) == (2, 1):
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.02)
    finally:
        for sock in sockets:
            sock.close()
    wait_until_free(dev.engine)
    deadline = time.monotonic() + 5
    while metrics(dev)[abort] < aborted_before + 3:
        assert time.monotonic() < deadline, "the three requests were not counted as aborted"
        time.sleep(0.02)
    final = metrics(dev)
    assert final[abort] == aborted_before + 3
    assert (final[f"vllm:num_requests_running{{{labels}}}"], final[f"vllm:num_requests_waiting{{{labels}}}"]) == (0, 0)


def test_each_app_has_its_own_metrics_registry(dev):
    """The engine's metrics live in the app's registry, not prometheus_client's global one (several engines
    run in one process)."""
    labels = {"engine": "0", "model_name": MODEL}
    assert engine_registry(dev.engine).get_sample_value("vllm:num_requests_waiting", labels) == 0
    assert REGISTRY.get_sample_value("vllm:num_requests_waiting", labels) is None


def test_requests_stick_to_the_slot_holding_their_prefix(dev):
    wait_until_free(dev.engine)
    first = dev.complete(prompt="Zebras live in", max_tokens=3, temperature=0, return_token_ids=True)
    second = dev.complete(prompt="Quantum physics is", max_tokens=3, temperature=0, return_token_ids=True)
    slot_a, slot_b = dev.record(first["id"])["slot"], dev.record(second["id"])["slot"]
    assert slot_a != slot_b  # no shared prefix: the least recently used slot
    for earlier, slot in ((first, slot_a), (second, slot_b)):
        choice = earlier["choices"][0]
        follow_up = choice["prompt_token_ids"] + choice["token_ids"] + [198]
        record = dev.record(dev.complete(prompt=follow_up, max_tokens=2, temperature=0)["id"])
        assert record["slot"] == slot
        assert record["reused_prefix"] >= len(choice["prompt_token_ids"])


def test_client_disconnect_stops_generation_and_frees_the_slot(dev):
    wait_until_free(dev.engine)
    body = b'{"prompt": "Tell me a very long story.", "max_tokens": 500, "ignore_eos": true, "seed": 99}'
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    host, port = dev.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        wait_until_busy(dev.engine)
        time.sleep(0.3)  # a few tokens in
    closed_at = time.monotonic()
    wait_until_free(dev.engine, timeout=5)
    assert time.monotonic() - closed_at < 2.0
    record = dev.http.get("/debug/sampled").json()[-1]
    assert record["seed"] == 99
    assert record["finish_reason"] == "abort" and len(record["output_ids"]) < 500


async def test_vllm_client_works_against_the_dev_engine(dev):
    client = VLLMClient()
    address = f"{dev.url}/v1"
    try:
        assert (await client.served_model(address)).id == MODEL
        prompt = await client.tokenize_messages(address, MODEL, MESSAGES, add_generation_prompt=True)
        assert prompt == dev.tokenize_chat(MESSAGES)
        completion = await client.complete(address, MODEL, prompt, {"max_tokens": 6, "temperature": 0.7, "seed": 5})
        assert 1 <= len(completion.output_ids) == len(completion.logprobs) <= 6
        assert all(lp <= 0 for lp in completion.logprobs)
        assert completion.finish_reason in ("stop", "length")
        text = await client.detokenize(address, MODEL, completion.output_ids)
        assert text.removesuffix("<|im_end|>") == completion.text
        assert await client.healthy(address) == (True, None)
        with pytest.raises(BackendRequestError, match="maximum context length"):
            await client.complete(address, MODEL, [42] * (N_CTX + 1), {"max_tokens": 4})
    finally:
        await client.aclose_current_loop()


def test_cli_dev_llm_prints_ready_line_and_serves():
    port = free_port()
    command = [sys.executable, "-m", "prorl_server.cli", "dev-llm", "--port", str(port), "--n-ctx", "256"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = []
        while not output or "dev-llm ready" not in output[-1]:
            line = process.stdout.readline()
            assert line, f"dev-llm exited before its ready line: {''.join(output)}"
            output.append(line)
        assert f"http://127.0.0.1:{port}/v1" in output[-1]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == MODEL
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    assert process.returncode in (0, -15)  # uvicorn re-raises the SIGTERM it handled
