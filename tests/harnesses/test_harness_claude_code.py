"""The `claude_code` harness preset end to end: the real Claude Code (`claude -p`, installed pinned) in a
bubblewrap sandbox without network, against its job's gateway session on the scripted test double (a
scripted LLM without a default reply: every completion is queued by the test), which drives Claude Code's
own tools as Anthropic Messages tool calls: Write a file, run Bash, start a general-purpose sub-agent with
Agent (asking for another model, which the preset overrides; the sub-agent runs Bash and answers), then a
final answer. EVAL scores the file in a fresh sandbox. Past its time budget, Claude Code is stopped with
its sandbox."""

from __future__ import annotations

import json

import pytest
from harness_fixtures import CONTEXT, command_lines, external_agent_server, harness_installed
from polling import wait_for
from prorl_handlers.harnesses import HARNESS_MOUNT
from prorl_handlers.harnesses.claude_code import ClaudeCode
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

CLAUDE = f"{HARNESS_MOUNT}/node_modules/.bin/claude"


def call(text: str, name: str, arguments: dict) -> str:
    """A reply of the double: `text`, then a Hermes-style call of Claude Code's tool `name`."""
    return f"{text}<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


WRITE = call("I will write it.", "Write", {"file_path": "/workspace/answer.txt", "content": "42\n"})
BASH = call("Let me check.", "Bash", {"command": "cat answer.txt", "description": "Show the answer file"})
AGENT = call(
    "A sub-agent double-checks.",
    "Agent",
    {
        "description": "Check the answer file",
        "prompt": "Check that answer.txt holds 42 and say so.",
        "subagent_type": "general-purpose",
        "model": "haiku",  # the preset makes it ask for the session's model all the same
        "run_in_background": False,
    },
)
SUB_BASH = call("Checking.", "Bash", {"command": "grep -c 42 answer.txt", "description": "Count lines with 42"})
SUB_FINAL = "answer.txt holds 42."
FINAL = "Done: answer.txt holds 42."


@pytest.fixture
def double(start_backend):
    """A strict scripted test double with room for Claude Code's prompt."""
    return start_backend(default_reply=None, max_model_len=CONTEXT)


@pytest.fixture
def server(start_server, double):
    return external_agent_server(start_server, double)


def instance(**fields) -> dict:
    """A claude_code instance on the answer-file task, scored by the file's content."""
    return {
        "data_source": "external_agent",
        "harness": "claude_code",
        "task": "Write 42 to answer.txt, check it, and have a sub-agent check it too.",
        "max_turns": 10,
        "collect": ["answer.txt"],
        "score": {"command": 'test "$(cat answer.txt)" = 42'},
        **fields,
    }


def model_ids(segment: dict) -> list[int]:
    """The ids the model sampled in `segment`: its response ids under mask 1."""
    return [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]


def test_claude_code_writes_runs_a_sub_agent_and_answers_and_every_turn_is_recorded(double, server):
    harness_installed("claude_code")
    double.double.push(WRITE, BASH, AGENT, SUB_BASH, SUB_FINAL, FINAL, job="j1")
    submit(server, "j1", instance=instance())
    res = result(server, "j1", timeout=120)
    artifacts = res["artifacts"]
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], artifacts)
    assert artifacts["agent"]["exit_code"] == 0 and FINAL in artifacts["agent"]["output"], artifacts["agent"]
    assert artifacts["files"] == {"answer.txt": "42\n"}
    harness = artifacts["harness"]
    assert harness["package"] == "@anthropic-ai/claude-code@" + ClaudeCode.package.version
    assert "answer.txt" in harness["changed_files"]
    assert "claude-debug.txt" in harness["logs"], harness  # its own log's end
    [recording] = artifacts["gateway"]
    assert (recording["calls"], recording["rewrites"], recording["failed_calls"]) == (6, 0, 0), recording
    # the main agent and its sub-agent: two chains of the session's model, no side call made in between
    main, sub = recording["chains"]
    assert recording["side_calls"] == 0 and not main["side_call"] and not sub["side_call"]
    assert main["model"] == sub["model"] == recording["harness_models"][0]
    assert (recording["main_chain"], recording["reward_chains"]) == (main["id"], [main["id"]])
    [main_segment] = main["segments"]
    [sub_segment] = sub["segments"]
    assert [t["text"] for t in main_segment["turns"]] == [WRITE, BASH, AGENT, FINAL]
    assert [t["text"] for t in sub_segment["turns"]] == [SUB_BASH, SUB_FINAL]
    for segment in (main_segment, sub_segment):  # each turn sent back as sampled: one segment, token-exact
        assert model_ids(segment) == [i for t in segment["turns"] for i in t["output_ids"]]
    # what Claude Code did with the calls, as it sent the results back
    results = [m["content"] for m in main_segment["messages"] if m["role"] == "tool"]
    assert "answer.txt" in results[0] and results[1].strip() == "42" and SUB_FINAL in results[2], results
    assert [m["content"].strip() for m in sub_segment["messages"] if m["role"] == "tool"] == ["1"]
    assert main_segment["messages"][0]["content"] != sub_segment["messages"][0]["content"]  # its own system prompt
    assert {k: res["trajectory"][k] for k in main_segment} == main_segment  # the job's trajectory: the main chain


def test_claude_code_past_its_time_budget_is_stopped_and_its_sandbox_closed(double, server):
    harness_installed("claude_code")
    double.double.push(ScriptedReply(text=FINAL, delay_s=60), job="j2")
    submit(server, "j2", instance=instance(time_budget_s=8))
    wait_for(lambda: len(double.double.requests) == 1, 60, "Claude Code's first call reaches the double")
    assert command_lines(CLAUDE), "Claude Code runs in the sandbox"
    res = result(server, "j2", timeout=60)
    assert res["status"] == "completed" and res["reward"] == 0.0, (res["error"], res["artifacts"])
    agent = res["artifacts"]["agent"]
    assert agent["timed_out"] and agent["exit_code"] != 0, agent
    assert res["artifacts"]["missing_files"] == ["answer.txt"]
    wait_for(lambda: double.double.requests[0].outcome == "aborted", 30, "its completion is aborted")
    [recording] = res["artifacts"]["gateway"]
    counts = (recording["chains"], recording["segments"], recording["calls"], recording["failed_calls"])
    assert counts == ([], [], 0, 1), recording  # the one call was cut off: nothing sampled
    assert server.state.orchestrator.sandboxes.live == 0
    assert command_lines(CLAUDE) == []
