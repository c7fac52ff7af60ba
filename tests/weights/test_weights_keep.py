"""Weight-update pause mode "keep": the engines freeze the calls in flight and go on with them after the update.

On the dev engine and the real vLLM (with its development endpoints): a long completion is in flight, the
server pauses with keep, updates to version 2 and resumes; the completion finishes without being resent and
its turn records both versions (and, on the dev engine, which tokens each one sampled). On the scripted
double, which has no keep endpoints, the pause is refused naming it and nothing is aborted.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from polling import wait_for
from server_jobs import result

from prorl_server.llm.session import weight_spans
from prorl_server.llm.weight_pause_gate import WeightPauseGate
from prorl_server.testing import ScriptedReply

pytest_plugins = ("engine_fixtures", "vllm_reload_fixtures")

QUESTION = "Tell me a long story."


def submit_one_turn(server, job_id: str, max_tokens: int, **extra) -> None:
    body = {
        "job_id": job_id,
        "instance": {"data_source": "multiturn", "question": QUESTION},
        "agent_config": {"max_turns": 1},
        "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0},
        **extra,
    }
    answer = server.http.post("/jobs", json=body)
    assert answer.status_code == 202, answer.text


def versioned_server(start_server, address: str, version=1, **settings):
    server = start_server([], **settings)
    answer = server.http.post("/add_llm_server", json={"address": address, "weight_version": version})
    assert answer.is_success, answer.text
    return server


def pause_keep_update_resume(server, hold_s: float, check_frozen=None) -> dict:
    """Pause with keep (one call kept), hold, update to version 2, resume; returns the pause's answer."""
    paused = server.http.post("/weights/pause", json={"mode": "keep"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["mode"], body["kept"], body["aborted"], body["waited_for"]) == ("keep", 1, 0, 0)
    assert body["drained"] and body["in_flight_calls"] == 0 and body["kept_calls"] == 1
    if check_frozen is not None:
        check_frozen()
    time.sleep(hold_s)
    assert server.http.post("/weights/update", json={"version": 2}).status_code == 200
    resumed = server.http.post("/weights/resume")
    assert resumed.status_code == 200 and resumed.json()["kept_calls"] == 0  # running on, unfrozen
    return body


def test_dev_engine_keeps_a_completion_across_an_update_and_labels_its_tokens(start_server, dev_engine):
    dev_engine.wait_idle()
    server = versioned_server(start_server, dev_engine.address)
    submit_one_turn(server, "kept", max_tokens=300)
    wait_for(lambda: dev_engine.running() == 1, 60, "the engine generating the turn")
    time.sleep(0.5)  # some tokens under version 1
    before = len(dev_engine.generations())
    pause_keep_update_resume(server, hold_s=1.0)

    res = result(server, "kept", timeout=120)
    assert res["status"] == "completed", res
    (turn,) = res["trajectory"]["turns"]
    assert (turn["weight_version"], turn["resumed_under"]) == (1, [2])
    assert res["trajectory"]["weight_versions"] == [1, 2]
    n = len(turn["output_ids"])
    assert n == 300  # finished, not cut short
    first, second = turn["weight_spans"]
    assert (first["version"], first["start"], second["version"], second["end"]) == (1, 0, 2, n)
    assert 0 < first["end"] == second["start"] < n  # the switch came mid-completion
    # the engine ran exactly one request for it: nothing was resent or discarded
    (record,) = dev_engine.generations()[before:]
    assert record.output_ids == turn["output_ids"] and record.logprobs == turn["logprobs"]
    assert record.finish_reason == "length"


def test_vllm_keeps_a_completion_across_an_update(start_server, vllm):
    server = versioned_server(start_server, vllm.address)
    metrics_before = vllm.metrics()
    submit_one_turn(server, "kept", max_tokens=600)
    wait_for(lambda: vllm.metrics()["vllm:num_requests_running"] == 1, 120, "vLLM generating the turn")
    time.sleep(1.0)

    def frozen() -> None:
        assert httpx.get(f"{vllm.url}/is_paused", timeout=10, trust_env=False).json() == {"is_paused": True}
        tokens = vllm.metrics()["vllm:generation_tokens_total"]
        time.sleep(1.0)
        assert vllm.metrics()["vllm:generation_tokens_total"] == tokens  # no step ran while paused

    pause_keep_update_resume(server, hold_s=0.5, check_frozen=frozen)
    assert httpx.get(f"{vllm.url}/is_paused", timeout=10, trust_env=False).json() == {"is_paused": False}

    res = result(server, "kept", timeout=300)
    assert res["status"] == "completed", res
    (turn,) = res["trajectory"]["turns"]
    assert (turn["weight_version"], turn["resumed_under"]) == (1, [2])
    assert turn["weight_spans"] is None  # vLLM's /v1/completions does not report where the version changed
    assert len(turn["output_ids"]) == 600 and turn["finish_reason"] == "length"
    after = vllm.metrics()
    # one request, prefilled once: it was not resent
    assert after["vllm:request_success_total"] - metrics_before["vllm:request_success_total"] == 1
    prompt_len = turn["prompt_len"]
    assert after["vllm:prompt_tokens_total"] - metrics_before["vllm:prompt_tokens_total"] == prompt_len


def test_keep_drops_a_turn_resumed_past_max_staleness(start_server, dev_engine):
    dev_engine.wait_idle()
    server = versioned_server(start_server, dev_engine.address)
    submit_one_turn(server, "strict", max_tokens=300, max_staleness=0)
    wait_for(lambda: dev_engine.running() == 1, 60, "the engine generating the turn")
    pause_keep_update_resume(server, hold_s=0.2)
    res = result(server, "strict", timeout=120)
    assert res["status"] == "stale", res
    assert "that a keep pause resumed turn 1 under" in res["error"]["message"]
    assert "turn 1 was dropped" in res["error"]["message"]
    assert res["trajectory"]["turns"] == []


def test_keep_on_an_engine_without_the_endpoints_is_409_and_aborts_nothing(start_server, backend):
    server = versioned_server(start_server, backend.address)
    backend.double.push(ScriptedReply(text="slow DONE", delay_s=1.5))
    submit_one_turn(server, "j", max_tokens=16)
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the completion was sent")

    refused = server.http.post("/weights/pause", json={"mode": "keep"})
    assert refused.status_code == 409, refused.text
    message = refused.json()["detail"]
    assert backend.address in message and "VLLM_SERVER_DEV_MODE=1" in message and "mode wait or abort" in message
    status = server.http.get("/weights").json()
    assert (status["paused"], status["in_flight_calls"], status["kept_calls"]) == (False, 1, 0)
    assert server.http.post("/weights/swap", json={"version": 2, "mode": "keep"}).status_code == 409
    assert server.http.get("/llm_servers").json()["servers"][0]["weight_version"] == 1  # the swap changed nothing
    assert server.http.get("/weights").json()["paused"] is False

    res = result(server, "j")
    assert res["status"] == "completed" and res["trajectory"]["turns"][0]["resumed_under"] == []
    assert backend.double.requests[0].outcome == "done"  # never aborted


def test_gate_keeps_calls_out_of_the_drain_and_records_the_versions():
    async def scenario() -> None:
        gate = WeightPauseGate()
        ticket = await gate.enter()
        assert gate.pause("keep") == (0, 0, 1)
        assert (gate.in_flight, gate.kept, gate.mode) == (0, 1, "keep")
        assert await gate.wait_idle(0.1)  # kept calls do not hold the update back
        assert gate.pause("wait") == (0, 0, 0) and gate.mode == "keep"  # the stronger mode stays
        assert gate.note_version(2) == 1 and gate.note_version(3) == 1
        assert ticket.resumed() == [2, 3]
        assert gate.resume() and (gate.in_flight, gate.kept) == (1, 0)
        gate.exit(ticket)

        other = await gate.enter()
        gate.pause("keep")
        assert gate.pause("abort") == (0, 1, 0) and gate.mode == "abort"  # an abort pause aborts kept calls
        assert other.aborted and not other.kept and gate.note_version(4) == 0
        gate.exit(other)
        gate.resume()

    asyncio.run(scenario())


def test_a_keep_pause_ended_by_its_lease_resumes_the_engine(start_server, dev_engine):
    dev_engine.wait_idle()
    server = versioned_server(start_server, dev_engine.address)
    submit_one_turn(server, "leased", max_tokens=200)
    wait_for(lambda: dev_engine.running() == 1, 60, "the engine generating the turn")
    paused = server.http.post("/weights/pause", json={"mode": "keep", "lease_s": 1})
    assert paused.status_code == 200 and paused.json()["kept"] == 1
    assert httpx.get(f"{dev_engine.url}/is_paused", timeout=10, trust_env=False).json() == {"is_paused": True}
    wait_for(lambda: server.http.get("/weights").json()["lease_expired"] == 1, 10, "the lease ran out")
    assert httpx.get(f"{dev_engine.url}/is_paused", timeout=10, trust_env=False).json() == {"is_paused": False}
    res = result(server, "leased", timeout=120)
    assert res["status"] == "completed" and len(res["trajectory"]["turns"][0]["output_ids"]) == 200
    assert res["trajectory"]["turns"][0]["resumed_under"] == []  # no update came


def test_keep_swap_and_a_refusing_engine_beside_a_keeping_one(start_server, dev_engine, backend):
    dev_engine.wait_idle()
    server = versioned_server(start_server, dev_engine.address)
    submit_one_turn(server, "swapped", max_tokens=200)
    wait_for(lambda: dev_engine.running() == 1, 60, "the engine generating the turn")
    swapped = server.http.post("/weights/swap", json={"version": 2, "mode": "keep"})
    assert swapped.status_code == 200, swapped.text
    assert (swapped.json()["kept"], swapped.json()["paused"], swapped.json()["version"]) == (1, False, 2)
    res = result(server, "swapped", timeout=120)
    turn = res["trajectory"]["turns"][0]
    assert (turn["weight_version"], turn["resumed_under"], len(turn["output_ids"])) == (1, [2], 200)
    assert [s["version"] for s in turn["weight_spans"]] in ([1, 2], [2])  # the swap may come before any token

    # one engine cannot keep: the pause is refused naming it alone, and the other one is resumed
    assert server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 2}).is_success
    refused = server.http.post("/weights/pause", json={"mode": "keep"})
    assert refused.status_code == 409 and backend.address in refused.json()["detail"]
    assert dev_engine.address not in refused.json()["detail"] and "1 of 2" in refused.json()["detail"]
    assert httpx.get(f"{dev_engine.url}/is_paused", timeout=10, trust_env=False).json() == {"is_paused": False}
    assert server.http.get("/weights").json()["paused"] is False


def test_vllm_reloads_a_checkpoint_while_it_keeps_a_completion(start_server, vllm):
    server = versioned_server(start_server, vllm.address)
    submit_one_turn(server, "reloaded", max_tokens=400)
    wait_for(lambda: vllm.metrics()["vllm:num_requests_running"] == 1, 120, "vLLM generating the turn")
    time.sleep(0.5)
    paused = server.http.post("/weights/pause", json={"mode": "keep"})
    assert paused.status_code == 200 and paused.json()["kept"] == 1
    update = {"version": 2, "reload": {"path": vllm.model_dir, "timeout_s": 300}}
    updated = server.http.post("/weights/update", json=update, timeout=400)
    assert updated.status_code == 200, updated.text  # no prefix-cache reset while the request holds blocks
    assert server.http.post("/weights/resume").status_code == 200
    res = result(server, "reloaded", timeout=300)
    assert res["status"] == "completed", res
    (turn,) = res["trajectory"]["turns"]
    assert (turn["weight_version"], turn["resumed_under"], len(turn["output_ids"])) == (1, [2], 400)
    assert vllm.complete("The capital of France is")  # the engine serves on


def test_a_freeze_stops_the_calls_stall_clock_and_its_jobs_budget(start_server, dev_engine):
    dev_engine.wait_idle()
    server = versioned_server(start_server, dev_engine.address, llm_stall_timeout_s=8.0)
    submit_one_turn(server, "held", max_tokens=60, timeout=9)
    wait_for(lambda: dev_engine.running() == 1, 60, "the engine generating the turn")
    before = len(dev_engine.generations())
    pause_keep_update_resume(server, hold_s=10.0)  # longer than the stall timeout and the job's budget
    res = result(server, "held", timeout=120)
    assert res["status"] == "completed", res  # neither stalled nor timed out
    (turn,) = res["trajectory"]["turns"]
    assert turn["resumed_under"] == [2] and len(turn["output_ids"]) == 60
    assert len(dev_engine.generations()) == before + 1  # not resent
    assert res["timing"]["weight_pause_s"] >= 10.0
    assert turn["llm_s"] < res["timing"]["weight_pause_s"]  # the freeze is pause time, not LLM time


def test_engine_spans_are_mapped_to_versions_and_bad_ones_dropped():
    def mapped(engine_spans, own=1, resumed=(2,), n=10):
        spans = weight_spans(engine_spans, own, list(resumed), n)
        return None if spans is None else [(s.version, s.start, s.end) for s in spans]

    # labels before the first resumed version's are the turn's own version, whatever the engine called them
    assert mapped([("default", 0, 3), ("1", 3, 6), ("2", 6, 10)]) == [(1, 0, 6), (2, 6, 10)]
    assert mapped([("2", 0, 10)]) == [(2, 0, 10)]  # frozen before its first token
    assert mapped([("7", 0, 4), ("v9", 4, 10)], own=7, resumed=("v8", "v9")) == [(7, 0, 4), ("v9", 4, 10)]
    for bad in (
        [("1", 0, 4), ("2", 5, 10)],  # a gap
        [("1", 0, 4), ("2", 4, 9)],  # short of the tokens
        [("1", 0, 4), ("2", 4, 12)],  # past them
        [("1", 0, 0), ("2", 0, 10)],  # an empty span
        [("2", 0, 4), ("x", 4, 10)],  # an unknown label after a resumed version's
        [],
        None,
    ):
        assert mapped(bad) is None, bad
    assert mapped([("3", 0, 4), ("2", 4, 10)], resumed=(2, 3)) is None  # resumed versions out of order
