"""A harness preset on the real engines: mini-swe-agent (installed pinned, run unmodified in a bubblewrap
sandbox without network) against its job's gateway session on the dev engine and on the real vLLM
(SmolLM2-135M). The small model seldom calls its `bash` tool well, and mini-swe-agent answers a reply without
one by asking again, so it runs to its step limit; whatever it does, every turn recorded must be exactly the
ids and logprobs the engine sampled for exactly the ids before it."""

from __future__ import annotations

import pytest
from harness_fixtures import harness_installed
from prorl_handlers.external_agent import ExternalAgentHandler
from server_jobs import result, submit

from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("engine_fixtures",)

BWRAP = unavailable_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")
STEPS = 2
MAX_TOKENS = 16


def test_mini_swe_agent_on_a_real_engine_is_recorded_as_the_engine_sampled(engine, start_server):
    harness_installed("mini_swe_agent")
    engine.wait_idle()
    server = start_server([engine.address], handlers={"external_agent": ExternalAgentHandler()}, runtime="bwrap")
    server.state.gateway.public_url = server.url
    instance = {
        "data_source": "external_agent",
        "harness": "mini_swe_agent",
        "task": "How many files are in this directory? Use bash.",
        "max_turns": STEPS,
        "time_budget_s": 300,
        "score": {"command": "true"},
    }
    # mini-swe-agent sends no max_tokens: the trainer's sampling params bound each turn
    submit(server, "j1", instance=instance, sampling_params={"temperature": 0.0, "max_tokens": MAX_TOKENS})
    res = result(server, "j1", timeout=540)
    assert res["status"] == "completed", (res["error"], res["artifacts"])
    agent = res["artifacts"]["agent"]
    assert agent["exit_code"] == 0 and not agent["timed_out"], agent
    [recording] = res["artifacts"]["gateway"]
    assert recording["calls"] == STEPS and recording["failed_calls"] == 0, recording
    turns = [turn for segment in recording["segments"] for turn in segment["turns"]]
    assert len(turns) == STEPS and all(len(t["output_ids"]) <= MAX_TOKENS for t in turns)
    for segment in recording["segments"]:
        engine.assert_turns_are_its_own(segment)
