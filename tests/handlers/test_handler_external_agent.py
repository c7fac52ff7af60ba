"""`external_agent` end to end under bubblewrap: each shipped example agent (a loop over bash with an official
SDK alone: `openai` Chat Completions, `openai` Responses, `anthropic` Messages) runs in a sandbox without
network against its job's gateway session on the scripted double, which drives one tool call and then a final
answer; EVAL scores in a fresh sandbox. On the real engines (the dev engine and vLLM), the Responses and
Anthropic agents run as tasks the same way, and every turn recorded is exactly what the engine sampled."""

from __future__ import annotations

import json

import pytest
from polling import wait_for
from prorl_handlers.external_agent import EXAMPLE_AGENTS, ExternalAgentHandler, example_instance
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply

pytest_plugins = ("engine_fixtures",)

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")

WRITE = {"name": "bash", "arguments": {"command": "echo 42 > answer.txt && cat answer.txt"}}
CALL = f"I will write it.<tool_call>\n{json.dumps(WRITE)}\n</tool_call>"
FINAL = "Done: answer.txt holds 42."


@pytest.fixture
def server(start_server, strict):
    server = start_server([strict.address], handlers={"external_agent": ExternalAgentHandler()}, runtime="bwrap")
    server.state.gateway.public_url = server.url  # the test server binds a free port
    return server


@pytest.mark.parametrize("agent", list(EXAMPLE_AGENTS))
def test_each_example_agent_calls_bash_then_answers_and_the_fresh_sandbox_scores_its_file(strict, server, agent):
    strict.double.push(CALL, FINAL, job="j1")
    instance = example_instance(
        "Write 42 to answer.txt.",
        score={"command": 'test "$(cat answer.txt)" = 42'},
        agent=agent,
        collect=["answer.txt"],
        session={"model": "agent-model", "side_calls": "refuse", "reward_chains": "agents"},
    )
    submit(server, "j1", instance=instance)
    res = result(server, "j1", timeout=120)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    artifacts = res["artifacts"]
    assert artifacts["agent"]["exit_code"] == 0 and artifacts["agent"]["output"].strip() == FINAL
    assert artifacts["files"] == {"answer.txt": "42\n"}
    [recording] = artifacts["gateway"]
    assert (recording["calls"], recording["rewrites"], recording["failed_calls"]) == (2, 0, 0)
    # the instance's session options: the agent sends the alias (OPENAI_MODEL, ANTHROPIC_MODEL), one chain
    [chain] = recording["chains"]
    assert (chain["model"], chain["side_call"], recording["main_chain"], recording["reward_chains"]) == (
        "agent-model",
        False,
        0,
        [0],
    )
    [segment] = recording["segments"]  # the agent sent back the call and its result: one segment, token-exact
    assert [t["text"] for t in segment["turns"]] == [CALL, FINAL]
    sampled = [t["output_ids"] for t in segment["turns"]]
    model_ids = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
    assert model_ids == sampled[0] + sampled[1]
    assert {k: res["trajectory"][k] for k in segment} == segment  # one segment: the job's trajectory too
    tool_result = segment["messages"][3]
    assert tool_result["role"] == "tool" and tool_result["content"] == "exit code 0\n42\n"
    assert [r.job_id for r in strict.double.requests] == ["j1", "j1"]


@pytest.mark.parametrize(
    ("score", "reward", "error"),
    [
        ({"command": "echo chatter >&2; echo 0.25", "reward": "stdout"}, 0.25, None),
        ({"command": "echo not a number", "reward": "stdout"}, 0.0, "no number"),
        ({"command": "test -e answer.txt"}, 0.0, None),  # the agent wrote nothing: nothing collected
    ],
)
def test_the_score_command_gives_the_reward_by_its_stdout_or_exit_code(strict, server, score, reward, error):
    instance = {"data_source": "external_agent", "command": "true", "collect": ["answer.txt"], "score": score}
    submit(server, "j2", instance=instance)
    res = result(server, "j2", timeout=120)
    assert res["status"] == "completed" and res["reward"] == reward, (res["error"], res["artifacts"])
    assert res["artifacts"]["missing_files"] == ["answer.txt"]
    assert (error in res["eval"].get("score_error", "")) if error else "score_error" not in res["eval"]


def test_a_malformed_instance_is_refused_at_submission(server):
    answer = server.http.post("/jobs", json={"job_id": "j3", "instance": {"data_source": "external_agent"}})
    assert (
        answer.status_code == 400 and "score" in answer.text
    )  # no command or harness: tests/harnesses/test_harness_misbehaving.py


def test_cancelling_the_job_aborts_the_agent_s_completion_and_closes_its_bridge(strict, server):
    strict.double.push(ScriptedReply(text=FINAL, delay_s=120), job="j4")
    submit(server, "j4", instance=example_instance("Wait.", score={"command": "true"}))
    wait_for(lambda: len(strict.double.requests) == 1, 60, "the agent's completion reaches the backend")
    assert server.http.delete("/jobs/j4").status_code == 200
    assert result(server, "j4", timeout=60)["status"] == "cancelled"
    wait_for(lambda: strict.double.requests[0].outcome == "aborted", 30, "the completion is aborted")
    wait_for(lambda: len(server.state.gateway) == 0, 30, "the session is closed")
    manager = server.state.orchestrator.sandboxes
    owner_dir = manager.base_dir / manager.owner
    wait_for(lambda: not list(owner_dir.glob("gw-*")), 30, "the bridge's directory is removed")


@pytest.mark.parametrize("agent", ["responses", "anthropic"])
def test_an_example_agent_on_a_real_engine_is_recorded_as_the_engine_sampled(engine, start_server, agent):
    """Whatever the model does (a small model seldom calls a tool well), each turn is the engine's own."""
    engine.wait_idle()
    server = start_server([engine.address], handlers={"external_agent": ExternalAgentHandler()}, runtime="bwrap")
    server.state.gateway.public_url = server.url
    instance = example_instance("How many files are here? Use bash.", score={"command": "true"}, agent=agent)
    instance["command"] += " --max-steps 3 --max-tokens 12"
    submit(server, "j5", instance=instance, sampling_params={"temperature": 0.0})
    res = result(server, "j5", timeout=600)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    assert res["artifacts"]["agent"]["exit_code"] == 0, res["artifacts"]["agent"]
    [recording] = res["artifacts"]["gateway"]
    assert recording["calls"] >= 1 and (recording["rewrites"], recording["failed_calls"]) == (0, 0), recording
    [segment] = recording["segments"]
    assert len(segment["turns"]) == recording["calls"]
    assert all(len(t["output_ids"]) <= 12 for t in segment["turns"])
    engine.assert_turns_are_its_own(segment)
