"""Weight updates that reload the engines from a checkpoint: `reload` in POST /weights/update and /weights/swap.

Each engine loads the checkpoint (vLLM: `POST /collective_rpc` running `reload_weights`) and resets its
prefix cache (`POST /reset_prefix_cache`), both only with VLLM_SERVER_DEV_MODE=1, before the version is
set. First against the scripted double, then against the real vLLM (CPU build), started once for this
module with the development endpoints; it skips where vLLM is not set up, and with PRORL_REQUIRE_VLLM=1
fails instead.
"""

from __future__ import annotations

import httpx

from prorl_server.testing.scripted_backend import MODEL_ROOT

pytest_plugins = ("vllm_reload_fixtures",)
MULTITURN = {"data_source": "multiturn", "question": "What is the capital of France?"}
SHORT_TURN = {"max_tokens": 8, "temperature": 0.0, "max_turns": 1}


def paused_server(start_server, addresses: list[str], version=1):
    server = start_server([])
    for address in addresses:
        added = server.http.post("/add_llm_server", json={"address": address, "weight_version": version})
        assert added.is_success, added.text
    assert server.http.post("/weights/pause", json={}).json()["drained"]
    return server


def weights(server) -> dict:
    return server.http.get("/weights").json()


# the scripted double ------------------------------------------------------------------------------


def test_update_reloads_each_engine_then_resets_its_prefix_cache(start_server, start_backend):
    one, two = start_backend(), start_backend()
    server = paused_server(start_server, [one.address, two.address])
    answer = server.http.post("/weights/update", json={"version": 2, "reload": {"path": "/ckpt/step-2"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["version"] == 2
    for backend in (one, two):
        assert backend.double.admin_log == ["reload_weights /ckpt/step-2", "reset_prefix_cache"]
        assert backend.double.weights_path == "/ckpt/step-2"
    assert [s["weight_version"] for s in server.http.get("/llm_servers").json()["servers"]] == [2, 2]


def test_a_failed_reload_is_502_naming_the_engine_and_loads_its_previous_weights_back(start_server, start_backend):
    good, bad = start_backend(), start_backend()
    bad.double.bad_weight_paths.add("/ckpt/step-3")
    server = paused_server(start_server, [good.address, bad.address])
    first = server.http.post("/weights/update", json={"version": 2, "reload": {"path": "/ckpt/step-2"}})
    assert first.status_code == 200, first.text

    answer = server.http.post("/weights/update", json={"version": 3, "reload": {"path": "/ckpt/step-3"}})
    assert answer.status_code == 502, answer.text
    detail = answer.json()["detail"]
    assert bad.address in detail and "Cannot find any model weights" in detail and "unchanged" in detail
    assert f"the 1 that did load it were rolled back to their previous weights: {good.address}" in detail
    assert weights(server)["version"] == 2
    assert [s["weight_version"] for s in server.http.get("/llm_servers").json()["servers"]] == [2, 2]
    # the failed engine got the checkpoint it had before (not the one it started with) back, and no reset
    assert bad.double.admin_log[2:] == ["reload_weights /ckpt/step-3", "reload_weights /ckpt/step-2"]
    assert bad.double.weights_path == "/ckpt/step-2"
    # the engine that did load it went back too: every engine serves what version 2 names
    assert good.double.admin_log[2:] == [
        "reload_weights /ckpt/step-3",
        "reset_prefix_cache",
        "reload_weights /ckpt/step-2",
        "reset_prefix_cache",
    ]
    assert good.double.weights_path == "/ckpt/step-2"

    # once the checkpoint is there, the same update goes through
    bad.double.bad_weight_paths.clear()
    again = server.http.post("/weights/update", json={"version": 3, "reload": {"path": "/ckpt/step-3"}})
    assert again.status_code == 200, again.text
    assert bad.double.admin_log[-2:] == ["reload_weights /ckpt/step-3", "reset_prefix_cache"]


def test_a_first_failed_reload_loads_the_model_the_engine_started_with(start_server, backend):
    backend.double.bad_weight_paths.add("/nope")
    server = paused_server(start_server, [backend.address])
    answer = server.http.post("/weights/update", json={"version": 2, "reload": {"path": "/nope"}})
    assert answer.status_code == 502
    assert f"serves the previous weights ('{MODEL_ROOT}') again" in answer.json()["detail"]
    assert backend.double.admin_log == ["reload_weights /nope", f"reload_weights {MODEL_ROOT}"]


def test_an_engine_without_the_endpoints_is_502_saying_what_it_needs(start_server, backend):
    backend.double.dev_mode = False
    server = paused_server(start_server, [backend.address])
    answer = server.http.post("/weights/update", json={"version": 2, "reload": {"path": "/ckpt"}})
    assert answer.status_code == 502
    assert "VLLM_SERVER_DEV_MODE=1" in answer.json()["detail"]
    assert server.http.get("/llm_servers").json()["servers"][0]["weight_version"] == 1
    assert weights(server)["version"] is None  # never set by an update


def test_reload_needs_a_pause_and_a_valid_version_before_touching_the_engines(start_server, backend):
    server = start_server([])
    server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 5})
    assert server.http.post("/weights/update", json={"version": 6, "reload": {"path": "/c"}}).status_code == 409
    server.http.post("/weights/pause", json={})
    assert server.http.post("/weights/update", json={"version": 4, "reload": {"path": "/c"}}).status_code == 409
    assert backend.double.admin_log == []
    for bad in ({"path": ""}, {"path": "/c", "extra": 1}, {"path": "/c", "timeout_s": 0}, {}):
        answer = server.http.post("/weights/update", json={"version": 6, "reload": bad})
        assert answer.status_code == 422, (bad, answer.text)
    assert backend.double.admin_log == []


def test_update_with_servers_reloads_the_new_backend_set(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = paused_server(start_server, [old.address])
    body = {"version": 2, "servers": [{"address": new.address}], "reload": {"path": "/ckpt/2"}}
    answer = server.http.post("/weights/update", json=body)
    assert answer.status_code == 200, answer.text
    assert [s["address"] for s in answer.json()["servers"]] == [new.address.rstrip("/")]
    assert old.double.admin_log == [] and new.double.admin_log == ["reload_weights /ckpt/2", "reset_prefix_cache"]


def test_swap_with_a_failed_reload_stays_paused(start_server, backend):
    backend.double.bad_weight_paths.add("/bad")
    server = start_server([])
    server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 1})
    answer = server.http.post("/weights/swap", json={"version": 2, "reload": {"path": "/bad"}})
    assert answer.status_code == 502 and "stays paused" in answer.json()["detail"]
    assert weights(server)["paused"] and weights(server)["version"] is None
    assert server.http.post("/weights/resume").status_code == 200

    swapped = server.http.post("/weights/swap", json={"version": 2, "reload": {"path": "/good"}})
    assert swapped.status_code == 200, swapped.text
    assert swapped.json()["version"] == 2 and not swapped.json()["paused"]
    assert backend.double.admin_log[-2:] == ["reload_weights /good", "reset_prefix_cache"]


# the real vLLM ----------------------------------------------------------------------------------------


def run_job(server, job_id: str) -> dict:
    body = {"job_id": job_id, "instance": MULTITURN, "sampling_params": SHORT_TURN}
    result = server.http.post("/process", json=body, timeout=300).json()
    assert result["status"] == "completed", result
    return result


def test_vllm_reloads_from_a_checkpoint_and_resets_its_prefix_cache(start_server, vllm):
    server = start_server([])
    assert server.http.post("/add_llm_server", json={"address": vllm.address, "weight_version": 1}).is_success
    before = run_job(server, "before")
    assert [t["weight_version"] for t in before["trajectory"]["turns"]] == [1]

    # a prompt sent twice straight to vLLM (no cache_salt) hits its prefix cache the second time
    prompt = "Weight updates reset the prefix cache. " * 40  # over 2 blocks of 128 tokens (the CPU block size)
    vllm.complete(prompt)
    hits = vllm.metrics()["vllm:prefix_cache_hits_total"]
    vllm.complete(prompt)
    cached = vllm.metrics()["vllm:prefix_cache_hits_total"]
    assert cached > hits

    assert server.http.post("/weights/pause", json={}).json()["drained"]
    answer = server.http.post("/weights/update", json={"version": 2, "reload": {"path": vllm.model_dir}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["version"] == 2
    # the reset emptied the cache: the same prompt hits nothing now (it is looked up, and cached again)
    queries = vllm.metrics()["vllm:prefix_cache_queries_total"]
    vllm.complete(prompt)
    after = vllm.metrics()
    assert after["vllm:prefix_cache_hits_total"] == cached and after["vllm:prefix_cache_queries_total"] > queries
    assert server.http.post("/weights/resume").status_code == 200

    again = run_job(server, "after")
    assert [t["weight_version"] for t in again["trajectory"]["turns"]] == [2]
    # the same weights loaded again: greedy decoding gives the same tokens
    assert again["trajectory"]["turns"][0]["output_ids"] == before["trajectory"]["turns"][0]["output_ids"]


def test_vllm_reload_from_a_missing_checkpoint_is_502_and_the_engine_keeps_serving(start_server, vllm):
    server = start_server([])
    assert server.http.post("/add_llm_server", json={"address": vllm.address, "weight_version": 10}).is_success
    assert server.http.post("/weights/pause", json={}).json()["drained"]
    answer = server.http.post("/weights/update", json={"version": 11, "reload": {"path": "/nonexistent/checkpoint"}})
    assert answer.status_code == 502, answer.text
    detail = answer.json()["detail"]
    assert vllm.address in detail and "/nonexistent/checkpoint" in detail and "previous weights" in detail, detail
    assert server.http.get("/llm_servers").json()["servers"][0]["weight_version"] == 10
    assert server.http.post("/weights/resume").status_code == 200
    # vLLM leaves a model whose reload failed half torn down; the previous checkpoint was loaded back
    result = run_job(server, "after-failure")
    assert [t["weight_version"] for t in result["trajectory"]["turns"]] == [10]
    assert httpx.get(f"{vllm.url}/health", timeout=10, trust_env=False).status_code == 200
