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

from prorl_server.devllm import DevEngine, DevLLMSettings, create_app
from prorl_server.devllm.engine import SlotScheduler
from prorl_server.llm.errors import BackendRequestError
from prorl_server.llm.vllm_client import VLLMClient
from prorl_server.testing.uvicorn_thread import UvicornThread, free_port

N_CTX = 1024
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
    ("payload", "param"),
    [
        ({"prompt": [[1, 2]]}, "prompt"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "n": 2}, "n"),
        ({"prompt": "hi", "stream": True}, "stream"),
        ({"prompt": [1, 2, 10**9]}, "prompt"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_bad_requests_get_400_in_vllm_error_shape(dev, payload, param):
    error = dev.complete(expect=400, **payload)["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    assert error["param"] == param


def test_unknown_model_is_404_and_other_bad_requests_are_400(dev):
    error = dev.complete(expect=404, model="gpt-17", prompt="hi")["error"]
    assert error == {
        "message": "The model `gpt-17` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert dev.http.post("/tokenize", json={"nothing": 1}).status_code == 400
    not_json = dev.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "BadRequestError"
    assert dev.http.post("/tokenize", json={"messages": [{"content": "no role"}]}).json()["error"]["code"] == 400
    assert dev.http.post("/detokenize", json={"tokens": [-1]}).json()["error"]["code"] == 400


def test_too_long_prompt_is_400_naming_the_context_length(dev):
    error = dev.complete(expect=400, prompt=[42] * (N_CTX - 4), max_tokens=10)["error"]
    assert f"maximum context length is {N_CTX} tokens" in error["message"]
    assert error["type"] == "BadRequestError"


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

    def __init__(self, cached: list[int]) -> None:
        self.cached, self.busy, self.last_used = cached, False, -1

    def cached_prefix(self, prompt: list[int]) -> int:
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
            await client.complete(address, MODEL, [42] * N_CTX, {"max_tokens": 4})
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
