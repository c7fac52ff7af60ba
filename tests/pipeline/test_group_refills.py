"""Group refills: a member that fails for an infrastructure reason is launched again so the group keeps its
size; a failure of the handler's own is not; refills are bounded, recorded, counted, and cancelled with
their group."""

from __future__ import annotations

import threading
import time

from test_groups import QUESTION, live_jobs, wait_until

from prorl_server import AgentHandler, JobContext
from prorl_server.journal import RESTART_ERROR_TYPE
from prorl_server.journal.database import Batch, open_database, write
from prorl_server.pipeline.groups import member_request
from prorl_server.pipeline.refill import INFRASTRUCTURE_ERRORS, refill_reason
from prorl_server.pipeline.submission import request_digest
from prorl_server.protocol import ErrorInfo, GroupRequest, JobResult, JobStatus
from prorl_server.sandbox import SandboxLimits, SandboxSpec
from prorl_server.testing import ScriptedReply

FAILS_FAST = {"llm_max_failovers": 0, "llm_failure_threshold": 1000}  # one 503 fails the call; no circuit opens
UNAVAILABLE = ScriptedReply(text="x", status_code=503)


def refills_metric(server, reason: str) -> float:
    for line in server.http.get("/metrics").text.splitlines():
        if line.startswith(f'prorl_group_refills_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_only_infrastructure_failures_are_refilled():
    def failed(kind: str, status: JobStatus = JobStatus.FAILED) -> JobResult:
        return JobResult(job_id="j", status=status, error=ErrorInfo(stage="run", type=kind, message="m"))

    assert RESTART_ERROR_TYPE in INFRASTRUCTURE_ERRORS
    for kind in INFRASTRUCTURE_ERRORS:
        assert refill_reason(failed(kind)) == kind
    # the handler's own exceptions, a failed EVAL, a request the backend refused (4xx): signal, not refilled
    for kind in ("ValueError", "KeyError", "TypeError", "BackendRequestError", "InvalidResult", "StageLoopDied"):
        assert refill_reason(failed(kind)) is None
    for status in (JobStatus.TIMEOUT, JobStatus.STALE, JobStatus.CANCELLED):
        assert refill_reason(failed("SandboxError", status)) is None  # only a failed member is refilled
    assert refill_reason(JobResult(job_id="j", status=JobStatus.COMPLETED)) is None


def test_a_member_whose_backend_fails_is_refilled_and_the_group_keeps_its_size(start_server, backend):
    server = start_server([backend.address], **FAILS_FAST)
    backend.double.push(UNAVAILABLE, "DONE", "DONE")
    group = server.http.post("/groups", json={"instance": QUESTION, "n": 2, "group_id": "r"}).json()
    assert group["status"] == "completed" and group["usable"] == 2 and not group["partial"], group
    assert group["n_launch"] == 2 and len(group["members"]) == 3
    failed = next(m for m in group["members"] if m["status"] == "failed")
    assert group["refills"] == [
        {"index": 2, "job_id": "r:2", "replaced_job_id": failed["job_id"], "reason": "BackendUnavailable"}
    ]
    refill = group["members"][2]
    assert refill["refill_of"] == failed["job_id"] and refill["status"] == "completed" and refill["selected"]
    assert all(m["refill_of"] is None for m in group["members"][:2])
    assert server.http.get("/jobs/r:2").json()["status"] == "completed"  # an ordinary job
    assert refills_metric(server, "BackendUnavailable") == 1


def test_a_handler_failure_is_signal_and_not_refilled(start_server, backend):
    server = start_server([backend.address], **FAILS_FAST)
    body = {"instance": {"data_source": "raising", "fail_in": "run"}, "n": 2, "group_id": "h"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "failed" and group["refills"] == [] and len(group["members"]) == 2
    assert server.http.get("/jobs/h:0").json()["result"]["error"]["type"] == "ValueError"

    backend.double.push(ScriptedReply(text="bad", status_code=400))  # the backend refused the request: no retry helps
    group = server.http.post("/groups", json={"instance": QUESTION, "n": 1, "group_id": "h4"}).json()
    assert group["status"] == "failed" and group["refills"] == [] and len(group["members"]) == 1


def test_refills_are_bounded_per_member_and_per_group_with_a_backend_that_always_fails(start_server, backend):
    server = start_server([backend.address], group_refill_attempts=2, group_max_refills=3, **FAILS_FAST)
    backend.double.push(*(UNAVAILABLE for _ in range(50)))
    one = server.http.post("/groups", json={"instance": QUESTION, "n": 1, "group_id": "b1"}).json()
    assert one["status"] == "failed" and len(one["members"]) == 3  # the member, then 2 refills of it
    assert [(r["index"], r["replaced_job_id"]) for r in one["refills"]] == [(1, "b1:0"), (2, "b1:1")]
    assert all(m["status"] == "failed" for m in one["members"])

    three = server.http.post("/groups", json={"instance": QUESTION, "n": 3, "group_id": "b3"}).json()
    assert three["status"] == "failed" and len(three["refills"]) == 3 and len(three["members"]) == 6  # the cap
    assert refills_metric(server, "BackendUnavailable") == 5
    wait_until(lambda: live_jobs(server) == {})


def test_no_refill_while_the_redundant_members_still_can_make_n(start_server, backend):
    server = start_server([backend.address], **FAILS_FAST)
    backend.double.push(UNAVAILABLE, ScriptedReply(text="DONE", delay_s=0.5), ScriptedReply(text="DONE", delay_s=0.5))
    body = {"instance": QUESTION, "n": 2, "n_launch": 3, "group_id": "spare"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 2 and group["refills"] == []
    assert len(group["members"]) == 3


def test_dual_end_refills_to_keep_the_members_it_selects_among(start_server, backend):
    server = start_server([backend.address], **FAILS_FAST)
    backend.double.push(UNAVAILABLE, "DONE short", "DONE a longer answer")
    body = {"instance": QUESTION, "n": 1, "n_launch": 2, "selection": "dual_end", "group_id": "de"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 2 and len(group["refills"]) == 1
    assert [m["status"] for m in group["members"]].count("completed") == 2


def test_cancelling_a_group_cancels_its_refills_and_launches_no_more(start_server, backend):
    server = start_server([backend.address], **FAILS_FAST)
    backend.double.push(UNAVAILABLE, *(ScriptedReply(text="DONE", delay_s=30) for _ in range(3)))
    body = {"instance": QUESTION, "n": 2, "group_id": "c"}
    assert server.http.post("/groups?wait=false", json=body).status_code == 202
    wait_until(lambda: len(server.http.get("/groups/c").json()["refills"]) == 1)
    wait_until(lambda: len(backend.double.requests) == 3)  # the refill's LLM request is in flight
    group = server.http.delete("/groups/c").json()
    assert group["status"] == "failed" and len(group["members"]) == 3 and len(group["refills"]) == 1
    assert sorted(m["status"] for m in group["members"]) == ["cancelled", "cancelled", "failed"]
    wait_until(lambda: live_jobs(server) == {})
    wait_until(lambda: sorted(r.outcome for r in backend.double.requests)[:2] == ["aborted", "aborted"])
    time.sleep(0.3)
    assert len(server.http.get("/groups/c").json()["members"]) == 3 and len(backend.double.requests) == 3


class FlakySandboxHandler(AgentHandler):
    """INIT starts a sandbox; the first `failures` starts ask for 1 MB of memory, which cannot start."""

    name = "flaky_sandbox"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self._lock = threading.Lock()

    async def init(self, ctx: JobContext) -> None:
        with self._lock:
            fail, self.failures = self.failures > 0, self.failures - 1
        await ctx.start_sandbox(SandboxSpec(limits=SandboxLimits(memory_mb=1)) if fail else None)

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["output"] = (await ctx.sandbox.bash("echo hello")).output

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_a_member_whose_sandbox_cannot_start_is_refilled(start_server, backend):
    handler = FlakySandboxHandler(failures=1)
    server = start_server([backend.address], handlers={"flaky_sandbox": handler}, runtime="local")
    body = {"instance": {"data_source": "flaky_sandbox"}, "n": 2, "group_id": "s"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 2, group
    [refill] = group["refills"]
    assert refill["reason"] == "SandboxError" and refill["index"] == 2
    error = server.http.get(f"/jobs/{refill['replaced_job_id']}").json()["result"]["error"]
    assert (error["stage"], error["type"]) == ("init", "SandboxError")
    assert refills_metric(server, "SandboxError") == 1


def test_members_in_flight_at_a_restart_are_refilled_when_the_group_is_posted_again(tmp_path, start_server, backend):
    journal = tmp_path / "journal.sqlite3"
    body = {"instance": QUESTION, "n": 2, "group_id": "g"}
    members = [member_request(GroupRequest.model_validate(body), "g", i) for i in range(2)]
    db = open_database(journal)  # what a server killed with both members in flight leaves behind
    added = [(m.job_id, request_digest(m), m.model_dump_json(), time.time()) for m in members]
    write(db, Batch(jobs_added=added))
    db.close()

    server = start_server([backend.address], journal=str(journal))
    assert server.http.get("/jobs/g:0").json()["result"]["error"]["type"] == RESTART_ERROR_TYPE
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 2, group
    assert [(r["index"], r["replaced_job_id"], r["reason"]) for r in group["refills"]] == [
        (2, "g:0", RESTART_ERROR_TYPE),
        (3, "g:1", RESTART_ERROR_TYPE),
    ]
    assert [m["status"] for m in group["members"]] == ["failed", "failed", "completed", "completed"]


def test_a_refill_is_held_to_the_groups_staleness_bound(start_server, backend):
    server = start_server([backend.address], max_staleness=0, **FAILS_FAST)
    assert (
        server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 1}).status_code == 200
    )

    def group_across_an_update(group_id: str, version: int, *refill_replies: str, **extra) -> dict:
        backend.double.push("DONE", ScriptedReply(text="x", status_code=503, delay_s=1.5), *refill_replies)
        body = {"instance": QUESTION, "n": 2, "group_id": group_id, **extra}
        assert server.http.post("/groups?wait=false", json=body).status_code == 202

        def one_completed() -> bool:
            return any(m["status"] == "completed" for m in server.http.get(f"/groups/{group_id}").json()["members"])

        wait_until(one_completed)
        assert server.http.post("/weights/swap", json={"version": version}).status_code == 200  # while one call runs
        return server.http.get(f"/groups/{group_id}", params={"wait": 30}).json()

    # max_staleness 0: the refill would sample under version 2, a version past the group's first member's
    strict = group_across_an_update("strict", 2)  # the refill ends stale before it sends a request
    assert len(strict["refills"]) == 1 and strict["status"] == "failed"
    refill = strict["members"][2]
    assert refill["status"] == "stale" and refill["weight_versions"] == []
    error = server.http.get(f"/jobs/{refill['job_id']}").json()["result"]["error"]
    assert "the oldest turn of the group it refills" in error["message"]

    # with stale_policy continue the refill runs under the new weights, and the group says so
    mixed = group_across_an_update("mixed", 3, "DONE", stale_policy="continue")
    assert mixed["status"] == "completed" and len(mixed["refills"]) == 1
    versions = {m["index"]: m["weight_versions"] for m in mixed["members"] if m["status"] == "completed"}
    assert sorted(versions.values()) == [[2], [3]] and versions[2] == [3]
