"""OpenAI Responses on a gateway session, driven by the official `openai` client's `responses` API against the
scripted test double: answers in the Responses shape (plain and streamed, text and function calls),
`previous_response_id` and a resent input both continuing one token-exact segment, the remembered responses'
bounds, what is refused, and keys."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from gateway_sessions import close_session, open_session
from repo_paths import DOCS

from prorl_server.gateway.bridge import SessionBridge
from prorl_server.gateway.responses.store import ResponseStore
from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_NAME, ToyChatTokenizer

TOK = ToyChatTokenizer()
TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        "strict": False,
    }
]
CALL_TEXT = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
BARE_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "wc -l a.txt"}}\n</tool_call>'


@pytest.fixture
def server(start_server, strict):
    """A prorl-server with the strict scripted backend registered (conftest's `server` has the lenient one)."""
    return start_server([strict.address])


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)


def async_client_for(session: dict) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)


def toy_template(messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The toy chat template of a whole conversation (ending with an assistant message), with `tools` (the
    Responses tools) as vLLM hands them to the template."""
    schemas = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")}}
        for t in tools or ()
    ]
    return TOK.encode(TOK.render(messages, False, schemas or None))


def assert_one_exact_segment(
    record: dict, texts: list[str], conversation: list[dict], tools: list[dict] | None = TOOLS
) -> None:
    """One segment, no rewrite, its model tokens exactly the ones the double sampled, and its ids the chat
    template of `conversation` with `tools` (but the newline ChatML puts after the last assistant message)."""
    assert (record["rewrites"], record["calls"], record["failed_calls"]) == (0, len(texts), 0)
    [segment] = record["segments"]
    assert [t["text"] for t in segment["turns"]] == texts
    sampled = [t for t, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert sampled == [t for text in texts for t in TOK.encode(text + "<|im_end|>")]
    assert sampled == [t for turn in segment["turns"] for t in turn["output_ids"]]
    assert segment["prompt_ids"] + segment["response_ids"] + TOK.encode("\n") == toy_template(conversation, tools)


def tool_conversation(instructions: str | None) -> list[dict]:
    """The chat conversation the three-turn tool exchange below is recorded as."""
    system = [{"role": "system", "content": instructions}] if instructions else []
    return [
        *system,
        {"role": "user", "content": "How many lines?"},
        {"role": "assistant", "content": CALL_TEXT},
        {"role": "tool", "content": "a.txt"},
        {"role": "assistant", "content": BARE_CALL},
        {"role": "tool", "content": "3 a.txt"},
        {"role": "assistant", "content": "Three."},
    ]


def test_a_response_has_openai_shape_and_the_session_records_the_tokens(strict, server):
    strict.double.push("Paris.", ScriptedReply(text="It is big.", logprobs=[-0.5] * 11))
    session = open_session(server)
    client = client_for(session)
    first = client.responses.create(model=MODEL_NAME, instructions="Be brief.", input="Capital of France?")
    assert first.id.startswith("resp_") and first.object == "response" and first.status == "completed"
    assert first.model == MODEL_NAME and first.instructions == "Be brief."
    [message] = first.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert [(c.type, c.text) for c in message.content] == [("output_text", "Paris.")]
    assert first.output_text == "Paris."  # the SDK's own property
    assert first.usage.output_tokens == len("Paris.") + 1  # the end-of-turn token too
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    second = client.responses.create(
        model=MODEL_NAME, instructions="Be brief.", input="Is it big?", previous_response_id=first.id
    )
    assert second.output_text == "It is big." and second.previous_response_id == first.id
    record = close_session(server, session)
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Is it big?"},
        {"role": "assistant", "content": "It is big."},
    ]
    assert_one_exact_segment(record, ["Paris.", "It is big."], conversation, None)
    assert record["segments"][0]["turns"][1]["logprobs"] == [-0.5] * 11


def test_function_calls_continued_by_previous_response_id_are_one_exact_segment(strict, server):
    strict.double.push(CALL_TEXT, BARE_CALL, "Three.")
    session = open_session(server)
    client = client_for(session)
    first = client.responses.create(model=MODEL_NAME, input="How many lines?", tools=TOOLS)
    text, call = first.output
    assert text.content[0].text == "Let me look." and first.output_text == "Let me look."
    assert (call.type, call.name, json.loads(call.arguments), call.status) == (
        "function_call",
        "bash",
        {"command": "ls"},
        "completed",
    )
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    second = client.responses.create(model=MODEL_NAME, input=[output], tools=TOOLS, previous_response_id=first.id)
    [bare] = second.output  # no text before the call: no message item
    assert bare.type == "function_call" and json.loads(bare.arguments) == {"command": "wc -l a.txt"}
    output = {"type": "function_call_output", "call_id": bare.call_id, "output": "3 a.txt"}
    third = client.responses.create(model=MODEL_NAME, input=[output], tools=TOOLS, previous_response_id=second.id)
    assert third.output_text == "Three." and [item.type for item in third.output] == ["message"]
    record = close_session(server, session)
    assert_one_exact_segment(record, [CALL_TEXT, BARE_CALL, "Three."], tool_conversation(None))


async def test_the_whole_input_resent_with_the_output_items_is_the_same_one_exact_segment(strict, server):
    strict.double.push(CALL_TEXT, BARE_CALL, "Three.")
    session = open_session(server)
    client = async_client_for(session)
    try:
        items: list = [{"role": "user", "content": [{"type": "input_text", "text": "How many lines?"}]}]
        first = await client.responses.create(
            model=MODEL_NAME, instructions="Count.", input=items, tools=TOOLS, store=False
        )
        call = first.output[1]
        # the harness appends the output items as it got them (all their fields) and the call's output
        items += [item.model_dump() for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
        second = await client.responses.create(
            model=MODEL_NAME, instructions="Count.", input=items, tools=TOOLS, store=False
        )
        items += [item.model_dump() for item in second.output]
        items.append({"type": "function_call_output", "call_id": second.output[0].call_id, "output": "3 a.txt"})
        third = await client.responses.create(model=MODEL_NAME, instructions="Count.", input=items, tools=TOOLS)
        assert third.output_text == "Three."
        with pytest.raises(openai.BadRequestError) as forgotten:  # store=False: not remembered
            await client.responses.create(model=MODEL_NAME, input="more", previous_response_id=first.id)
        assert forgotten.value.code == "previous_response_not_found"
    finally:
        await client.close()
    record = close_session(server, session)
    assert_one_exact_segment(record, [CALL_TEXT, BARE_CALL, "Three."], tool_conversation("Count."))


def test_a_streamed_response_sends_openais_events_and_the_sdk_assembles_it(strict, server):
    strict.double.push(CALL_TEXT, "Two files.")
    session = open_session(server)
    client = client_for(session)
    events = list(client.responses.create(model=MODEL_NAME, input="What is here?", tools=TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[4].delta == "Let me look."
    done = events[-1].response
    assert done.status == "completed" and done.usage.output_tokens == len(TOK.encode(CALL_TEXT)) + 1
    call = done.output[1]
    assert events[9].delta == call.arguments and events[11].item.call_id == call.call_id
    # the SDK's stream helper, continuing the streamed response
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt b.txt"}
    with client.responses.stream(model=MODEL_NAME, input=[output], tools=TOOLS, previous_response_id=done.id) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["Two files."] and final.output_text == "Two files." and final.status == "completed"
    record = close_session(server, session)
    conversation = [
        {"role": "user", "content": "What is here?"},
        {"role": "assistant", "content": CALL_TEXT},
        {"role": "tool", "content": "a.txt b.txt"},
        {"role": "assistant", "content": "Two files."},
    ]
    assert_one_exact_segment(record, [CALL_TEXT, "Two files."], conversation)


async def test_a_turn_cut_at_max_output_tokens_is_incomplete_plain_and_streamed(strict, server):
    strict.double.push(
        ScriptedReply(text="Once upon", finish_reason="length"), ScriptedReply(text="a", finish_reason="length")
    )
    session = open_session(server, harness_params=["max_tokens"])
    client = async_client_for(session)
    try:
        cut = await client.responses.create(model=MODEL_NAME, input="Tell a story.", max_output_tokens=9)
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
        assert cut.output[0].status == "incomplete" and cut.output_text == "Once upon"
        stream = await client.responses.create(
            model=MODEL_NAME, input="Go on.", max_output_tokens=1, previous_response_id=cut.id, stream=True
        )
        last = [event async for event in stream][-1]
        assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    finally:
        await client.close()
    assert [r.params["max_tokens"] for r in strict.double.requests] == [9, 1]
    assert close_session(server, session)["rewrites"] == 0


BAD_REQUESTS = [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": []}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "bash"}, "tools": TOOLS}, "tool_choice"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, "input[0].call_id"),
    (
        {"input": [{"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{"}]},
        "input[0].arguments",
    ),
    ({"temperature": 3}, "temperature"),
]


@pytest.mark.parametrize(("body", "param"), BAD_REQUESTS)
def test_what_cannot_be_honoured_is_a_400_in_openais_shape_and_the_recording_goes_on(strict, server, body, param):
    strict.double.push("first", "second")
    session = open_session(server)
    client = client_for(session)
    first = client.responses.create(model=MODEL_NAME, input="hi")
    answer = httpx.post(
        f"{session['base_url']}/responses",
        json={"model": MODEL_NAME, "input": "x", **body},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"]
    client.responses.create(model=MODEL_NAME, input="more", previous_response_id=first.id)
    record = close_session(server, session)
    assert record["rewrites"] == 0 and [t["text"] for t in record["segments"][0]["turns"]] == ["first", "second"]


def test_the_sdk_raises_openais_exceptions(strict, start_server):
    server = start_server([strict.address], api_key="operator-key")
    operator = {"Authorization": "Bearer operator-key"}
    strict.double.push("mine")
    session = server.http.post("/sessions", json={}, headers=operator).json()
    other = server.http.post("/sessions", json={}, headers=operator).json()
    client = client_for(session)
    with pytest.raises(openai.NotFoundError) as model:
        client.responses.create(model="gpt-4o", input="x")
    assert model.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as schema:
        client.responses.create(
            model=MODEL_NAME, input="x", text={"format": {"type": "json_schema", "name": "x", "schema": {}}}
        )
    assert schema.value.param == "text.format" and "only text output" in schema.value.message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=other["base_url"], api_key=session["api_key"], max_retries=0).responses.create(
            model=MODEL_NAME, input="x"
        )
    first = client.responses.create(model=MODEL_NAME, input="x")  # the session key passes the server's key check
    assert first.output_text == "mine"
    # a response id is known only in its own session
    operators = openai.OpenAI(base_url=other["base_url"], api_key="operator-key", max_retries=0)
    with pytest.raises(openai.BadRequestError) as unknown:
        operators.responses.create(model=MODEL_NAME, input="y", previous_response_id=first.id)
    assert unknown.value.code == "previous_response_not_found" and unknown.value.param == "previous_response_id"
    for key in (session, other):
        assert server.http.delete(f"/sessions/{key['session_id']}", headers=operator).status_code == 200


def test_a_session_remembers_its_latest_responses_only():
    store = ResponseStore(capacity=2)
    for n in range(3):
        store.put(f"resp_{n}", ())
    assert len(store) == 2 and store.get("resp_0") is None and store.get("resp_2") == ()


async def test_a_sandbox_s_bridge_passes_responses_plain_and_streamed(strict, server, tmp_path):
    """What an OpenAI client in a sandbox reaches (the bridge's socket; the sandbox side is
    test_gateway_sandbox.py's): the session's Responses, continued through the bridge in one segment."""
    strict.double.push("one", "two")
    session = open_session(server)
    bridge = await SessionBridge.open(session["base_url"], session["api_key"], 64 * 1024, tmp_path)
    http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(bridge.socket_path)))
    client = openai.AsyncOpenAI(base_url="http://sandbox/v1", api_key="placeholder", http_client=http, max_retries=0)
    try:
        first = await client.responses.create(model=MODEL_NAME, input="u1")
        async with client.responses.stream(model=MODEL_NAME, input="u2", previous_response_id=first.id) as stream:
            second = await stream.get_final_response()
    finally:
        await client.close()
        await bridge.close()
    assert (first.output_text, second.output_text) == ("one", "two")
    record = close_session(server, session)
    conversation = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "two"},
    ]
    assert_one_exact_segment(record, ["one", "two"], conversation, None)


def test_the_guides_responses_example_runs_as_written(backend, start_server, capsys):
    """docs/gateway.md's block under "OpenAI Responses", against a server on the scripted double."""
    server = start_server([backend.address])
    guide = (DOCS / "gateway.md").read_text()
    section = guide.split("\n## OpenAI Responses\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert '"http://127.0.0.1:8000"' in code
    exec(compile(code.replace("http://127.0.0.1:8000", server.url), "docs/gateway.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[-2:] == ["reply", "0 1 1"]  # the double's default reply
    assert len(server.state.gateway) == 0
