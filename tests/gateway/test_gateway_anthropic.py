"""Anthropic's Messages API on a gateway session, driven by the official `anthropic` client against the
scripted test double: answers in Anthropic's shape (plain, streamed, with tool use), one token-exact segment
for a multi-turn tool-using conversation, errors in Anthropic's shape, keys, and model names."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from gateway_sessions import close_session, open_session
from repo_paths import DOCS

from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_NAME, ToyChatTokenizer

TOK = ToyChatTokenizer()
TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]
CALL_TEXT = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
EOS = "<|im_end|>"


@pytest.fixture
def server(start_server, strict):
    """A prorl-server with the strict scripted backend registered (conftest's `server` has the lenient one)."""
    return start_server([strict.address])


def anthropic_url(session: dict) -> str:
    """What ANTHROPIC_BASE_URL is: the session's base URL without `/v1` (the client adds `/v1/messages`)."""
    return session["base_url"].removesuffix("/v1")


def client_for(session: dict) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=anthropic_url(session), api_key=session["api_key"], max_retries=0, timeout=60)


def toy_template(messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> list[int]:
    """The toy chat template of `messages` with `tools` (Anthropic's) as vLLM hands them to the template."""
    schemas = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in tools or ()
    ]
    return TOK.encode(TOK.render(messages, add_generation_prompt, schemas or None))


def model_ids(segment: dict) -> list[int]:
    return [t for t, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]


def test_a_plain_message_gets_anthropics_answer_and_the_session_returns_the_sampled_tokens(strict, server):
    strict.double.push("Paris.", ScriptedReply(text="It is big.", logprobs=[-0.5] * 11))
    session = open_session(server)
    client = client_for(session)
    history: list = [{"role": "user", "content": "Capital of France?"}]
    first = client.messages.create(model=MODEL_NAME, max_tokens=64, system="Be brief.", messages=history)
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_")
    assert [(b.type, b.text) for b in first.content] == [("text", "Paris.")]
    assert first.stop_reason == "end_turn" and first.stop_sequence is None
    assert first.usage.output_tokens == len("Paris.") + 1  # the end-of-turn token too
    assert first.usage.input_tokens == len(toy_template([{"role": "system", "content": "Be brief."}, *history], True))
    history += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Is it big?"}]
    second = client.messages.create(model=MODEL_NAME, max_tokens=64, system="Be brief.", messages=history)
    assert second.content[0].text == "It is big."

    record = close_session(server, session)
    assert (record["rewrites"], record["calls"], record["failed_calls"]) == (0, 2, 0)
    [segment] = record["segments"]
    context = segment["prompt_ids"] + segment["response_ids"]
    assert [context[: t["prompt_len"]] for t in segment["turns"]] == [r.prompt for r in strict.double.requests]
    assert segment["turns"][1]["logprobs"] == [-0.5] * 11
    assert strict.double.requests[0].params["max_tokens"] == 64
    openai_form = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Is it big?"},
        {"role": "assistant", "content": "It is big."},
    ]
    assert context + TOK.encode("\n") == toy_template(openai_form, False)


def tool_conversation_check(record: dict, result_texts: list[str]) -> None:
    """One segment, no rewrite, and its model tokens exactly what the double sampled."""
    assert (record["rewrites"], record["calls"], record["failed_calls"]) == (0, 3, 0)
    [segment] = record["segments"]
    assert [t["text"] for t in segment["turns"]] == [CALL_TEXT, CALL_TEXT, "Two files."]
    assert model_ids(segment) == TOK.encode(CALL_TEXT + EOS) * 2 + TOK.encode("Two files." + EOS)
    openai_form = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is here?"}]
    for text in result_texts:
        openai_form += [{"role": "assistant", "content": CALL_TEXT}, {"role": "tool", "content": text}]
    openai_form.append({"role": "assistant", "content": "Two files."})
    context = segment["prompt_ids"] + segment["response_ids"]
    assert context + TOK.encode("\n") == toy_template(openai_form, False, TOOLS)


def test_a_tool_using_conversation_through_the_sdk_is_one_token_exact_segment(strict, server):
    strict.double.push(CALL_TEXT, CALL_TEXT, "Two files.")
    session = open_session(server)
    client = client_for(session)
    messages: list = [{"role": "user", "content": [{"type": "text", "text": "What is here?"}]}]
    ask = {"model": MODEL_NAME, "max_tokens": 256, "system": [{"type": "text", "text": "Use tools."}], "tools": TOOLS}
    reply = client.messages.create(messages=messages, **ask)
    assert reply.stop_reason == "tool_use"
    text, use = reply.content
    assert (text.type, text.text) == ("text", "Let me look.")
    assert (use.type, use.name, use.input) == ("tool_use", "bash", {"command": "ls"})
    # the harness sends back the content it got, as the SDK's objects
    messages += [
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]},
    ]
    again = client.messages.create(messages=messages, **ask)
    [_, use2] = again.content
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in again.content]},  # or as dicts
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use2.id, "content": [{"type": "text", "text": "b.txt"}]}
            ],
        },
    ]
    last = client.messages.create(messages=messages, **ask)
    assert [(b.type, b.text) for b in last.content] == [("text", "Two files.")] and last.stop_reason == "end_turn"
    tool_conversation_check(close_session(server, session), ["a.txt", "b.txt"])


async def test_async_client_streams_text_and_tool_use_and_the_conversation_stays_one_segment(strict, server):
    strict.double.push(CALL_TEXT, CALL_TEXT, "Two files.")
    session = open_session(server)
    client = anthropic.AsyncAnthropic(base_url=anthropic_url(session), api_key=session["api_key"], max_retries=0)
    ask = {
        "model": MODEL_NAME,
        "max_tokens": 256,
        "system": "Use tools.",
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},
    }
    try:
        messages: list = [{"role": "user", "content": "What is here?"}]
        async with client.messages.stream(messages=messages, **ask) as stream:
            texts = [text async for text in stream.text_stream]
            first = await stream.get_final_message()
        assert "".join(texts) == "Let me look."
        assert first.stop_reason == "tool_use" and first.usage.output_tokens == len(TOK.encode(CALL_TEXT + EOS))
        use = first.content[1]
        assert (use.type, use.name, use.input) == ("tool_use", "bash", {"command": "ls"})
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]},
        ]
        # stream=True: the raw events, in Anthropic's order
        events = [event async for event in await client.messages.create(messages=messages, stream=True, **ask)]
        assert [e.type for e in events] == [
            "message_start",
            *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
            "message_delta",
            "message_stop",
        ]
        assert events[2].delta.type == "text_delta" and events[2].delta.text == "Let me look."
        started, delta = events[4].content_block, events[5].delta
        assert (started.type, started.name, started.input) == ("tool_use", "bash", {})
        assert delta.type == "input_json_delta" and json.loads(delta.partial_json) == {"command": "ls"}
        assert events[7].delta.stop_reason == "tool_use" and events[7].usage.output_tokens == len(CALL_TEXT) + 1
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    started.model_dump() | {"input": {"command": "ls"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": started.id, "content": "b.txt"}]},
        ]
        last = await client.messages.create(messages=messages, **ask)
        assert last.content[0].text == "Two files."
    finally:
        await client.close()
    tool_conversation_check(close_session(server, session), ["a.txt", "b.txt"])


def test_a_streamed_message_reaches_the_sync_client_as_events(strict, server):
    strict.double.push(*[ScriptedReply(text="Hello there, friend.", finish_reason="length")] * 2)
    session = open_session(server)
    with client_for(session).messages.stream(
        model=MODEL_NAME, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        assert "".join(stream.text_stream) == "Hello"
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert strict.double.requests[0].params["max_tokens"] == 5
    raw = httpx.post(
        f"{anthropic_url(session)}/v1/messages",
        headers={"x-api-key": session["api_key"]},
        json={"model": MODEL_NAME, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.startswith("event: message_start\ndata: {")  # the event names as Anthropic sends them
    assert raw.text.rstrip().endswith('event: message_stop\ndata: {"type": "message_stop"}')


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "status", "kind", "says"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "user turn"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            400,
            "invalid_request_error",
            "'image'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            400,
            "invalid_request_error",
            "'document'",
        ),
        ({"thinking": {"type": "sometimes"}}, 400, "invalid_request_error", "thinking.type"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, 400, "invalid_request_error", "format"),
        ({"tools": TOOLS, "tool_choice": {"type": "any"}}, 400, "invalid_request_error", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "bash"}}, 400, "invalid_request_error", "'tool'"),
        ({"messages": [USER, {"role": "assistant", "content": "Sure"}]}, 400, "invalid_request_error", "prefill"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]},
            400,
            "invalid_request_error",
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t1"}],
                    },
                ]
            },
            400,
            "invalid_request_error",
            "must come before",
        ),
        ({"temperature": 1.5}, 400, "invalid_request_error", "temperature"),
        ({"stop_sequences": ["s"] * 17}, 400, "invalid_request_error", "stop_sequences"),
        ({"model": "claude-opus-4"}, 404, "not_found_error", "claude-opus-4"),
    ],
)
def test_bad_input_gets_an_anthropic_error_and_leaves_the_recording_intact(strict, server, body, status, kind, says):
    strict.double.push("first", "second")
    session = open_session(server)
    client = client_for(session)
    messages: list = [USER]
    client.messages.create(model=MODEL_NAME, max_tokens=16, messages=messages)
    request = {"model": MODEL_NAME, "max_tokens": 16, "messages": messages, **body}
    answer = httpx.post(
        f"{anthropic_url(session)}/v1/messages",
        json={k: v for k, v in request.items() if v is not None},
        headers={"x-api-key": session["api_key"]},
    )
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert error["error"]["type"] == kind and says in error["error"]["message"], error
    messages += [{"role": "assistant", "content": "first"}, {"role": "user", "content": "more"}]
    client.messages.create(model=MODEL_NAME, max_tokens=16, messages=messages)
    record = close_session(server, session)
    assert record["rewrites"] == 0 and [t["text"] for t in record["segments"][0]["turns"]] == ["first", "second"]


def test_the_sdk_raises_the_matching_errors(strict, start_server):
    server = start_server([strict.address], gateway_max_body_bytes=4096)
    strict.double.push(ScriptedReply(text="refused", status_code=400))
    session = open_session(server)
    client = client_for(session)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": [image]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-harness-big", max_tokens=8, messages=[USER])
    with pytest.raises(anthropic.RequestTooLargeError) as big:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": "x" * 5000}])
    assert big.value.body["error"]["type"] == "request_too_large"
    with pytest.raises(anthropic.BadRequestError) as refused:  # the backend refuses the prompt
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=[USER])
    assert "backend refused" in refused.value.message
    bad_json = httpx.post(
        f"{anthropic_url(session)}/v1/messages", content=b"{not json", headers={"x-api-key": session["api_key"]}
    )
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"
    assert close_session(server, session)["failed_calls"] == 1


def test_the_key_is_read_from_x_api_key_or_bearer_and_a_wrong_one_is_an_authentication_error(strict, start_server):
    server = start_server([strict.address], api_key="operator-key")
    operator = {"Authorization": "Bearer operator-key"}
    a = server.http.post("/sessions", json={}, headers=operator).json()
    b = server.http.post("/sessions", json={}, headers=operator).json()
    strict.double.push("one", "two", "three", "four")
    with pytest.raises(anthropic.AuthenticationError) as denied:
        anthropic.Anthropic(base_url=anthropic_url(b), api_key=a["api_key"], max_retries=0).messages.create(
            model=MODEL_NAME, max_tokens=8, messages=[USER]
        )
    assert denied.value.body["error"]["type"] == "authentication_error"
    url = f"{anthropic_url(a)}/v1/messages"
    request = {"model": MODEL_NAME, "max_tokens": 8, "messages": [USER]}
    for headers in ({}, {"x-api-key": "sk-prorl-wrong"}, {"x-api-key": b["api_key"]}):
        denied_raw = httpx.post(url, json=request, headers=headers)
        assert denied_raw.status_code == 401 and denied_raw.json()["error"]["type"] == "authentication_error"
    # an unknown session answers the same 401 to a session key, 404 to the operator's
    unknown = f"{server.url}/sessions/{'0' * 32}/v1/messages"
    assert httpx.post(unknown, json=request, headers={"x-api-key": a["api_key"]}).json() == denied_raw.json()
    missing = httpx.post(unknown, json=request, headers={"x-api-key": "operator-key"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    for headers in ({"x-api-key": a["api_key"]}, {"Authorization": f"Bearer {a['api_key']}"}, operator):
        assert httpx.post(url, json=request, headers=headers).status_code == 200
    assert client_for(a).messages.create(model=MODEL_NAME, max_tokens=8, messages=[USER]).content  # the SDK's way
    # a session key opens no trainer endpoint, in either header
    for headers in ({"x-api-key": a["api_key"]}, {"Authorization": f"Bearer {a['api_key']}"}):
        assert server.http.get("/jobs", headers=headers).status_code == 401


def test_any_model_name_is_answered_when_the_session_accepts_it_and_the_names_are_recorded(strict, server):
    strict.double.push("one", "two", "three")
    strict_session = open_session(server)
    with pytest.raises(anthropic.NotFoundError) as refused:
        client_for(strict_session).messages.create(model="claude-harness-big", max_tokens=8, messages=[USER])
    assert MODEL_NAME in refused.value.message
    session = open_session(server, accept_any_model=True)
    assert session["model"] == MODEL_NAME
    client = client_for(session)
    history: list = [USER]
    first = client.messages.create(model="claude-harness-big", max_tokens=8, messages=history)
    assert first.model == "claude-harness-big"  # answered as the name the harness sent
    history += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "more"}]
    client.messages.create(model="claude-harness-small", max_tokens=8, messages=history)
    history += [{"role": "assistant", "content": "two"}, {"role": "user", "content": "again"}]
    client.messages.create(model="claude-harness-big", max_tokens=8, messages=history)
    record = close_session(server, session)
    assert record["harness_models"] == ["claude-harness-big", "claude-harness-small"]
    assert record["rewrites"] == 0 and record["calls"] == 3
    assert close_session(server, strict_session)["harness_models"] == []


def test_sampling_fields_reach_the_backend_only_as_the_trainer_allows(strict, server):
    strict.double.push("ok", "ok")
    session = open_session(
        server, sampling_params={"temperature": 1.0, "top_k": 50}, harness_params=["max_tokens", "top_k", "stop"]
    )
    client = client_for(session)
    client.messages.create(
        model=MODEL_NAME,
        max_tokens=9,
        stop_sequences=["END"],
        metadata={"user_id": "u"},
        messages=[USER],
        extra_body={"temperature": 0.0, "top_k": 5},  # fields this SDK no longer offers; older ones and harnesses do
    )
    [sent] = [r.params for r in strict.double.requests]
    assert (sent["temperature"], sent["top_k"], sent["max_tokens"], sent["stop"]) == (1.0, 5, 9, ["END"])


def test_a_turn_ended_by_a_stop_sequence_says_so_and_the_conversation_goes_on_in_its_segment(strict, server):
    sampled = TOK.encode("Done. END")  # what vLLM returns: the stop string's ids, not its text, no end of turn
    strict.double.push(ScriptedReply(ids=sampled, stop_reason="END"), ScriptedReply(ids=sampled, stop_reason="END"))
    session = open_session(server, harness_params=["max_tokens", "stop"])
    client = client_for(session)
    ask = {"model": MODEL_NAME, "max_tokens": 32, "stop_sequences": ["END"]}
    history: list = [USER]
    first = client.messages.create(messages=history, **ask)
    assert [b.text for b in first.content] == ["Done. "]
    assert (first.stop_reason, first.stop_sequence) == ("stop_sequence", "END")
    history += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "more"}]
    with client.messages.stream(messages=history, **ask) as stream:
        second = stream.get_final_message()
    assert (second.stop_reason, second.stop_sequence) == ("stop_sequence", "END")
    record = close_session(server, session)
    assert record["rewrites"] == 0
    [segment] = record["segments"]
    assert model_ids(segment) == sampled * 2
    assert [t["stop_sequence"] for t in segment["turns"]] == ["END", "END"]


def test_the_guides_anthropic_example_runs_as_written(strict, server):
    """docs/gateway.md's Python block of its Anthropic section, against a session on the scripted double."""
    strict.double.push("Hello.")
    guide = (DOCS / "gateway.md").read_text()
    section = guide.split("## Anthropic Messages\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {"session": open_session(server)}
    exec(compile(code, "docs/gateway.md", "exec"), scope)
    assert scope["reply"].content[0].text == "Hello."


def test_a_backend_that_keeps_failing_is_an_overloaded_error(strict, start_server):
    server = start_server([strict.address], llm_retry_budget_s=0.5, llm_max_failovers=1)
    strict.double.push(*[ScriptedReply(text="x", status_code=503)] * 4, "fine")
    session = open_session(server)
    with pytest.raises(anthropic.OverloadedError) as failed:
        client_for(session).messages.create(model=MODEL_NAME, max_tokens=8, messages=[USER])
    assert failed.value.status_code == 529 and failed.value.body["error"]["type"] == "overloaded_error"
    assert close_session(server, session)["failed_calls"] == 1
