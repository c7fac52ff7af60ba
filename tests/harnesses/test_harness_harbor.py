"""Harness presets on Harbor tasks (`agent: "harness"`): the real Claude Code and Codex CLI, installed pinned and
bound read-only into the sandbox of a shipped task's image (built once for the module, as in
test_handler_harbor.py: FROM mapped to the local Debian base, which has neither Node.js nor the host's Python),
solve count-lines through their job's gateway session on the scripted test double (strict: a scripted LLM
without a default reply, every completion queued by the test), which plays the policy with each harness's own
tool calls. The task's own tests give reward 1.0, the chain is token-exact, the harness exits 0; the job's
`agent_config.max_turns` reaches Claude Code's turn limit; and Claude Code does the same under Podman."""

from __future__ import annotations

import json
import os

import pytest
import test_handler_harbor as harbor_tests
from harness_fixtures import CONTEXT, harness_installed
from prorl_handlers.harbor import HarborHandler
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason

ANSWER = "awk '$9 == 404' /app/access.log | wc -l > /app/answer.txt && cat /app/answer.txt"
REQUIRE_PODMAN = os.environ.get("PRORL_REQUIRE_PODMAN") == "1"
cache = harbor_tests.cache  # the Harbor tests' fixture: this module's image cache, each image built once


def call(text: str, name: str, arguments: dict) -> str:
    """A reply of the double: `text`, then a Hermes-style call of the harness's tool `name`."""
    return f"{text}<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


REPLIES = {  # each harness's own shell tool, then its final answer
    "claude_code": [call("Counting.", "Bash", {"command": ANSWER, "description": "Count the 404s"}), "Done."],
    "codex": [call("Counting.", "exec_command", {"cmd": ANSWER}), "Done."],
}


@pytest.fixture
def strict(start_backend):
    """The strict scripted test double, with room for the harnesses' prompts."""
    return start_backend(default_reply=None, max_model_len=CONTEXT)


def harbor_server(start_server, strict, cache, runtime: str):
    """A server with the harbor handler over the shipped tasks on `runtime`."""
    if (reason := unavailable_reason(runtime)) is not None and not (runtime == "podman" and REQUIRE_PODMAN):
        pytest.skip(f"{runtime}: {reason}")
    handler = HarborHandler(harbor_tests.TASKS_DIR, harbor_tests.BASE_MAP, cache)
    server = start_server([strict.address], handlers={"harbor": handler}, runtime=runtime)
    server.state.gateway.public_url = server.url  # the test server binds a free port
    return server


def solve_count_lines(server, strict, harness: str, job: str, **extra) -> dict:
    """Run `harness` on count-lines with its scripted replies; the result, checked: reward 1.0 from the task's
    tests, exit 0, the harness's answer in its file, one chain of one segment holding each turn token-exact."""
    harness_installed(harness)
    replies = REPLIES[harness]
    strict.double.push(*replies, job=job)
    submit(
        server,
        job,
        instance={"data_source": "harbor", "task": "count-lines", "agent": "harness", "harness": harness},
        **extra,
    )
    res = result(server, job, timeout=600)
    artifacts = res["artifacts"]
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], artifacts, res["eval"])
    assert artifacts["agent"]["exit_code"] == 0 and not artifacts["agent"]["timed_out"], artifacts["agent"]
    assert artifacts["harness"]["changed_files"] == ["answer.txt"], artifacts["harness"]
    prompt = strict.double.tokenizer.decode(strict.double.requests[0].prompt)
    assert "/app/access.log" in prompt and "status code 404" in prompt  # the task's instruction.md
    [recording] = artifacts["gateway"]
    counts = (recording["calls"], recording["side_calls"], recording["rewrites"], recording["failed_calls"])
    assert counts == (len(replies), 0, 0, 0), recording
    [chain] = recording["chains"]
    [segment] = chain["segments"]
    assert recording["main_chain"] == chain["id"] and [t["text"] for t in segment["turns"]] == replies
    sampled = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert sampled == [i for t in segment["turns"] for i in t["output_ids"]]
    [output] = [m["content"] for m in segment["messages"] if m["role"] == "tool"]
    count = res["eval"]["test_output"].split()[1].rstrip(",")  # "expected N, got 'N'"
    assert f"expected {count}, got '{count}'" in res["eval"]["test_output"] and count in output, output
    return res


@pytest.mark.parametrize("harness", ["claude_code", "codex"])
def test_a_harness_solves_a_harbor_task_in_its_image_under_bubblewrap(start_server, strict, cache, harness):
    server = harbor_server(start_server, strict, cache, "bwrap")
    res = solve_count_lines(server, strict, harness, f"{harness}-bwrap")
    assert res["artifacts"]["harness"]["name"] == harness


def test_the_job_s_max_turns_is_claude_code_s_turn_limit(start_server, strict, cache):
    """agent_config.max_turns 1: Claude Code runs the one tool call and stops there, asking no second time."""
    server = harbor_server(start_server, strict, cache, "bwrap")
    harness_installed("claude_code")
    strict.double.push(REPLIES["claude_code"][0], job="one-turn")
    instance = {"data_source": "harbor", "task": "count-lines", "agent": "harness", "harness": "claude_code"}
    submit(server, "one-turn", instance=instance, agent_config={"max_turns": 1})
    res = result(server, "one-turn", timeout=600)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"], res["eval"])
    assert res["artifacts"]["agent"]["exit_code"] != 0 and "max turns" in res["artifacts"]["agent"]["output"].lower()
    assert len(strict.double.requests) == 1


def test_claude_code_solves_a_harbor_task_under_podman(start_server, strict, cache):
    server = harbor_server(start_server, strict, cache, "podman")
    solve_count_lines(server, strict, "claude_code", "claude_code-podman")
