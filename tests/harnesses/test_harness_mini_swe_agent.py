"""The `mini_swe_agent` harness preset end to end: the real mini-swe-agent (`python -m minisweagent.run.mini`,
installed pinned) in a bubblewrap sandbox without network, against its job's gateway session on the scripted
test double (a scripted LLM, `strict`: every completion is queued by the test), which drives mini-swe-agent's
one tool, `bash`, by Hermes-style tool calls: write a file, run a command, then its own way of finishing
(`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). EVAL scores the file in a fresh sandbox. Its step limit
(`max_turns`) and the job's time budget each stop it too."""

from __future__ import annotations

import json

import pytest
from harness_fixtures import command_lines, external_agent_server, harness_installed
from polling import wait_for
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

PROGRAM = "minisweagent.run.mini"


def bash(text: str, command: str) -> str:
    """A reply of the double: `text`, then a Hermes-style call of mini-swe-agent's `bash` tool."""
    return f"{text}<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call>"


WRITE = bash("I will write the answer.", "echo 42 > answer.txt")
CHECK = bash("Let me check it.", "cat answer.txt && wc -l answer.txt")
SUBMIT = bash("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


@pytest.fixture
def server(start_server, strict):
    return external_agent_server(start_server, strict)


def instance(**fields) -> dict:
    """A mini_swe_agent instance on the answer-file task, scored by the file's content."""
    return {
        "data_source": "external_agent",
        "harness": "mini_swe_agent",
        "task": "Write 42 to answer.txt and check it.",
        "max_turns": 10,
        "collect": ["answer.txt"],
        "score": {"command": 'test "$(cat answer.txt)" = 42'},
        **fields,
    }


def test_mini_swe_agent_writes_checks_and_submits_and_every_turn_is_recorded(strict, server):
    harness_installed("mini_swe_agent")
    strict.double.push(WRITE, CHECK, SUBMIT, job="j1")
    submit(server, "j1", instance=instance())
    res = result(server, "j1", timeout=90)
    artifacts = res["artifacts"]
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], artifacts)
    assert artifacts["agent"]["exit_code"] == 0, artifacts["agent"]
    assert artifacts["files"] == {"answer.txt": "42\n"}
    assert artifacts["harness"]["changed_files"] == ["answer.txt"]
    [trajectory] = artifacts["harness"]["logs"].values()
    assert '"exit_status": "Submitted"' in trajectory
    [recording] = artifacts["gateway"]
    assert (recording["calls"], recording["rewrites"], recording["failed_calls"]) == (3, 0, 0), recording
    [chain] = recording["chains"]
    turns = [turn for segment in chain["segments"] for turn in segment["turns"]]
    assert [turn["text"] for turn in turns] == [WRITE, CHECK, SUBMIT]
    for segment in recording["segments"]:  # what the model sampled, token-exact, where the mask is 1
        model_ids = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
        assert model_ids == [i for turn in segment["turns"] for i in turn["output_ids"]]
    # the tool results went back as tool messages: what the commands printed
    messages = recording["segments"][-1]["messages"]
    outputs = [m["content"] for m in messages if m["role"] == "tool"]
    assert '"returncode": 0' in outputs[1] and "42\\n1 answer.txt" in outputs[1], outputs


def test_the_step_limit_stops_it(strict, server):
    harness_installed("mini_swe_agent")
    strict.double.push(WRITE, CHECK, SUBMIT, job="j2")
    submit(server, "j2", instance=instance(max_turns=2))
    res = result(server, "j2", timeout=90)
    artifacts = res["artifacts"]
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], artifacts)
    assert artifacts["agent"]["exit_code"] == 0, artifacts["agent"]
    [trajectory] = artifacts["harness"]["logs"].values()
    assert '"exit_status": "LimitsExceeded"' in trajectory
    [recording] = artifacts["gateway"]
    assert recording["calls"] == 2 and len(strict.double.requests) == 2


def test_the_time_budget_stops_it_and_leaves_nothing_running(strict, server):
    harness_installed("mini_swe_agent")
    strict.double.push(WRITE, ScriptedReply(text=CHECK, delay_s=120), job="j3")
    submit(server, "j3", instance=instance(time_budget_s=15))
    wait_for(lambda: len(strict.double.requests) == 2, 60, "its second completion reaches the double")
    assert command_lines(PROGRAM), "mini-swe-agent runs, waiting for the model"
    res = result(server, "j3", timeout=90)
    artifacts = res["artifacts"]
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], artifacts)
    assert artifacts["agent"]["timed_out"] is True, artifacts["agent"]
    assert artifacts["files"] == {"answer.txt": "42\n"}
    assert strict.double.requests[0].outcome == "done"
    wait_for(lambda: strict.double.requests[1].outcome == "aborted", 30, "its completion in flight is aborted")
    assert command_lines(PROGRAM) == []
