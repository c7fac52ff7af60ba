"""The part of vLLM's protocol prorl-server relies on, against both real engines: the dev engine and vLLM.

Every test runs once per engine (`engine` fixture), so a behaviour where the dev engine differs from vLLM,
the reference, fails here. Generations are kept short: vLLM runs at about 15 tokens/s per stream here.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import httpx
import pytest
from polling import wait_for

pytest_plugins = ("engine_fixtures",)

MODEL = "SmolLM2-135M-Instruct"  # both engines serve it under this name
MAX_MODEL_LEN = 4096  # both engines' context length in engine_fixtures

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a fruit."},
]
IM_START, IM_END = 1, 2  # SmolLM2's <|im_start|> and <|im_end|> (its end-of-sequence id)
ERROR_KEYS = {"message", "type", "param", "code"}


def post(engine, path: str, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{engine.url}{path}", json=body, timeout=timeout, trust_env=False)


def tokenize_chat(engine, messages: list[dict[str, Any]] = MESSAGES) -> list[int]:
    answer = post(engine, "/tokenize", {"model": MODEL, "messages": messages, "add_generation_prompt": True})
    assert answer.status_code == 200, answer.text
    return answer.json()["tokens"]


def tokenize_text(engine, text: str) -> list[int]:
    answer = post(engine, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert answer.status_code == 200, answer.text
    return answer.json()["tokens"]


def complete(engine, **body: Any) -> dict[str, Any]:
    answer = post(engine, "/v1/completions", {"model": MODEL, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_error(answer: httpx.Response, status: int, param: str | None = None) -> str:
    """vLLM's error shape with `code` = the HTTP status; returns the message."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["code"] == status and isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error["message"]


def test_models_report_the_context_length_and_health_answers(engine):
    assert (engine.model, engine.max_model_len) == (MODEL, MAX_MODEL_LEN)
    models = httpx.get(f"{engine.url}/v1/models", timeout=10, trust_env=False).json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL and card["object"] == "model"
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert httpx.get(f"{engine.url}/health", timeout=10, trust_env=False).status_code == 200


def test_tokenize_messages_renders_the_chat_template(engine):
    answer = post(engine, "/tokenize", {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True}).json()
    assert answer["count"] == len(answer["tokens"])
    assert answer["max_model_len"] == MAX_MODEL_LEN
    tokens = answer["tokens"]
    assert tokens[0] == IM_START
    # ChatML: the generation prompt is "<|im_start|>assistant\n" at the end
    assert tokens[-len(tokenize_text(engine, "assistant\n")) - 1] == IM_START
    without = post(engine, "/tokenize", {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False})
    assert tokens[: without.json()["count"]] == without.json()["tokens"]


def test_a_token_id_prompt_returns_the_sampled_ids_and_their_logprobs(engine):
    prompt = tokenize_chat(engine)
    body = complete(engine, prompt=prompt, max_tokens=8, temperature=1.0, seed=3, logprobs=0, return_token_ids=True)
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert choice["prompt_token_ids"] == prompt
    ids, block = choice["token_ids"], choice["logprobs"]
    assert 1 <= len(ids) <= 8
    assert len(block["token_logprobs"]) == len(block["tokens"]) == len(ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in block["token_logprobs"])
    assert all(len(top) == 1 for top in block["top_logprobs"])  # logprobs: 0 -> the sampled token only
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), len(ids))
    assert usage["total_tokens"] == len(prompt) + len(ids)


def test_a_stop_token_is_returned_in_the_ids_and_named_as_the_stop_reason(engine):
    prompt = tokenize_chat(engine)
    first = complete(engine, prompt=prompt, max_tokens=4, temperature=0, return_token_ids=True)["choices"][0]
    stop_id = first["token_ids"][2]  # greedy: the same third token again
    choice = complete(
        engine, prompt=prompt, max_tokens=16, temperature=0, return_token_ids=True, stop_token_ids=[stop_id]
    )["choices"][0]
    assert choice["token_ids"] == first["token_ids"][:3]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id


def test_tokens_can_be_named_by_id_in_logprobs(engine):
    prompt = tokenize_chat(engine)
    choice = complete(
        engine, prompt=prompt, max_tokens=4, logprobs=2, return_token_ids=True, return_tokens_as_token_ids=True
    )["choices"][0]
    block = choice["logprobs"]
    assert block["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    for sampled, top in zip(block["tokens"], block["top_logprobs"], strict=True):
        assert sampled in top and 2 <= len(top) <= 3 and all(k.startswith("token_id:") for k in top)


def test_detokenize_keeps_special_tokens_and_inverts_tokenize(engine):
    prompt = tokenize_chat(engine)
    text = post(engine, "/detokenize", {"model": MODEL, "tokens": prompt}).json()["prompt"]
    assert text.startswith("<|im_start|>system\nYou are a terse assistant.<|im_end|>")
    assert (
        post(engine, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False}).json()["tokens"]
        == prompt
    )


def test_an_unknown_model_is_a_404(engine):
    assert_error(post(engine, "/v1/completions", {"model": "no-such-model", "prompt": "hi"}), 404, "model")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "logprobs": 50}, "logprobs"),
        ({"prompt": "hi", "cache_salt": ""}, "cache_salt"),
        ({"prompt": [99_999_999]}, None),
        ({"prompt": "hi", "temperature": "hot"}, None),
        ({"prompt": [1, 2, "x"]}, None),
    ],
)
def test_bad_requests_are_400_in_vllms_shape(engine, body, param):
    assert_error(post(engine, "/v1/completions", {"model": MODEL, **body}), 400, param)


def test_a_prompt_longer_than_the_context_is_a_400_naming_the_limit(engine):
    message = assert_error(
        post(engine, "/v1/completions", {"model": MODEL, "prompt": [42] * (MAX_MODEL_LEN + 1), "max_tokens": 4}),
        400,
        "input_tokens",
    )
    assert "maximum context length" in message


def test_max_tokens_beyond_the_room_left_is_cut_to_it(engine):
    room = 3
    body = complete(engine, prompt=[42] * (MAX_MODEL_LEN - room), max_tokens=50, ignore_eos=True, return_token_ids=True)
    assert len(body["choices"][0]["token_ids"]) == room
    assert body["choices"][0]["finish_reason"] == "length"


def test_queued_requests_run_lower_priority_value_first(engine):
    """Fill every slot with long requests, queue a priority-10 request then a priority-(-10) one, then free
    one slot (its client goes away): the later but more urgent request takes it and finishes first."""
    prompt = tokenize_chat(engine)
    finished: list[str] = []
    blockers: list[asyncio.Future[None]] = []
    engine.wait_idle()  # the counts below assume these are the only requests

    async def one(http: httpx.AsyncClient, name: str, max_tokens: int, priority: int) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
        answer = await http.post(f"{engine.url}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        finished.append(name)

    def counts(running: int, waiting: int) -> bool:
        # a blocker that ended (an error, or done early) would free its slot and void the scenario: say so
        ended = [b for b in blockers if b.done()]
        assert not ended, f"a blocker ended before its slot was freed: {ended[0].exception()!r}"
        return (engine.running(), engine.waiting()) == (running, waiting)

    def state() -> str:
        return f"(now running {engine.running()}, waiting {engine.waiting()})"

    async def settled(running: int, waiting: int, what: str) -> None:
        # generous: on a loaded 2-core machine vLLM's API process can be slow to hand a request to its core
        try:
            await asyncio.to_thread(wait_for, lambda: counts(running, waiting), 120, what)
        except AssertionError as failure:
            raise AssertionError(f"{failure} {state()}") from None

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=300, trust_env=False) as http:
            blockers.extend(asyncio.ensure_future(one(http, "blocker", 2000, 0)) for _ in range(engine.concurrency))
            await settled(engine.concurrency, 0, "slots busy")
            low = asyncio.ensure_future(one(http, "low", 4, 10))
            await settled(engine.concurrency, 1, "low queued")
            high = asyncio.ensure_future(one(http, "high", 4, -10))
            await settled(engine.concurrency, 2, "high queued")
            blockers[0].cancel()  # one slot frees up
            await asyncio.wait_for(high, 120)
            assert finished == ["high"]  # low still waits: the other slots hold their long requests
            for blocker in blockers[1:]:
                blocker.cancel()
            await asyncio.wait_for(low, 120)

    asyncio.run(scenario())
    assert finished == ["high", "low"]


def test_cache_salt_separates_prefix_reuse(engine):
    """The same long prompt reuses cached blocks only under the same salt."""
    text = " ".join(f"{uuid.uuid4().hex} is item {i}." for i in range(40))  # ~700 tokens, never seen before
    prompt = tokenize_text(engine, text)

    def hits_of(salt: str) -> float:
        before = engine.metrics()["vllm:prefix_cache_hits_total"]
        complete(engine, prompt=prompt, max_tokens=1, cache_salt=salt)
        return engine.metrics()["vllm:prefix_cache_hits_total"] - before

    assert hits_of("tenant-a") == 0
    assert hits_of("tenant-b") == 0  # same tokens, other salt: nothing reused
    assert hits_of("tenant-a") >= len(prompt) // 2  # same salt: most of the prompt reused


def test_a_client_that_disconnects_aborts_its_request(engine):
    prompt = tokenize_chat(engine)
    engine.wait_idle()

    async def scenario() -> float:
        async with httpx.AsyncClient(timeout=300, trust_env=False) as http:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2000, "ignore_eos": True}
            request = asyncio.ensure_future(http.post(f"{engine.url}/v1/completions", json=body))
            # A loaded machine can take a while to schedule the first step; a request that ends early instead
            # (an error answer) is shown rather than waited out.
            await asyncio.to_thread(wait_for, lambda: request.done() or engine.running() == 1, 120, "generating")
            if request.done():
                outcome = request.exception() or request.result().text
                pytest.fail(f"the request ended before it was seen generating: {outcome!r}")
            request.cancel()  # closes the connection
            return await asyncio.to_thread(wait_for, lambda: engine.running() == 0, 5, "aborted")

    assert asyncio.run(scenario()) < 5


def test_both_engines_tokenize_alike_and_sample_the_same_greedy_tokens(dev_engine, vllm_engine):
    """The same model in two builds (llama.cpp Q4_1 and its float32 dequantization in vLLM): the tokenizers
    and chat templates agree exactly; greedy decoding agrees here, with logprobs within a few tenths of a nat
    (the two builds compute the same weights with different arithmetic)."""
    conversation = [*MESSAGES, {"role": "assistant", "content": "An apple."}, {"role": "user", "content": "Why?"}]
    assert tokenize_chat(dev_engine, conversation) == tokenize_chat(vllm_engine, conversation)
    text = "Ünïcödé, emoji 🍎, code `x = [1, 2]`\n\ttabs and  spaces."
    assert tokenize_text(dev_engine, text) == tokenize_text(vllm_engine, text)
    prompt = tokenize_chat(dev_engine)
    answers = [
        complete(e, prompt=prompt, max_tokens=6, temperature=0, logprobs=0, return_token_ids=True)["choices"][0]
        for e in (dev_engine, vllm_engine)
    ]
    assert answers[0]["token_ids"] == answers[1]["token_ids"]
    for a, b in zip(answers[0]["logprobs"]["token_logprobs"], answers[1]["logprobs"]["token_logprobs"], strict=True):
        assert abs(a - b) < 0.3
