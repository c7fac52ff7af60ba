"""Anthropic's Messages API on a gateway session, driven by the official `anthropic` client against the
scripted test double: answers in Anthropic's shape (plain, streamed, with tool use), one token-exact segment
for a multi-turn tool-using conversation, errors in Anthropic's shape, keys, and model names."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

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
    return start_server([strict.address])


def open_session(server, **body) -> dict:
    answer = server.http.post("/sessions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def close_session(server, session: dict) -> dict:
    answer = server.http.delete(f"/sessions/{session['session_id']}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def anthropic_url(session: dict) -> str:
    """What ANTHROPIC_BASE_URL is: the session's base URL without `/v1` (the client adds `/v1/messages`)."""
    return session["base_url"].removesuffix("/v1")


def client_for(session: dict) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=anthropic_url(session), api_key=session["api_key"], max_retries=0, timeout=60)


def toy_template(messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return TOK.encode(TOK.render(messages, add_generation_prompt))


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
    assert context + TOK.encode("\n") == toy_template(openai_form, False)


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
