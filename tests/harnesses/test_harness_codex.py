"""The `codex` harness preset end to end: the real Codex CLI (npm @openai/codex, pinned) runs `codex exec` in
a bubblewrap sandbox without network against its job's gateway session (OpenAI Responses) on the scripted
test double, which plays the policy: it makes Codex call its own tools, `update_plan`, `exec_command` with
`apply_patch` (which Codex intercepts and applies itself) and `exec_command` again, then answer. The file
lands on disk and is scored, every sampled token is in the recorded chain; and a Codex that runs past its
time budget is stopped, with nothing of it left running."""

from __future__ import annotations

import json
import uuid

import pytest
from harness_fixtures import CONTEXT, command_lines, external_agent_server, harness_installed
from polling import wait_for
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

PATCH = "*** Begin Patch\n*** Add File: answer.sh\n+echo $((6 * 7))\n*** End Patch\n"
PLAN = {"plan": [{"step": "Write answer.sh", "status": "in_progress"}, {"step": "Run it", "status": "pending"}]}
CALLS = [
    ("I will plan it.", {"name": "update_plan", "arguments": PLAN}),
    ("Writing the script.", {"name": "exec_command", "arguments": {"cmd": f"apply_patch <<'EOF'\n{PATCH}EOF"}}),
    ("Running it.", {"name": "exec_command", "arguments": {"cmd": "bash answer.sh > answer.txt && cat answer.txt"}}),
]
REPLIES = [f"{say}<tool_call>\n{json.dumps(call)}\n</tool_call>" for say, call in CALLS]
FINAL = "answer.txt holds 42."


@pytest.fixture
def double(start_backend):
    """The scripted test double, strict (every completion scripted), with room for Codex's prompt."""
    return start_backend(default_reply=None, max_model_len=CONTEXT)


@pytest.fixture
def server(start_server, double):
    return external_agent_server(start_server, double)


def codex_instance(task: str, **extra) -> dict:
    return {"data_source": "external_agent", "harness": "codex", "task": task, "max_turns": 10, **extra}


def test_codex_plans_patches_and_runs_with_its_own_tools_and_every_turn_is_recorded_token_exact(double, server):
    harness_installed("codex")
    double.double.push(*REPLIES, FINAL, job="j1")
    instance = codex_instance(
        "Write answer.sh printing 6*7 and save its output in answer.txt.",
        collect=["answer.sh", "answer.txt"],
        score={"command": 'test "$(bash answer.sh)" = 42 && test "$(cat answer.txt)" = 42'},
        time_budget_s=60,
    )
    submit(server, "j1", instance=instance)
    res = result(server, "j1", timeout=90)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    artifacts = res["artifacts"]
    assert artifacts["agent"]["exit_code"] == 0 and not artifacts["agent"]["timed_out"], artifacts["agent"]
    output = artifacts["agent"]["output"]
    assert f"codex\n{FINAL}\n" in output and "could not create PATH aliases" not in output, output
    assert artifacts["files"] == {"answer.sh": "echo $((6 * 7))\n", "answer.txt": "42\n"}
    harness = artifacts["harness"]
    assert (harness["package"], harness["changed_files"]) == ("@openai/codex@0.171.0", ["answer.sh", "answer.txt"])
    [rollout] = harness["logs"].values()  # its session's own record
    assert FINAL in rollout

    # what Codex offered the policy: its shell and plan tools; no sub-agents, web search or bundled skills
    first = double.double.tokenizer.decode(double.double.requests[0].prompt)
    assert '"name": "exec_command"' in first and '"name": "update_plan"' in first
    assert "spawn_agent" not in first and "web_search" not in first and "imagegen" not in first
    assert [r.job_id for r in double.double.requests] == ["j1"] * 4

    # one chain (Codex exec makes no side calls), each turn's sampled tokens in it where the mask is 1
    [recording] = artifacts["gateway"]
    assert (recording["calls"], recording["side_calls"], recording["rewrites"], recording["failed_calls"]) == (
        4,
        0,
        0,
        0,
    )
    [chain] = recording["chains"]
    assert (chain["side_call"], recording["main_chain"]) == (False, chain["id"])
    [segment] = recording["segments"]
    assert [t["text"] for t in segment["turns"]] == [*REPLIES, FINAL]
    model_ids = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert model_ids == [i for t in segment["turns"] for i in t["output_ids"]]
    outputs = [m["content"] for m in segment["messages"] if m["role"] == "tool"]
    assert outputs[0] == "Plan updated" and "A answer.sh" in outputs[1] and "42" in outputs[2], outputs


def test_codex_past_its_time_budget_is_stopped_and_leaves_nothing_running(double, server):
    harness_installed("codex")
    double.double.push(ScriptedReply(text=FINAL, delay_s=60), job="j2")
    marker = f"Wait for it {uuid.uuid4().hex}."
    instance = codex_instance(marker, collect=["answer.txt"], score={"command": "test -e answer.txt"}, time_budget_s=4)
    submit(server, "j2", instance=instance)
    wait_for(lambda: command_lines(marker), 30, "codex is running")
    res = result(server, "j2", timeout=60)
    assert res["status"] == "completed" and res["reward"] == 0.0, (res["error"], res["artifacts"])
    assert res["artifacts"]["agent"]["timed_out"] is True, res["artifacts"]["agent"]
    assert res["artifacts"]["missing_files"] == ["answer.txt"]
    wait_for(lambda: not command_lines(marker), 30, "no process of codex is left")
    assert server.state.orchestrator.sandboxes.live == 0
    wait_for(lambda: double.double.requests[0].outcome == "aborted", 30, "its completion is aborted")
