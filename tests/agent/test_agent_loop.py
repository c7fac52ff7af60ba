"""The shared agent loop: Hermes tool-call parsing, argument checks, and whole episodes through a real server
with a bubblewrap sandbox and the scripted test-double LLM (which decides what the "model" says)."""

from __future__ import annotations

import json

import pytest

from prorl_server import AgentHandler, JobContext
from prorl_server.agent import (
    AgentLoop,
    MalformedCall,
    Tool,
    ToolArgumentError,
    ToolCall,
    bash_tool,
    parse_tool_calls,
    submit_tool,
)
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing.scripted_backend import ToyChatTokenizer

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# parsing -----------------------------------------------------------------------------------------


def test_parses_every_call_of_a_turn_in_order():
    text = f"Let me check.\n{call('bash', command='ls')}\nand\n{call('submit', answer='7')}"
    assert parse_tool_calls(text) == [ToolCall("bash", {"command": "ls"}), ToolCall("submit", {"answer": "7"})]
    assert parse_tool_calls("no calls here") == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```', ToolCall("bash", {"command": "ls"})),
        ('{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}', ToolCall("bash", {"command": "ls"})),
        ('{"name": "submit"}', ToolCall("submit", {})),
    ],
)
def test_tolerates_fenced_json_string_arguments_and_missing_arguments(body, expected):
    assert parse_tool_calls(f"<tool_call>{body}</tool_call>") == [expected]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"name": "bash", "arguments": {"command": "ls"', "not valid JSON"),
        ('{"arguments": {}}', 'string "name"'),
        ('["bash"]', 'string "name"'),
        ('{"name": "bash", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "bash", "arguments": "not json"}', "not JSON"),
    ],
)
def test_malformed_calls_become_messages_that_show_the_format(body, says):
    (parsed,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert isinstance(parsed, MalformedCall) and says in parsed.message and "<tool_call>" in parsed.message


def test_an_unclosed_last_call_is_still_read():
    assert parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}') == [
        ToolCall("bash", {"command": "pwd"})
    ]


def test_arguments_are_checked_against_the_schema():
    tool = Tool(
        "t",
        "",
        {"type": "object", "properties": {"n": {"type": "integer"}, "mode": {"enum": ["a", "b"]}}, "required": ["n"]},
    )
    assert tool.check({"n": 3, "mode": "a"}) == {"n": 3, "mode": "a"}
    for bad, says in [
        ({}, "needs"),
        ({"n": 1, "x": 2}, "no argument"),
        ({"n": "3"}, "integer"),
        ({"n": True}, "integer"),
        ({"n": 1, "mode": "c"}, "one of"),
    ]:
        with pytest.raises(ToolArgumentError, match=says):
            tool.check(bad)


def test_tool_names_must_be_unique():
    with pytest.raises(ValueError, match="unique"):
        AgentLoop([bash_tool(), bash_tool()], "x")


# episodes ----------------------------------------------------------------------------------------

pytestmark_bwrap = pytest.mark.skipif(
    unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}"
)


class LoopHandler(AgentHandler):
    """A bash-and-submit agent on the shared loop; reward 1 when the submitted answer is 42."""

    name = "loop"

    def __init__(self, **options) -> None:
        self.loop = AgentLoop([bash_tool(), submit_tool(parameters=ANSWER)], "Answer with the submit tool.", **options)

    async def init(self, ctx: JobContext) -> None:
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        result = await self.loop.run(ctx, ctx.instance["question"])
        ctx.artifacts["answer"] = (result.submission or {}).get("answer")

    async def eval(self, ctx: JobContext) -> float:
        return float(ctx.artifacts["answer"] == "42")


def run_job(start_server, backend, handler: AgentHandler, replies: list[str], **sampling) -> dict:
    backend.double.push(*replies)
    server = start_server([backend.address], handlers={"loop": handler}, runtime="bwrap")
    body = {"instance": {"data_source": "loop", "question": "What is 6 * 7?"}, "sampling_params": sampling}
    result = server.http.post("/process", json=body).json()
    assert result["status"] == "completed", result
    return result


def observations(result: dict) -> list[str]:
    return [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool"]


@pytestmark_bwrap
def test_an_episode_runs_tools_reads_errors_and_ends_on_submit(start_server, backend):
    replies = [
        f"I will compute it. {call('bash', command='echo $((6 * 7)); cd /tmp')}",
        '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>',  # malformed
        f"{call('python', code='1')}{call('bash', cmd='pwd')}{call('bash', command='pwd; (exit 3)')}",
        "Hmm, no call this time.",
        f"{call('submit', answer='42')}{call('bash', command='echo never runs')}",
    ]
    result = run_job(start_server, backend, LoopHandler(), replies)
    assert result["reward"] == 1.0
    assert result["artifacts"]["agent"] == {
        "stop_reason": "submitted",
        "turns": 5,
        "tool_calls": 6,
        "tool_errors": 3,
        "submitted": True,
    }
    seen = observations(result)
    assert seen[0].strip() == "42"
    assert "not valid JSON" in seen[1]
    assert "there is no tool 'python'" in seen[2] and "needs the argument(s) command" in seen[3]
    assert seen[4] == "/tmp\n[exit code: 3]"  # the shell kept its working directory
    assert len(seen) == 5  # nothing ran after submit
    reminders = [m["content"] for m in result["trajectory"]["messages"][2:] if m["role"] == "user"]
    assert len(reminders) == 1 and "No tool call found" in reminders[0]  # the loop's own message: a user turn

    traj = result["trajectory"]
    model_tokens = [t for t, m in zip(traj["response_ids"], traj["response_mask"], strict=True) if m == 1]
    assert model_tokens == [t for turn in traj["turns"] for t in turn["output_ids"]]
    eos = ToyChatTokenizer().eos_id
    assert all(turn["output_ids"][-1] == eos for turn in traj["turns"])


@pytestmark_bwrap
def test_max_turns_ends_an_episode_without_submission(start_server, backend):
    result = run_job(start_server, backend, LoopHandler(), ["thinking", "still thinking", "more"], max_turns=2)
    assert result["artifacts"]["agent"]["stop_reason"] == "max_turns"
    assert result["artifacts"]["agent"]["turns"] == 2 and result["reward"] == 0.0
    assert len(result["trajectory"]["turns"]) == 2


@pytestmark_bwrap
def test_a_turn_without_a_call_can_end_the_episode(start_server, backend):
    result = run_job(start_server, backend, LoopHandler(on_no_tool_call="finish"), ["The answer is 42."])
    assert result["artifacts"]["agent"] == {
        "stop_reason": "no_tool_call",
        "turns": 1,
        "tool_calls": 0,
        "tool_errors": 0,
        "submitted": False,
    }


@pytestmark_bwrap
def test_the_context_guard_stops_before_a_turn_could_overflow(start_server, backend):
    probe = run_job(start_server, backend, LoopHandler(), ["x"], max_turns=1)
    prompt_len = len(probe["trajectory"]["prompt_ids"])
    limit = prompt_len + 50 + 5  # room for the first turn's max_tokens, not for a second turn
    replies = [call("bash", command="echo hi"), call("submit", answer="42")]
    result = run_job(start_server, backend, LoopHandler(), replies, max_tokens=50, max_context_length=limit)
    assert result["artifacts"]["agent"]["stop_reason"] == "context_length"
    assert result["artifacts"]["agent"]["turns"] == 1
    assert len(result["trajectory"]["prompt_ids"]) + 50 <= limit


@pytestmark_bwrap
@pytest.mark.parametrize(("sampling", "sent"), [({}, False), ({"skip_special_tokens": True}, True)])
def test_turns_keep_special_tokens_for_the_parser_unless_the_trainer_says(start_server, backend, sampling, sent):
    """Calls written with special tokens (gpt-oss, Mistral) reach the parser only when vLLM keeps them in the
    text; the trainer's own `skip_special_tokens` is sent as it is."""
    run_job(start_server, backend, LoopHandler(), [call("submit", answer="42")], **sampling)
    [request] = backend.double.requests
    assert request.params["skip_special_tokens"] is sent
