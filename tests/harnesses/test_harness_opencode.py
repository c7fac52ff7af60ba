"""The `opencode` harness preset end to end: the real OpenCode (the pinned npm `opencode-ai`) runs in a
bubblewrap sandbox without network against its job's gateway session, whose backend is the scripted test
double (a scripted LLM with a one-token-per-character tokenizer).

The double scripts OpenCode's own tool calls (`write` a file, `bash` a command, `task` a `general` sub-agent,
which runs `glob`: ripgrep, installed beside OpenCode) and final answers. OpenCode's title call names its small
model: a side call, in a chain of its own. Replies are queued by prompt, not by job, since the title call and
the first main call run at the same time.
"""

from __future__ import annotations

import json

import pytest
from harness_fixtures import CONTEXT, command_lines, external_agent_server, harness_installed
from polling import wait_for
from prorl_handlers.harnesses import HARNESS_MOUNT
from prorl_handlers.harnesses.opencode import SMALL_MODEL
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

TASK = "Write 42 to answer.txt, show it, and have a sub-agent list the files."
SUBTASK = "List the files in /workspace and report them."
TITLE = "Answer file"
SUB_ANSWER = "The only file is answer.txt."
FINAL = "Done: answer.txt holds 42."
TITLE_PROMPT = "You are a title generator"
OPENCODE = f"{HARNESS_MOUNT}/node_modules/.bin/opencode"  # its processes, as a sandbox runs it


def call(name: str, arguments: dict[str, str], text: str = "") -> str:
    """A reply making one tool call, as the double's Hermes-style template has the model write it."""
    return f"{text}<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SUB = [call("glob", {"pattern": "*"}), SUB_ANSWER]
MAIN = [
    call("write", {"filePath": "/workspace/answer.txt", "content": "42\n"}, "I will write it."),
    call("bash", {"command": "cat answer.txt"}),
    call("task", {"description": "List the files", "prompt": SUBTASK, "subagent_type": "general"}),
    FINAL,
]


@pytest.fixture
def strict(start_backend):
    """The scripted double without a default reply, with room for OpenCode's ~31k-character first prompt."""
    return start_backend(default_reply=None, max_model_len=CONTEXT)


@pytest.fixture
def server(start_server, strict):
    harness_installed("opencode")
    return external_agent_server(start_server, strict)


def instance(**extra) -> dict:
    """An `opencode` instance on TASK whose score checks answer.txt."""
    return {
        "data_source": "external_agent",
        "harness": "opencode",
        "task": TASK,
        "max_turns": 8,
        "collect": ["answer.txt"],
        "score": {"command": 'test "$(cat answer.txt)" = 42'},
        **extra,
    }


def test_opencode_writes_runs_delegates_and_answers_each_turn_recorded_as_sampled(strict, server):
    strict.double.push(TITLE, prompt=TITLE_PROMPT)
    strict.double.push(*SUB, prompt_regex=rf"<\|im_start\|>user\n{SUBTASK}")
    strict.double.push(*MAIN)
    submit(server, "j1", instance=instance())
    res = result(server, "j1", timeout=120)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    artifacts = res["artifacts"]
    assert (artifacts["agent"]["exit_code"], artifacts["agent"]["timed_out"]) == (0, False), artifacts["agent"]
    assert artifacts["agent"]["output"].rstrip().endswith(FINAL)
    assert artifacts["files"] == {"answer.txt": "42\n"}
    assert artifacts["harness"]["changed_files"] == ["answer.txt"]
    [log] = artifacts["harness"]["logs"].values()  # its own log, naming the session's provider and model
    assert "providerID=prorl modelID=policy" in log
    [recording] = artifacts["gateway"]
    counts = {k: recording[k] for k in ("calls", "side_calls", "rewrites", "failed_calls")}
    assert counts == {"calls": 7, "side_calls": 1, "rewrites": 0, "failed_calls": 0}
    # the title call and the main agent's first call are sent at once: their chains come in either order
    [title] = [c for c in recording["chains"] if c["side_call"]]
    [main] = [c for c in recording["chains"] if c["id"] == recording["main_chain"]]
    [sub] = [c for c in recording["chains"] if c["id"] not in (title["id"], main["id"])]
    assert (title["model"], title["side_call"]) == (SMALL_MODEL, True)
    assert not main["side_call"] and not sub["side_call"] and main["model"] == sub["model"] != SMALL_MODEL
    assert (recording["main_chain"], recording["reward_chains"]) == (main["id"], [main["id"]])
    texts = {c["id"]: [t["text"] for s in c["segments"] for t in s["turns"]] for c in recording["chains"]}
    assert texts == {title["id"]: [TITLE], main["id"]: MAIN, sub["id"]: SUB}
    for chain in recording["chains"]:  # every sampled token is in its chain, where the mask says the model's
        [segment] = chain["segments"]
        model_ids = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
        assert model_ids == [i for t in segment["turns"] for i in t["output_ids"]]
    [segment] = main["segments"]
    tools = [m["content"] for m in segment["messages"] if m["role"] == "tool"]
    assert tools[:2] == ["Wrote file successfully.", "42\n"] and SUB_ANSWER in tools[2]
    assert {k: res["trajectory"][k] for k in segment} == segment  # the job's trajectory is the main chain
    [found] = [m["content"] for m in sub["segments"][0]["messages"] if m["role"] == "tool"]
    assert found == "/workspace/answer.txt"  # ripgrep ran (without it OpenCode would download it)
    assert len(segment["prompt_ids"]) > 20_000  # its system prompt and tool schemas: ~30k characters


def test_opencode_past_its_time_budget_is_stopped_and_leaves_no_process(strict, server):
    strict.double.push(TITLE, prompt=TITLE_PROMPT)
    strict.double.push(ScriptedReply(text=FINAL, delay_s=60))
    submit(server, "j2", instance=instance(time_budget_s=15))
    wait_for(lambda: any(r.source == "global queue" for r in strict.double.requests), 60, "its first call")
    assert command_lines(OPENCODE), "OpenCode runs while its call is answered"
    res = result(server, "j2", timeout=60)
    assert res["status"] == "completed" and res["reward"] == 0.0, (res["error"], res["artifacts"])
    assert res["artifacts"]["agent"]["timed_out"] is True
    assert res["artifacts"]["missing_files"] == ["answer.txt"]
    wait_for(lambda: not command_lines(OPENCODE), 30, "no OpenCode process left")
    assert server.state.orchestrator.sandboxes.live == 0
    [main] = [r for r in strict.double.requests if r.source == "global queue"]
    wait_for(lambda: main.outcome == "aborted", 30, "its call is aborted")
