"""Finished results stream in completion order by cursor, stay until acknowledged or expired."""

from __future__ import annotations

from prorl_server.pipeline import ResultStore
from prorl_server.protocol import JobResult, JobStatus


def test_list_by_cursor_filter_and_ack(server):
    for i in range(5):
        server.http.post("/process", json={"instance": {"data_source": "noop"}, "job_id": f"ok{i}"})
    server.http.post("/process", json={"instance": {"data_source": "raising", "fail_in": "init"}, "job_id": "bad"})

    page = server.http.get("/jobs", params={"limit": 3}).json()
    assert [r["job_id"] for r in page["results"]] == ["ok0", "ok1", "ok2"]
    rest = server.http.get("/jobs", params={"after": page["next_cursor"]}).json()
    assert [r["job_id"] for r in rest["results"]] == ["ok3", "ok4", "bad"]
    empty = server.http.get("/jobs", params={"after": rest["next_cursor"]}).json()
    assert empty == {"results": [], "next_cursor": rest["next_cursor"]}

    failed = server.http.get("/jobs", params={"status": "failed"}).json()["results"]
    assert [r["job_id"] for r in failed] == ["bad"]
    both = server.http.get("/jobs", params={"status": "failed,completed"}).json()["results"]
    assert len(both) == 6

    assert server.http.post("/jobs/ack", json={"through": page["next_cursor"]}).json() == {"acknowledged": 3}
    assert server.http.post("/jobs/ack", json={"job_ids": ["bad", "ghost"]}).json() == {"acknowledged": 1}
    remaining = server.http.get("/jobs").json()["results"]
    assert [r["job_id"] for r in remaining] == ["ok3", "ok4"]
    assert server.http.get("/jobs/ok0").status_code == 404


def test_results_expire_after_retention():
    now = [0.0]
    store = ResultStore(retention_s=10, clock=lambda: now[0])
    store.put(JobResult(job_id="a", status=JobStatus.COMPLETED))
    now[0] = 5
    store.put(JobResult(job_id="b", status=JobStatus.FAILED))
    now[0] = 12
    assert store.get("a") is None and store.get("b") is not None
    results, cursor = store.page(None, 0, 10)
    assert [r.job_id for r in results] == ["b"] and cursor == 2
    now[0] = 20
    assert len(store) == 0


def test_resubmitted_job_replaces_its_old_result():
    store = ResultStore(retention_s=100)
    store.put(JobResult(job_id="a", status=JobStatus.FAILED))
    store.put(JobResult(job_id="b", status=JobStatus.COMPLETED))
    store.put(JobResult(job_id="a", status=JobStatus.COMPLETED))
    results, _ = store.page(None, 0, 10)
    assert [(r.job_id, r.status) for r in results] == [("b", "completed"), ("a", "completed")]
