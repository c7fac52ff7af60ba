"""The OpenAI gateway on the scripted test double, driven by the official `openai` client: answers in OpenAI's
shape (plain, streamed, with tool calls), token-exact segments, history rewrites, sampling params, bad input,
session keys, limits, closing, and a handler's own session."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import openai
import pytest
from gateway_sessions import close_session, open_session
from polling import wait_for
from repo_paths import DOCS
from server_jobs import result, submit

from prorl_server import AgentHandler, JobContext
from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_NAME, ToyChatTokenizer

TOK = ToyChatTokenizer()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
CALL_TEXT = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture
def server(start_server, strict):
    """A prorl-server with the strict scripted backend registered (conftest's `server` has the lenient one)."""
    return start_server([strict.address])


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)


def toy_template(messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return TOK.encode(TOK.render(messages, add_generation_prompt))


def test_openai_client_gets_the_reply_and_the_session_returns_the_tokens_the_engine_sampled(strict, server):
    strict.double.push("Paris.", ScriptedReply(text="It is big.", logprobs=[-0.5] * 11))
    session = open_session(server)
    assert session["model"] == MODEL_NAME
    client = client_for(session)
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    first = client.chat.completions.create(model=MODEL_NAME, messages=history)
    assert first.choices[0].message.content == "Paris."
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.completion_tokens == len("Paris.") + 1  # the end-of-turn token too
    history += [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Is it big?"}]
    second = client.chat.completions.create(model=MODEL_NAME, messages=history)
    assert second.choices[0].message.content == "It is big."

    record = close_session(server, session)
    assert record["rewrites"] == 0 and record["calls"] == 2 and record["failed_calls"] == 0
    # each answered call is timed, by API
    metrics = server.http.get("/metrics").text
    assert 'prorl_gateway_call_duration_seconds_count{api="chat"} 2.0' in metrics
    [segment] = record["segments"]
    prompts = [r.prompt for r in strict.double.requests]
    # one stream, extended call by call: each prompt sent is the recorded ids up to that turn
    context = segment["prompt_ids"] + segment["response_ids"]
    assert [context[: t["prompt_len"]] for t in segment["turns"]] == prompts
    assert segment["turns"][1]["logprobs"] == [-0.5] * 11
    model_ids = [t for t, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert model_ids == [t for turn in segment["turns"] for t in turn["output_ids"]]
    # and it is exactly the chat template of the whole conversation (but the newline ChatML puts after the
    # last assistant message, which the model did not sample)
    assert context + TOK.encode("\n") == toy_template([*history, {"role": "assistant", "content": "It is big."}], False)


def test_a_streamed_completion_sends_the_same_answer_as_server_sent_events(strict, server):
    strict.double.push("Hello there.")
    session = open_session(server)
    stream = client_for(session).chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == len("Hello there.") + 1
    assert len(close_session(server, session)["segments"][0]["turns"]) == 1


async def test_async_client_gets_tool_calls_and_their_results_continue_the_same_segment(strict, server):
    strict.double.push(CALL_TEXT, CALL_TEXT, "Two files.")
    session = open_session(server)
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    try:
        messages: list = [{"role": "user", "content": "What is here?"}]
        reply = await client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        assert message.content == "Let me look."
        [call] = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": "ls"})
        # the harness sends back the whole message object it got (None fields and all)
        messages += [message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "a.txt"}]
        stream = await client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, stream=True)
        calls = [tc async for chunk in stream for tc in (chunk.choices[0].delta.tool_calls or [])]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("bash", {"command": "ls"})]
        messages += [
            {"role": "assistant", "content": "Let me look.", "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "b.txt"},
        ]
        last = await client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
        assert last.choices[0].message.content == "Two files." and last.choices[0].message.tool_calls is None
    finally:
        await client.close()
    record = close_session(server, session)
    assert record["rewrites"] == 0 and len(record["segments"]) == 1
    segment = record["segments"][0]
    assert [t["text"] for t in segment["turns"]] == [CALL_TEXT, CALL_TEXT, "Two files."]
    # what the model said, calls included, is in the stream verbatim: the ids it sampled
    sampled = [t for t, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert sampled == TOK.encode(CALL_TEXT + "<|im_end|>") * 2 + TOK.encode("Two files.<|im_end|>")


def test_a_rewritten_history_starts_a_new_segment_and_is_counted(strict, server):
    strict.double.push("one", "two", "three")
    session = open_session(server)
    client = client_for(session)
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}]
    client.chat.completions.create(model=MODEL_NAME, messages=history)
    history += [{"role": "assistant", "content": "one"}, {"role": "user", "content": "u2"}]
    client.chat.completions.create(model=MODEL_NAME, messages=history)
    # the harness compacts: the system prompt and the task kept, the exchanges since summarised
    summarised = [*history[:2], {"role": "user", "content": "(summary: one; u2 -> two) u3"}]
    client.chat.completions.create(model=MODEL_NAME, messages=summarised)
    record = close_session(server, session)
    assert record["rewrites"] == 1 and record["calls"] == 3
    first, second = record["segments"]
    assert [t["text"] for t in first["turns"]] == ["one", "two"]
    assert [t["text"] for t in second["turns"]] == ["three"]
    assert second["prompt_ids"] == toy_template(summarised, True)
    assert second["response_mask"] == [1] * len(second["response_ids"])


def test_an_edited_earlier_message_is_a_rewrite_and_the_edit_is_what_the_new_segment_holds(strict, server):
    strict.double.push("one", "two")
    session = open_session(server)
    client = client_for(session)
    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "u1"}])
    edited = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "ONE (edited)"},
        {"role": "user", "content": "u2"},
    ]
    client.chat.completions.create(model=MODEL_NAME, messages=edited)
    record = close_session(server, session)
    assert record["rewrites"] == 1
    assert record["segments"][1]["prompt_ids"] == toy_template(edited, True)


def test_trainer_sampling_params_win_over_the_harness_except_the_ones_it_allows(strict, server):
    strict.double.push("ok", "ok")
    fixed = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64}
    session = open_session(server, sampling_params=fixed, harness_params=["max_tokens"])
    client = client_for(session)
    messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0.0, max_tokens=7, seed=3)
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=9)
    first, second = (r.params for r in strict.double.requests)
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (1.0, 0.9, 7)
    assert "seed" not in first
    assert second["max_tokens"] == 9


def test_a_call_with_tools_keeps_special_tokens_for_the_parser_unless_the_trainer_says(strict, server):
    """vLLM leaves special tokens out of the text by default, and several families write calls with them; as
    vLLM's own tool parsers do, a request with tools asks for them (a trainer's own setting wins)."""
    strict.double.push("ok", "ok", "ok")
    messages = [{"role": "user", "content": "hi"}]
    client_for(open_session(server)).chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
    client_for(open_session(server)).chat.completions.create(model=MODEL_NAME, messages=messages)
    kept = open_session(server, sampling_params={"skip_special_tokens": True})
    client_for(kept).chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
    with_tools, without, trainers = (r.params for r in strict.double.requests)
    assert with_tools["skip_special_tokens"] is False
    assert "skip_special_tokens" not in without
    assert trainers["skip_special_tokens"] is True


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0]"),
        ({"messages": []}, 400, "messages"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"n": 2}, 400, "n"),
        ({"tool_choice": "required", "tools": TOOLS}, 400, "tool_choice"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "y"}]},
            400,
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}],
                    },
                ]
            },
            400,
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": float("nan")}}}]}, 400, None),
        ({"stop": ["s"] * 17}, 400, "stop"),
    ],
)
def test_bad_input_gets_an_openai_error_and_leaves_the_recording_intact(strict, server, body, status, param):
    strict.double.push("first", "second")
    session = open_session(server)
    client = client_for(session)
    messages = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages)
    request = {"model": MODEL_NAME, "messages": messages, **body}
    answer = httpx.post(
        f"{session['base_url']}/chat/completions",
        content=json.dumps(request).encode(),  # NaN written as JSON's non-standard NaN
        headers={"Authorization": f"Bearer {session['api_key']}", "content-type": "application/json"},
    )
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    # the conversation goes on in the same segment, as if the bad request had never come
    messages += [{"role": "assistant", "content": "first"}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages)
    record = close_session(server, session)
    assert record["rewrites"] == 0 and [t["text"] for t in record["segments"][0]["turns"]] == ["first", "second"]
    assert record["segments"][0]["prompt_ids"] + record["segments"][0]["response_ids"] + TOK.encode(
        "\n"
    ) == toy_template([*messages, {"role": "assistant", "content": "second"}], False)


def test_malformed_json_and_an_oversized_body_are_openai_errors(strict, start_server):
    server = start_server([strict.address], gateway_max_body_bytes=4096)
    session = open_session(server)
    url, headers = f"{session['base_url']}/chat/completions", {"Authorization": f"Bearer {session['api_key']}"}
    bad = httpx.post(url, content=b"{not json", headers={**headers, "content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    big = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert httpx.post(url, json=big, headers=headers).status_code == 413


def test_a_session_key_opens_its_own_session_and_nothing_else(strict, server):
    strict.double.push("mine")
    a, b = open_session(server), open_session(server)
    with pytest.raises(openai.AuthenticationError) as denied:
        openai.OpenAI(base_url=b["base_url"], api_key=a["api_key"], max_retries=0).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "x"}]
        )
    unknown = httpx.get(
        f"{server.url}/sessions/{'0' * 32}/v1/models", headers={"Authorization": f"Bearer {a['api_key']}"}
    )
    wrong = httpx.get(f"{b['base_url']}/models", headers={"Authorization": f"Bearer {a['api_key']}"})
    # a key learns nothing about other sessions: an unknown one answers exactly like one that exists
    assert unknown.status_code == wrong.status_code == 401 and unknown.json() == wrong.json()
    assert denied.value.body == wrong.json()["error"]
    assert httpx.get(f"{b['base_url']}/models").status_code == 401  # no key at all
    # nor does it open the trainer's endpoints
    assert (
        server.http.get("/jobs", headers={"Authorization": f"Bearer {a['api_key']}"}).status_code == 200
    )  # no --api-key
    reply = client_for(a).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == "mine"
    assert close_session(server, b)["calls"] == 0


def test_with_an_api_key_session_keys_reach_only_their_gateway_paths_and_the_operator_key_opens_all(
    strict, start_server
):
    server = start_server([strict.address], api_key="operator-key")
    operator = {"Authorization": "Bearer operator-key"}
    assert server.http.post("/sessions", json={}).status_code == 401
    session = server.http.post("/sessions", json={}, headers=operator).json()
    own = {"Authorization": f"Bearer {session['api_key']}"}
    assert httpx.get(f"{session['base_url']}/models", headers=own).status_code == 200
    assert httpx.get(f"{session['base_url']}/models", headers=operator).status_code == 200
    for method, path in [("GET", "/jobs"), ("GET", "/status"), ("DELETE", f"/sessions/{session['session_id']}")]:
        assert server.http.request(method, path, headers=own).status_code == 401, path
    missing = httpx.get(f"{server.url}/sessions/{'0' * 32}/v1/models", headers=operator)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
    assert server.http.delete(f"/sessions/{session['session_id']}", headers=operator).status_code == 200
    assert httpx.get(f"{session['base_url']}/models", headers=own).status_code == 401


def test_closing_a_session_aborts_its_completion_in_flight(strict, server):
    strict.double.push(ScriptedReply(text="never", delay_s=120))
    session = open_session(server)
    outcome: dict = {}

    def harness() -> None:
        try:
            client_for(session).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}])
        except openai.APIStatusError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=harness)
    thread.start()
    wait_for(lambda: len(strict.double.requests) == 1, 30, "the completion reaches the backend")
    record = close_session(server, session)
    thread.join(60)
    assert record["segments"] == [] and record["failed_calls"] == 1
    assert isinstance(outcome["error"], openai.NotFoundError) and outcome["error"].code == "session_closed"
    wait_for(lambda: strict.double.requests[0].outcome == "aborted", 30, "the backend sees the request closed")


def test_an_idle_session_expires_and_its_key_opens_nothing_any_more(strict, start_server):
    server = start_server([strict.address], gateway_idle_timeout_s=0.2)
    first = open_session(server)
    headers = {"Authorization": f"Bearer {first['api_key']}"}
    wait_for(lambda: httpx.get(f"{first['base_url']}/models", headers=headers).status_code == 401, 30, "idle expiry")
    assert server.http.delete(f"/sessions/{first['session_id']}").status_code == 404
    assert len(server.state.gateway) == 0


def test_the_number_of_open_sessions_is_capped(strict, start_server):
    server = start_server([strict.address], gateway_max_sessions=2)
    open_session(server)
    open_session(server)
    over = server.http.post("/sessions", json={})
    assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_sessions"


class GatewayAgentHandler(AgentHandler):
    """Runs an OpenAI-client agent against its job's own gateway session."""

    name = "gateway_agent"

    async def run(self, ctx: JobContext) -> None:
        access = await ctx.gateway_session(model="policy")
        client = openai.AsyncOpenAI(base_url=access.base_url, api_key=access.api_key, max_retries=0)
        try:
            reply = await client.chat.completions.create(
                model=access.model, messages=[{"role": "user", "content": ctx.instance["question"]}]
            )
        finally:
            await client.close()
        ctx.artifacts["answer"] = reply.choices[0].message.content

    async def eval(self, ctx: JobContext) -> float:
        return 1.0 if ctx.artifacts.get("answer") == "42" else 0.0


def test_a_handler_opens_a_session_for_its_job_and_gets_its_recording(strict, start_server):
    server = start_server([strict.address], handlers={"gateway_agent": GatewayAgentHandler()})
    server.state.gateway.public_url = server.url  # the test server binds a free port
    strict.double.push("42", job="j1")
    submit(server, "j1", instance={"data_source": "gateway_agent", "question": "6 x 7?"})
    res = result(server, "j1")
    assert res["status"] == "completed" and res["reward"] == 1.0, res["error"]
    [recording] = res["artifacts"]["gateway"]
    assert [t["text"] for t in recording["segments"][0]["turns"]] == ["42"]
    assert res["trajectory"]["response_ids"] == recording["segments"][0]["response_ids"]  # adopted as the job's
    assert [r.job_id for r in strict.double.requests] == ["j1"]  # on the job's own pin
    assert len(server.state.gateway) == 0  # closed with the job's RUN


@pytest.mark.parametrize("end", ["cancelled", "timeout"])
def test_a_handler_session_is_closed_when_the_job_is_cancelled_or_times_out(strict, start_server, end):
    server = start_server([strict.address], handlers={"gateway_agent": GatewayAgentHandler()})
    server.state.gateway.public_url = server.url
    strict.double.push(ScriptedReply(text="42", delay_s=120), job="j2")
    extra = {"timeout": 3.0} if end == "timeout" else {}
    submit(server, "j2", instance={"data_source": "gateway_agent", "question": "?"}, **extra)
    wait_for(lambda: len(strict.double.requests) == 1, 30, "the agent's completion reaches the backend")
    if end == "cancelled":
        assert server.http.delete("/jobs/j2").status_code == 200
    assert result(server, "j2", timeout=60)["status"] == end
    wait_for(lambda: strict.double.requests[0].outcome == "aborted", 30, "the completion is aborted")
    wait_for(lambda: len(server.state.gateway) == 0, 30, "the session is closed")


def test_concurrent_calls_on_one_session_are_recorded_one_at_a_time(strict, server):
    strict.double.push("a", "b")
    session = open_session(server)

    async def both() -> None:
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        try:
            await asyncio.gather(
                *(
                    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": q}])
                    for q in ("q1", "q2")
                )
            )
        finally:
            await client.close()

    asyncio.run(both())
    record = close_session(server, session)
    # two unrelated conversations: two chains (before chains, the second counted as a rewrite)
    assert record["calls"] == 2 and record["rewrites"] == 0 and len(record["chains"]) == 2
    prompts = sorted(s["prompt_ids"] for s in record["segments"])
    assert prompts == sorted(toy_template([{"role": "user", "content": q}], True) for q in ("q1", "q2"))


def test_the_guides_example_runs_as_written(backend, start_server, capsys):
    """docs/gateway.md's first block, against a server on the scripted double (its address put in)."""
    server = start_server([backend.address])
    guide = (DOCS / "gateway.md").read_text()
    code = guide.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'server = "http://127.0.0.1:8000"' in code
    exec(compile(code.replace("http://127.0.0.1:8000", server.url), "docs/gateway.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "0 1 0"  # rewrites, calls, failed calls
    assert len(server.state.gateway) == 0


def test_a_failed_call_retried_with_the_same_messages_stays_in_its_segment(strict, server):
    strict.double.push("one", ScriptedReply(text="refused", status_code=400), "two")
    session = open_session(server)
    client = client_for(session)
    messages = [{"role": "user", "content": "u1"}]
    client.chat.completions.create(model=MODEL_NAME, messages=messages)
    messages += [{"role": "assistant", "content": "one"}, {"role": "user", "content": "u2"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL_NAME, messages=messages)
    assert refused.value.code == "backend_rejected"
    assert client.chat.completions.create(model=MODEL_NAME, messages=messages).choices[0].message.content == "two"
    record = close_session(server, session)
    assert (record["rewrites"], record["calls"], record["failed_calls"]) == (0, 2, 1)
    [segment] = record["segments"]
    context = segment["prompt_ids"] + segment["response_ids"] + TOK.encode("\n")
    assert context == toy_template([*messages, {"role": "assistant", "content": "two"}], False)


def test_a_harness_that_goes_away_aborts_its_completion_and_the_session_goes_on(strict, server):
    strict.double.push(ScriptedReply(text="slow", delay_s=120), "fast")
    session = open_session(server)
    messages = [{"role": "user", "content": "u1"}]
    impatient = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=1)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=MODEL_NAME, messages=messages)
    wait_for(lambda: strict.double.requests[0].outcome == "aborted", 30, "the backend sees the request closed")
    assert (
        client_for(session).chat.completions.create(model=MODEL_NAME, messages=messages).choices[0].message.content
        == "fast"
    )
    record = close_session(server, session)
    assert (record["rewrites"], record["calls"], record["failed_calls"]) == (0, 1, 1)
    assert [t["text"] for t in record["segments"][0]["turns"]] == ["fast"]


def test_too_many_messages_or_segments_are_refused_and_the_recording_kept(strict, start_server):
    server = start_server([strict.address], gateway_max_messages=3, gateway_max_segments=2)
    strict.double.push("one", "two")
    session = open_session(server)
    client = client_for(session)
    for question in ("q1", "q2"):  # two unrelated histories: two segments
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": question}])
    with pytest.raises(openai.BadRequestError) as segments:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "q3"}])
    assert segments.value.code == "too_many_segments"
    with pytest.raises(openai.BadRequestError) as messages:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}] * 4)
    assert messages.value.param == "messages"
    record = close_session(server, session)
    assert [[t["text"] for t in s["turns"]] for s in record["segments"]] == [["one"], ["two"]]
    assert (record["calls"], record["failed_calls"]) == (2, 0)


def test_without_a_healthy_backend_a_session_is_refused_with_503(strict, server):
    strict.double.healthy = False
    wait_for(lambda: server.http.get("/llm_servers").json()["servers"][0]["healthy"] is False, 30, "unhealthy")
    refused = server.http.post("/sessions", json={})
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
    assert len(server.state.gateway) == 0
