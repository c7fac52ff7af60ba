"""A weight-update pause is a lease: a trainer that dies mid-update never leaves the server paused for good."""

from __future__ import annotations

import time

from polling import wait_for
from server_jobs import result, submit

from prorl_server.testing import ScriptedReply


def weights(server) -> dict:
    return server.http.get("/weights").json()


def versioned_server(start_server, backend, **settings):
    server = start_server([], **settings)
    added = server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 1})
    assert added.is_success, added.text
    return server


def test_an_abandoned_pause_ends_by_its_lease_and_the_held_calls_go_on(start_server, backend):
    server = versioned_server(start_server, backend)
    paused = server.http.post("/weights/pause", json={"lease_s": 1.0})
    assert paused.status_code == 200 and 0 < paused.json()["lease_left_s"] <= 1.0
    backend.double.push("DONE")
    submit(server, "held")
    wait_for(lambda: weights(server)["waiting_calls"] == 1, 10, "the job's call waits at the pause")
    # nobody updates or resumes: the lease runs out and dispatching goes on by itself
    done = result(server, "held")
    assert done["status"] == "completed", done
    status = weights(server)
    assert status["paused"] is False and status["lease_left_s"] is None and status["lease_expired"] == 1
    assert status["version"] is None  # the version is whatever was set: nothing changed


def test_the_servers_default_lease_applies_and_an_update_renews_it(start_server, backend):
    server = versioned_server(start_server, backend, weight_pause_lease_s=1.2)
    assert server.http.post("/weights/pause", json={}).json()["lease_left_s"] <= 1.2
    time.sleep(0.8)
    assert server.http.post("/weights/update", json={"version": 2}).status_code == 200
    renewed = weights(server)
    assert renewed["paused"] and renewed["lease_left_s"] > 0.9  # counted again from the update
    time.sleep(0.6)
    assert weights(server)["paused"]  # 1.4 s after the pause, 0.6 s after the update
    wait_for(lambda: not weights(server)["paused"], 5, "the renewed lease ran out")
    assert weights(server)["lease_expired"] == 1 and weights(server)["version"] == 2


def test_a_resume_or_a_swap_ends_the_lease(start_server, backend):
    server = versioned_server(start_server, backend, weight_pause_lease_s=0.5)
    server.http.post("/weights/pause", json={})
    assert server.http.post("/weights/resume").status_code == 200
    assert server.http.post("/weights/swap", json={"version": 3}).status_code == 200
    time.sleep(0.8)
    status = weights(server)
    assert status["lease_expired"] == 0 and status["lease_left_s"] is None and not status["paused"]


def test_a_failed_reload_stays_paused_only_until_the_lease_runs_out(start_server, backend):
    backend.double.bad_weight_paths.add("/bad")
    server = versioned_server(start_server, backend, weight_pause_lease_s=1.0)
    backend.double.push(ScriptedReply(text="x"), "DONE")
    answer = server.http.post("/weights/swap", json={"version": 2, "reload": {"path": "/bad"}})
    assert answer.status_code == 502 and "stays paused" in answer.json()["detail"]
    assert weights(server)["paused"]
    submit(server, "after")
    assert result(server, "after")["status"] == "completed"  # the trainer never came back; the lease did
    assert weights(server)["lease_expired"] == 1 and weights(server)["version"] is None  # 2 was never set


def test_a_bad_lease_is_422(server):
    for lease in (0, -1, "long", 10**9):
        answer = server.http.post("/weights/pause", json={"lease_s": lease})
        assert answer.status_code == 422, (lease, answer.text)
        assert "lease_s" in answer.text
    assert weights(server)["paused"] is False
