"""`POST /weights/rollback`: undo the last weight update of a pause (engines, backend set, version)."""

from __future__ import annotations

from polling import wait_for
from server_jobs import result, submit

from prorl_server.llm.weight_update import WeightVersions
from prorl_server.testing import ScriptedReply
from prorl_server.testing.scripted_backend import MODEL_ROOT


def weights(server) -> dict:
    return server.http.get("/weights").json()


def backend_versions(server) -> dict[str, str | int | None]:
    return {s["address"]: s["weight_version"] for s in server.http.get("/llm_servers").json()["servers"]}


def started(start_server, addresses: list[str], version=1, **settings):
    server = start_server([], **settings)
    for address in addresses:
        added = server.http.post("/add_llm_server", json={"address": address, "weight_version": version})
        assert added.is_success, added.text
    return server


def test_a_rollback_reloads_the_previous_checkpoints_and_sets_the_version_back(start_server, start_backend):
    one, two = start_backend(), start_backend()
    server = started(start_server, [one.address, two.address])
    first = server.http.post("/weights/swap", json={"version": 2, "reload": {"path": "/ckpt/2"}})
    assert first.status_code == 200, first.text

    assert server.http.post("/weights/pause", json={}).json()["drained"]
    update = server.http.post("/weights/update", json={"version": 3, "reload": {"path": "/ckpt/3"}})
    assert update.status_code == 200, update.text
    answer = server.http.post("/weights/rollback")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["version"] == 2 and body["rolled_back_from"] == 3 and body["paused"]  # resuming is the caller's
    assert sorted(body["restored"]) == sorted([one.address, two.address])
    assert [s["weight_version"] for s in body["servers"]] == [2, 2]
    for backend in (one, two):
        assert backend.double.weights_path == "/ckpt/2"
        assert backend.double.admin_log[2:] == [
            "reload_weights /ckpt/3",
            "reset_prefix_cache",
            "reload_weights /ckpt/2",
            "reset_prefix_cache",
        ]
    assert weights(server)["version"] == 2

    # version 3 was never kept: it may be used again, in the same pause
    again = server.http.post("/weights/update", json={"version": 3, "reload": {"path": "/ckpt/3b"}})
    assert again.status_code == 200, again.text
    assert server.http.post("/weights/resume").status_code == 200
    one.double.push("DONE")
    two.double.push("DONE")
    submit(server, "after")
    turns = result(server, "after")["trajectory"]["turns"]
    assert [t["weight_version"] for t in turns] == [3]


def test_a_rollback_without_reload_only_sets_the_version_back(start_server, backend):
    server = started(start_server, [backend.address], version="base")
    assert server.http.post("/weights/pause", json={}).status_code == 200
    assert server.http.post("/weights/update", json={"version": "step-1"}).status_code == 200
    body = server.http.post("/weights/rollback").json()
    assert body["version"] is None and body["rolled_back_from"] == "step-1" and body["restored"] == []
    assert backend_versions(server) == {backend.address: "base"}  # as registered, not as last set
    assert backend.double.admin_log == []
    assert server.http.post("/weights/update", json={"version": "step-1"}).status_code == 200  # a string, reused


def test_a_rollback_brings_back_the_backend_set_and_the_jobs_pinned_to_it(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = started(start_server, [old.address])
    old.double.push(ScriptedReply(text="a", delay_s=0.4), "DONE")
    submit(server, "pinned")
    wait_for(lambda: len(old.double.requests) == 1, 10, "the first completion was sent")
    assert server.http.post("/weights/pause", json={}).json()["waited_for"] == 1

    body = {"version": 2, "servers": [{"address": new.address, "tags": {"pool": "b"}}], "reload": {"path": "/c/2"}}
    assert server.http.post("/weights/update", json=body).status_code == 200
    assert list(backend_versions(server)) == [new.address]
    answer = server.http.post("/weights/rollback").json()
    assert [(s["address"], s["weight_version"]) for s in answer["servers"]] == [(old.address, 1)]
    assert answer["restored"] == [new.address]
    assert new.double.weights_path == MODEL_ROOT  # the new backend got what it served before back
    assert old.double.admin_log == []  # the old one never reloaded

    assert server.http.post("/weights/resume").status_code == 200
    res = result(server, "pinned")
    assert res["status"] == "completed", res
    assert [(t["backend"], t["weight_version"]) for t in res["trajectory"]["turns"]] == [
        (old.address, 1),
        (old.address, 1),
    ]
    assert new.double.requests == []


def test_an_engine_that_does_not_load_its_previous_checkpoint_back_is_502(start_server, start_backend):
    good, bad = start_backend(), start_backend()
    server = started(start_server, [good.address, bad.address])
    assert server.http.post("/weights/swap", json={"version": 2, "reload": {"path": "/ckpt/2"}}).status_code == 200
    assert server.http.post("/weights/pause", json={}).status_code == 200
    assert server.http.post("/weights/update", json={"version": 3, "reload": {"path": "/ckpt/3"}}).status_code == 200
    bad.double.bad_weight_paths.add("/ckpt/2")

    answer = server.http.post("/weights/rollback")
    assert answer.status_code == 502, answer.text
    detail = answer.json()["detail"]
    assert "back to 2" in detail and bad.address in detail and good.address not in detail, detail
    assert good.double.weights_path == "/ckpt/2"
    status = weights(server)
    assert status["version"] == 2 and status["paused"]  # the version went back anyway
    assert set(backend_versions(server).values()) == {2}
    again = server.http.post("/weights/rollback")
    assert again.status_code == 409 and "rolled back already" in again.json()["detail"]


def test_a_rollback_renews_the_lease_and_the_lease_resumes_at_the_old_version(start_server, backend):
    server = started(start_server, [backend.address])
    assert server.http.post("/weights/pause", json={"lease_s": 1.0}).status_code == 200
    assert server.http.post("/weights/update", json={"version": 2}).status_code == 200
    assert server.http.post("/weights/rollback").json()["lease_left_s"] > 0.8
    backend.double.push("DONE")
    submit(server, "held")
    wait_for(lambda: not weights(server)["paused"], 5, "the lease ended the pause")
    res = result(server, "held")
    assert res["status"] == "completed" and [t["weight_version"] for t in res["trajectory"]["turns"]] == [1]
    assert weights(server)["lease_expired"] == 1


def test_weight_versions_unset_forgets_the_undone_version():
    versions = WeightVersions()
    versions.registered(1)
    versions.set(2)
    versions.set(3)
    assert versions.conflict(3) is not None and versions.distance(1, 3) == 2
    versions.unset(3, 2)
    assert versions.current == 2 and versions.conflict(3) is None
    versions.set("a")
    versions.unset("a", 2)
    assert versions.conflict("a") is None and versions.distance(2, "a") is None
    versions.set("a")
    assert versions.distance(2, "a") == 1
