"""The OpenAI gateway on both real engines (the dev engine and vLLM, SmolLM2-135M, ChatML), driven by the
official `openai` client, sync and async, streamed and not, with tools: every turn the session records is
exactly what the engine sampled (ids and logprobs, as the engine's own record says), on the prompt the
chat template gives the conversation."""

from __future__ import annotations

import asyncio

import httpx
import openai

pytest_plugins = ("engine_fixtures",)

SAMPLING = {"temperature": 0.0, "max_tokens": 12}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }
]


def test_openai_clients_multi_turn_with_tools_are_recorded_token_exact(engine, start_server):
    engine.wait_idle()
    server = start_server([engine.address])
    session = server.http.post("/sessions", json={"sampling_params": SAMPLING}).raise_for_status().json()
    assert session["model"] == engine.model
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=300)
    messages: list = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fruit."}]
    first = client.chat.completions.create(model=engine.model, messages=messages, tools=TOOLS)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "And a colour?"}]
    stream = client.chat.completions.create(model=engine.model, messages=messages, tools=TOOLS, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    messages += [{"role": "assistant", "content": streamed}, {"role": "user", "content": "Thanks."}]

    async def last_turn() -> str | None:
        async_client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        try:
            answer = await async_client.chat.completions.create(model=engine.model, messages=messages, tools=TOOLS)
        finally:
            await async_client.close()
        return answer.choices[0].message.content

    third = asyncio.run(last_turn())
    record = server.http.delete(f"/sessions/{session['session_id']}").raise_for_status().json()
    assert record["rewrites"] == 0 and record["calls"] == 3
    [segment] = record["segments"]
    engine.assert_turns_are_its_own(segment)
    assert [t["text"] for t in segment["turns"]][1:] == [streamed, third]
    # the prompt is the engine's chat template of the first messages with the tools
    rendered = httpx.post(
        f"{engine.url}/tokenize",
        json={
            "model": engine.model,
            "messages": messages[:2],
            "tools": TOOLS,
            "add_generation_prompt": True,
            "add_special_tokens": False,
        },
        timeout=60,
    ).json()["tokens"]
    assert segment["prompt_ids"] == rendered


def test_a_rewrite_on_the_engine_starts_a_segment_that_is_token_exact_too(engine, start_server):
    engine.wait_idle()
    server = start_server([engine.address])
    session = server.http.post("/sessions", json={"sampling_params": SAMPLING}).raise_for_status().json()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=300)
    hi = {"role": "user", "content": "Say hi."}
    client.chat.completions.create(model=engine.model, messages=[hi])
    # the reply edited: the same chain, a new segment
    summary = [hi, {"role": "assistant", "content": "(a greeting)"}, {"role": "user", "content": "Say bye."}]
    client.chat.completions.create(model=engine.model, messages=summary)
    record = server.http.delete(f"/sessions/{session['session_id']}").raise_for_status().json()
    assert record["rewrites"] == 1 and len(record["segments"]) == 2
    for segment in record["segments"]:
        engine.assert_turns_are_its_own(segment)
