"""The `terminus` preset end to end under bubblewrap: Harbor's real Terminus-2 (installed, pinned, by
`harness_installed`) runs in a sandbox without network, driving its own tmux session there, against its
job's gateway session on the scripted test double (a scripted LLM), which answers in Terminus-2's JSON
format: one turn that writes a file and reads it back, one that marks the task complete, and the
confirmation Terminus-2 asks for. EVAL scores the collected file in a fresh sandbox. A run past its time
budget ends with the sandbox, its tmux server and all."""

from __future__ import annotations

import json
import sys

import pytest
from harness_fixtures import command_lines, external_agent_server, harness_installed
from polling import wait_for
from prorl_handlers.harnesses import HarnessInstallError, Package
from prorl_handlers.harnesses.install import PYTHON_ENV, find_python
from prorl_handlers.harnesses.terminus import Terminus
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason

BWRAP = unavailable_reason("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")


def reply(analysis: str, keystrokes: list[str], *, complete: bool = False, duration: float = 0.1) -> str:
    """A Terminus-2 turn in its JSON format."""
    commands = [{"keystrokes": keys, "duration": duration} for keys in keystrokes]
    return json.dumps({"analysis": analysis, "plan": analysis, "commands": commands, "task_complete": complete})


WRITE = reply("Nothing done yet.", ["echo 42 > answer.txt\n", "cat answer.txt\n"])
DONE = reply("answer.txt holds 42.", [], complete=True)
CONFIRM = reply("Yes, answer.txt holds 42.", [], complete=True)
TASK = "Write 42 to answer.txt."


@pytest.fixture
def server(start_server, strict):
    harness_installed("terminus")
    return external_agent_server(start_server, strict)


def instance(**fields) -> dict:
    return {"data_source": "external_agent", "harness": "terminus", "task": TASK, "collect": ["answer.txt"], **fields}


@needs_bwrap
def test_terminus_writes_the_file_through_its_tmux_session_and_every_turn_is_recorded_token_exact(strict, server):
    strict.double.push(WRITE, DONE, CONFIRM, job="j1")
    submit(server, "j1", instance=instance(max_turns=6, score={"command": 'test "$(cat answer.txt)" = 42'}))
    res = result(server, "j1", timeout=90)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    artifacts = res["artifacts"]
    agent = artifacts["agent"]
    assert agent["exit_code"] == 0 and not agent["timed_out"], agent
    assert (
        json.loads(agent["output"].splitlines()[-1])["n_episodes"] == 3
    )  # what the runner prints: Terminus-2's own count
    assert artifacts["files"] == {"answer.txt": "42\n"}
    assert "answer.txt" in artifacts["harness"]["changed_files"]
    assert "Trajectory dumped" in artifacts["harness"]["logs"]["terminus.log"]  # harbor's own log, at DEBUG
    assert "echo 42 > answer.txt" in artifacts["harness"]["logs"]["trial/agent/terminus_2.pane"]
    [recording] = artifacts["gateway"]
    assert (recording["calls"], recording["rewrites"], recording["failed_calls"]) == (3, 0, 0)
    # no summarization (the task is short): one chain, the main one, of the session's own model
    [chain] = recording["chains"]
    assert not chain["side_call"] and recording["main_chain"] == chain["id"] == 0
    [segment] = recording["segments"]  # each call resent the history as sampled: one segment, token-exact
    assert [t["text"] for t in segment["turns"]] == [WRITE, DONE, CONFIRM]
    # what Terminus-2 sent: the task, the screen after its keystrokes, the confirmation it asks for
    prompts = [m["content"] for m in segment["messages"] if m["role"] == "user"]
    assert [m["role"] for m in segment["messages"]] == ["user", "assistant"] * 3
    assert TASK in prompts[0] and "42" in prompts[1].split("cat answer.txt", 1)[1]
    assert "Are you sure you want to mark the task as complete?" in prompts[2]
    model_ids = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert model_ids == [i for t in segment["turns"] for i in t["output_ids"]]
    assert [r.job_id for r in strict.double.requests] == ["j1"] * 3


@needs_bwrap
def test_a_run_past_its_time_budget_ends_with_its_sandbox_and_its_tmux_server(strict, server):
    strict.double.push(reply("Waiting.", ["sleep 600\n"], duration=600), job="j2")
    submit(server, "j2", instance=instance(time_budget_s=25, score={"command": "test -e answer.txt"}))
    wait_for(lambda: len(strict.double.requests) == 1, 25, "Terminus-2 asks the model")
    wait_for(
        lambda: any("tmux" in p for p in command_lines("terminus_runner.py", "terminus-2")),
        10,
        "its tmux server runs the sleep",
    )
    res = result(server, "j2", timeout=60)
    assert res["status"] == "completed" and res["reward"] == 0.0, (res["error"], res["artifacts"])
    assert res["artifacts"]["agent"]["timed_out"] is True
    assert res["artifacts"]["missing_files"] == ["answer.txt"]
    wait_for(
        lambda: not command_lines("terminus_runner.py", "terminus-2"), 30, "the runner and its tmux server are gone"
    )


def test_harbor_gets_a_python_new_enough_for_it_or_an_error_naming_what_to_install(monkeypatch, tmp_path):
    installed = harness_installed("terminus")  # before HOME moves: the default install root is under it
    monkeypatch.setenv("PATH", str(tmp_path))  # no python3.N on PATH, no ~/.pyenv
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(PYTHON_ENV, raising=False)

    class Future(Terminus):
        package = Package("pypi", "harbor", "0.26.0", python="3.99")

    with pytest.raises(HarnessInstallError, match=f"needs Python >= 3.99 .* or set {PYTHON_ENV}"):
        find_python(Future)
    if sys.version_info < (3, 12):  # the server's own Python is too old: the one named is taken
        newer = str(installed / "bin" / "python")
        monkeypatch.setenv(PYTHON_ENV, newer)
        assert find_python(Terminus) == newer
    else:
        assert find_python(Terminus) == sys.executable
