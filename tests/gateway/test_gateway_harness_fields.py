"""What real harnesses (Claude Code, Codex CLI, OpenCode) send that a policy cannot honour, through the official
`anthropic` and `openai` clients against a server on the scripted double (which renders tools and enforces its
context as vLLM does): accepted and ignored as the vendors' APIs do for a model without those features, the
harness's `max_tokens` cut to the context's room, a too-long prompt answered in each vendor's words, no
backend address in any error, and the probes of the session's base URLs."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from gateway_sessions import close_session, open_session

from prorl_server.gateway.bridge import SessionBridge
from prorl_server.llm.chat_template import render_chat
from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_NAME, ContextRefused, ScriptedBackend, ToyChatTokenizer
from prorl_server.testing.tokenizer_files import CHAT_TEMPLATE

TOK = ToyChatTokenizer()
CONTEXT = 4096
BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
ANTHROPIC_TOOLS = [
    {"name": "bash", "description": "Run a shell command.", "input_schema": BASH},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},  # a server tool
    {"type": "bash_20250124", "name": "computer_bash"},  # an Anthropic-defined client tool
]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": BASH}},
    {"type": "custom", "custom": {"name": "apply_patch", "description": "Patch files."}},
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "bash", "description": "Run a shell command.", "parameters": BASH, "strict": False},
    {"type": "namespace", "name": "multi_agent", "tools": [{"type": "function", "name": "spawn"}]},  # Codex's
    {"type": "web_search"},
    {"type": "local_shell"},
]
ONLY_BASH = '<tools>\n{"type": "function", "function": {"name": "bash", '
EOS = "<|im_end|>"


@pytest.fixture
def small(start_backend):
    """A strict scripted backend with a 4,096-token context."""
    return start_backend(default_reply=None, max_model_len=CONTEXT)


@pytest.fixture
def server(start_server, small):
    return start_server([small.address])


def anthropic_client(session: dict) -> anthropic.Anthropic:
    base_url = session["base_url"].removesuffix("/v1")
    return anthropic.Anthropic(base_url=base_url, api_key=session["api_key"], max_retries=0, timeout=60)


def openai_client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)


def prompt_text(double: ScriptedBackend, index: int = -1) -> str:
    return TOK.decode(double.requests[index].prompt)


def user_prompt_len(content: str) -> int:
    """Tokens of a one-user-message chat prompt (the toy tokenizer: one per character)."""
    return len(TOK.encode(TOK.render([{"role": "user", "content": content}], True)))


@pytest.mark.parametrize(
    "thinking",
    [{"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}, {"type": "adaptive"}],
)
def test_claude_codes_thinking_system_turns_and_server_tools_are_accepted_and_ignored(small, server, thinking):
    small.double.push("Looking.", "Done.")
    session = open_session(server)
    client = anthropic_client(session)
    ask = {"model": MODEL_NAME, "max_tokens": 512, "system": "Be brief.", "tools": ANTHROPIC_TOOLS}
    messages: list = [
        {"role": "user", "content": "Make a file."},
        {"role": "system", "content": "Reminder: the cwd is /work."},  # as Claude Code sends it mid-conversation
    ]
    first = client.messages.create(messages=messages, thinking=thinking, **ask)
    assert [b.type for b in first.content] == ["text"] and first.content[0].text == "Looking."  # no thinking
    sent = prompt_text(small.double, 0)
    assert sent.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and ONLY_BASH in sent
    assert "web_search" not in sent and "computer_bash" not in sent
    assert sent.endswith("<|im_start|>system\nReminder: the cwd is /work.<|im_end|>\n<|im_start|>assistant\n")
    # the history sent back with a thinking block the harness kept (it is dropped), then a new turn
    assistant = [{"type": "thinking", "thinking": "hm", "signature": "sig"}, *[b.model_dump() for b in first.content]]
    messages += [{"role": "assistant", "content": assistant}, {"role": "user", "content": "Go on."}]
    second = client.messages.create(messages=messages, thinking=thinking, **ask)
    assert second.content[0].text == "Done."
    record = close_session(server, session)
    assert (record["calls"], record["rewrites"], len(record["segments"])) == (2, 0, 1)


def test_chat_completions_with_a_mid_conversation_system_message_and_a_custom_tool(small, server):
    small.double.push("Sure.")
    session = open_session(server)
    reply = openai_client(session).chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "Note."},
        ],
        tools=CHAT_TOOLS,
        reasoning_effort="high",
    )
    assert reply.choices[0].message.content == "Sure."
    sent = prompt_text(small.double)
    assert ONLY_BASH in sent and "apply_patch" not in sent
    assert sent.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nNote.<|im_end|>\n<|im_start|>assistant\n")
    assert "reasoning_effort" not in small.double.requests[0].params


@pytest.mark.parametrize("reasoning", [{}, {"effort": "high", "summary": "auto"}])
def test_codexs_include_reasoning_and_namespace_tools_are_accepted_and_ignored(small, server, reasoning):
    small.double.push("Hello.", "Again.")
    session = open_session(server)
    client = openai_client(session)
    ask = {
        "model": MODEL_NAME,
        "instructions": "You are Codex.",
        "tools": RESPONSES_TOOLS,
        "include": ["reasoning.encrypted_content"],
        "reasoning": reasoning,
        "text": {"verbosity": "low"},
        "store": False,
    }
    items: list = [{"role": "user", "content": "Hi"}]
    first = client.responses.create(input=items, **ask)
    assert [item.type for item in first.output] == ["message"] and first.output_text == "Hello."
    sent = prompt_text(small.double, 0)
    assert ONLY_BASH in sent and "multi_agent" not in sent and "web_search" not in sent and "local_shell" not in sent
    # a reasoning item sent back, as Codex keeps them with include=reasoning.encrypted_content, is dropped
    reasoning_item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    items += [reasoning_item, *[item.model_dump() for item in first.output], {"role": "user", "content": "More"}]
    assert client.responses.create(input=items, **ask).output_text == "Again."
    record = close_session(server, session)
    assert (record["calls"], record["rewrites"]) == (2, 0)


def test_max_tokens_is_cut_to_the_room_the_prompt_leaves_in_each_dialect(small, start_server):
    server = start_server([small.address])
    small.double.push("a", "b", "c", "d")
    session = open_session(server)
    room = CONTEXT - user_prompt_len("Hi")
    anthropic_client(session).messages.create(
        model=MODEL_NAME, max_tokens=64_000, messages=[{"role": "user", "content": "Hi"}]
    )
    client = openai_client(session)
    client.chat.completions.create(
        model=MODEL_NAME, max_completion_tokens=64_000, messages=[{"role": "user", "content": "Hi"}]
    )
    client.responses.create(model=MODEL_NAME, max_output_tokens=64_000, input="Hi")
    almost_full = "x" * (CONTEXT - 1 - user_prompt_len(""))  # leaves exactly one token
    client.chat.completions.create(
        model=MODEL_NAME, max_tokens=64_000, messages=[{"role": "user", "content": almost_full}]
    )
    sent = [(len(r.prompt), r.params["max_tokens"]) for r in small.double.requests]
    assert sent == [(CONTEXT - room, room)] * 3 + [(CONTEXT - 1, 1)]
    assert [r.outcome for r in small.double.requests] == ["done"] * 4
    close_session(server, session)
    # the trainer's max_tokens is cut too, and one within the room is sent as it is
    small.double.push("e", "f")
    trainer = open_session(server, sampling_params={"max_tokens": 64_000}, harness_params=[])
    openai_client(trainer).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}])
    openai_client(trainer).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    assert [r.params["max_tokens"] for r in small.double.requests[4:]] == [room, room]
    own = open_session(server, sampling_params={"max_tokens": 7}, harness_params=[])
    small.double.push("g")
    openai_client(own).chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}])
    assert small.double.requests[-1].params["max_tokens"] == 7


def test_a_prompt_too_long_for_the_context_gets_each_vendors_error_and_the_harness_can_compact(small, server):
    session = open_session(server)
    long = "x" * CONTEXT
    tokens = user_prompt_len(long)
    with pytest.raises(anthropic.BadRequestError) as too_long:
        anthropic_client(session).messages.create(
            model=MODEL_NAME, max_tokens=100, messages=[{"role": "user", "content": long}]
        )
    assert too_long.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {tokens} tokens > {CONTEXT - 1} maximum",
        },
    }
    with (
        pytest.raises(anthropic.BadRequestError) as streamed,
        anthropic_client(session).messages.stream(
            model=MODEL_NAME, max_tokens=100, messages=[{"role": "user", "content": long}]
        ) as stream,
    ):
        stream.get_final_message()
    assert "prompt is too long" in streamed.value.message
    client = openai_client(session)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": long}])
    assert (chat.value.code, chat.value.param, chat.value.type) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert chat.value.body["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens. However, your messages resulted in {tokens} "
        "tokens. Please reduce the length of the messages."
    )
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=MODEL_NAME, input=long, stream=True)
    assert (responses.value.code, responses.value.param) == ("context_length_exceeded", "input")
    assert "exceeds the context window" in responses.value.message
    # a prompt filling the context exactly leaves no room: refused too
    exact = "x" * (CONTEXT - user_prompt_len(""))
    with pytest.raises(openai.BadRequestError) as full:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": exact}])
    assert full.value.code == "context_length_exceeded" and f"resulted in {CONTEXT} tokens" in full.value.message
    assert small.double.requests == []  # nothing was sampled
    small.double.push("Short now.")
    compacted = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Summary."}])
    assert compacted.choices[0].message.content == "Short now."
    record = close_session(server, session)
    assert (record["calls"], record["failed_calls"], len(record["segments"])) == (1, 0, 1)


def test_no_error_a_harness_sees_names_the_backend(small, start_server):
    server = start_server([small.address], llm_max_failovers=0, llm_retry_budget_s=0.5)
    address = small.address.removesuffix("/v1").removeprefix("http://")
    session = open_session(server)
    small.double.push(ScriptedReply(text="x", status_code=400), ScriptedReply(text="x", status_code=400))
    small.double.push(ScriptedReply(text="x", status_code=500), ScriptedReply(text="x", status_code=500))
    client = openai_client(session)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "a"}])
    assert refused.value.code == "backend_rejected" and "scripted failure 400" in refused.value.message
    with pytest.raises(anthropic.BadRequestError) as refused_anthropic:
        anthropic_client(session).messages.create(
            model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": "a"}]
        )
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "a"}])
    assert failed.value.status_code == 503
    with pytest.raises(openai.InternalServerError) as failed_responses:
        client.responses.create(model=MODEL_NAME, input="a")
    small.server.stop()  # the backend is gone
    with pytest.raises(anthropic.APIStatusError) as gone:
        anthropic_client(session).messages.create(
            model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": "b"}]
        )
    assert gone.value.status_code == 529
    bodies = [e.value.response.text for e in (refused, refused_anthropic, failed, failed_responses, gone)]
    assert all(address not in body and "127.0.0.1" not in body for body in bodies), bodies


async def test_head_and_get_of_the_session_base_urls_answer_its_probe(small, start_server, tmp_path):
    server = start_server([small.address], api_key="operator-key")
    session = server.http.post("/sessions", json={}, headers={"Authorization": "Bearer operator-key"}).json()
    root = session["base_url"].removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        for url in (root, session["base_url"]):
            for headers in ({"x-api-key": session["api_key"]}, {"Authorization": f"Bearer {session['api_key']}"}):
                head = await http.head(url, headers=headers)
                assert (head.status_code, head.content) == (200, b""), url
            got = await http.get(url, headers={"x-api-key": session["api_key"]})
            assert got.json() == {"object": "session", "id": session["session_id"], "models": [MODEL_NAME]}
            assert got.headers["content-length"] == head.headers["content-length"]
            assert (await http.head(url, headers={"x-api-key": "sk-wrong"})).status_code == 401
        # the trainer's DELETE of the same path still needs the server's key
        assert (await http.delete(root, headers={"x-api-key": session["api_key"]})).status_code == 401
        # through a sandbox's bridge: HEAD and GET of / and /v1
        bridge = await SessionBridge.open(session["base_url"], session["api_key"], 1 << 20, tmp_path)
        try:
            transport = httpx.AsyncHTTPTransport(uds=str(bridge.socket_path))
            async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as inside:
                for path in ("/", "/v1"):
                    head = await inside.head(path)
                    assert (head.status_code, head.content) == (200, b""), path
                    assert (await inside.get(path)).json()["id"] == session["session_id"]
        finally:
            await bridge.close()
    assert (
        server.http.delete(
            f"/sessions/{session['session_id']}", headers={"Authorization": "Bearer operator-key"}
        ).status_code
        == 200
    )


def devllm_refusal(prompt_len: int, requested: int | None, n_ctx: int) -> str:
    """What the dev engine (worded as vLLM) answers a completion of `prompt_len` ids asking for `requested`."""
    from prorl_server.devllm.errors import DevLLMRequestError
    from prorl_server.devllm.validation import fit_context, sampling_params
    from prorl_server.protocol.vllm import CompletionRequest

    try:
        room = fit_context(prompt_len, requested, n_ctx=n_ctx)
        sampling_params(CompletionRequest(prompt=[1]), max_tokens=room, logprobs=None, n_vocab=1000)
    except DevLLMRequestError as exc:
        return exc.message
    raise AssertionError("the dev engine took it")


def test_the_doubles_context_errors_and_template_are_vllms(start_backend):
    double = ScriptedBackend(max_model_len=100)
    for prompt_len, requested in [(10, 101), (101, None), (100, None), (100, 5)]:
        with pytest.raises(ContextRefused) as ours:
            double.fit_context(prompt_len, requested)
        assert str(ours.value) == devllm_refusal(prompt_len, requested, 100)
    assert double.fit_context(40, 90) == 60 and double.fit_context(40, None) == 60 and double.fit_context(40, 5) == 5
    # the tokenizer files' template renders what the double renders, tools and a mid-conversation system turn
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run ü", "parameters": BASH}}]
    for messages in (
        [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "system", "content": "m"}],
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}],
    ):
        for with_tools in (tools, None):
            for generation in (True, False):
                rendered = render_chat(CHAT_TEMPLATE, messages, add_generation_prompt=generation, tools=with_tools)
                assert rendered == TOK.render(messages, generation, with_tools)
    # over HTTP: vLLM's 400, nothing recorded, and the context advertised
    backend = start_backend(default_reply="ok", max_model_len=100)
    with httpx.Client(base_url=backend.server.url) as http:
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 100
        refused = http.post("/v1/completions", json={"prompt": list(range(20, 121)), "max_tokens": 5})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "input_tokens"
        cut = http.post("/v1/completions", json={"prompt": list(range(20, 118)), "max_tokens": 50, "logprobs": 0})
        assert cut.json()["usage"]["completion_tokens"] == 2 and cut.json()["choices"][0]["finish_reason"] == "length"
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 100}]})
        assert chat.status_code == 400 and "maximum context length is 100" in chat.json()["error"]["message"]
    assert [len(r.prompt) for r in backend.double.requests] == [98]
