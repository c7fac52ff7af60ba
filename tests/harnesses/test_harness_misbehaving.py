"""A harness that misbehaves ends as a well-formed result with its partial chains kept, and nothing of it outlives
its job: one that floods its output, exits non-zero after a call, or forks processes away, each a bash command
of `external_agent` in a bubblewrap sandbox against its job's gateway session on the scripted test double (a
scripted LLM); and an instance naming a harness wrongly is refused at submission."""

from __future__ import annotations

import uuid

import pytest
from harness_fixtures import command_lines, external_agent_server
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

# one Chat Completions call with the standard library, as any harness makes it
ONE_CALL = (
    "python3 -c 'import json, os, urllib.request as u; "
    'r = u.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", '
    'json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(), '
    '{"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}); '
    'print(json.load(u.urlopen(r))["choices"][0]["message"]["content"])\''
)


@pytest.fixture
def server(start_server, strict):
    return external_agent_server(start_server, strict)


def instance(command: str, **fields) -> dict:
    return {"data_source": "external_agent", "command": command, "score": {"command": "true"}, **fields}


def test_a_flood_of_output_is_cut_to_its_tail_and_the_job_completes(strict, server):
    submit(server, "j1", instance=instance("head -c 30000000 /dev/zero | tr '\\0' x; echo; echo the end"))
    res = result(server, "j1", timeout=120)
    assert res["status"] == "completed", res["error"]
    agent = res["artifacts"]["agent"]
    assert agent["exit_code"] == 0 and agent["output"].endswith("the end\n") and len(agent["output"]) <= 4000


def test_a_harness_exiting_non_zero_after_a_call_keeps_its_chain_and_gets_its_score(strict, server):
    strict.double.push("Hello.", job="j2")
    submit(server, "j2", instance=instance(f"{ONE_CALL} && exit 3", score={"command": "false"}))
    res = result(server, "j2", timeout=120)
    assert res["status"] == "completed" and res["reward"] == 0.0, res["error"]
    agent = res["artifacts"]["agent"]
    assert agent["exit_code"] == 3 and "Hello." in agent["output"], agent
    [recording] = res["artifacts"]["gateway"]
    [segment] = recording["segments"]  # the call it made before it failed, recorded
    assert recording["calls"] == 1 and [t["text"] for t in segment["turns"]] == ["Hello."]


def test_processes_a_harness_forks_away_end_with_its_sandbox(strict, server):
    marker = f"prorl-forked-{uuid.uuid4().hex[:8]}"
    command = f"(exec -a {marker} sleep 600 &); setsid bash -c 'exec -a {marker} sleep 600' & disown; exit 0"
    submit(server, "j3", instance=instance(command))
    res = result(server, "j3", timeout=120)
    assert res["status"] == "completed" and res["artifacts"]["agent"]["exit_code"] == 0, res["error"]
    assert server.state.orchestrator.sandboxes.live == 0
    assert command_lines(marker) == []


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"harness": "no_such_harness", "task": "t"}, "unknown harness 'no_such_harness'"),
        ({"harness": "claude_code"}, "needs a `task`"),
        ({"harness": "claude_code", "task": "t", "command": "true"}, "exactly one of `command`"),
        ({}, "exactly one of `command`"),
    ],
)
def test_an_instance_naming_a_harness_wrongly_is_refused_at_submission(server, fields, words):
    body = {"data_source": "external_agent", "score": {"command": "true"}, **fields}
    answer = server.http.post("/jobs", json={"job_id": "bad", "instance": body})
    assert answer.status_code == 400 and words in answer.text, answer.text


def test_a_harness_not_installed_on_the_server_fails_its_job_saying_how_to_install_it(server, tmp_path, monkeypatch):
    monkeypatch.setenv("PRORL_HARNESS_ROOT", str(tmp_path))
    body = {"data_source": "external_agent", "harness": "codex", "task": "t", "score": {"command": "true"}}
    submit(server, "j4", instance=body)
    res = result(server, "j4", timeout=60)
    assert res["status"] == "failed" and res["error"]["stage"] == "run", res
    assert "is not installed" in res["error"]["message"]
    assert "python -m prorl_handlers.harnesses install codex" in res["error"]["message"]
