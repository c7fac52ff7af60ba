"""Synchronous handler methods run on the stage's worker threads and cannot stall the API or other stages."""

from __future__ import annotations

import threading
import time

import httpx
from conftest import default_handlers


def test_blocking_sync_init_stalls_neither_api_nor_other_jobs(start_server, backend):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers, init_workers=4)
    results: list[dict] = []
    blocker = threading.Thread(
        target=lambda: results.append(
            httpx.post(
                f"{server.url}/process", json={"instance": {"data_source": "sync", "block_s": 2}}, timeout=30
            ).json()
        )
    )
    blocker.start()
    time.sleep(0.3)  # the sync init is now sleeping in an INIT worker thread

    started = time.monotonic()
    assert server.http.get("/health").status_code == 200
    assert time.monotonic() - started < 0.5
    other = server.http.post("/process", json={"instance": {"data_source": "multiturn", "question": "q"}}).json()
    assert other["status"] == "completed" and time.monotonic() - started < 1.5
    assert blocker.is_alive()  # still blocked: the other job really overtook it

    blocker.join(30)
    assert results[0]["status"] == "completed" and results[0]["reward"] == 0.5
    assert results[0]["artifacts"]["text"].startswith("reply ")
    assert results[0]["timing"]["init_s"] >= 2
    names = handlers["sync"].threads
    assert {n.split("_")[0] for n in names} == {"prorl-init-sync", "prorl-run-sync", "prorl-eval-sync"}
