"""An exception in any stage becomes a well-formed failed result naming the stage."""

from __future__ import annotations

import pytest
from suite_servers import default_handlers

from prorl_server import AgentHandler, ErrorInfo, JobContext, JobResult


@pytest.mark.parametrize(
    ("fail_in", "stage", "exc_type", "message"),
    [
        ("init", "init", "RuntimeError", "sandbox image missing"),
        ("run", "run", "ValueError", "tool crashed"),
        ("eval", "eval", "KeyError", "expected_output"),
        ("bad_reward", "eval", "TypeError", "must return a float reward"),
    ],
)
def test_stage_exception_gives_failed_result_naming_the_stage(start_server, backend, fail_in, stage, exc_type, message):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers)
    response = server.http.post("/process", json={"instance": {"data_source": "raising", "fail_in": fail_in}})
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "failed"
    assert result["reward"] is None
    assert result["error"]["stage"] == stage
    assert result["error"]["type"] == exc_type
    assert message in result["error"]["message"]
    assert handlers["raising"].released == [result["job_id"]]  # resources released on every path
    if fail_in in ("run", "eval", "bad_reward"):
        assert len(result["trajectory"]["turns"]) == 1  # what RUN produced is kept


class RecoveringHandler(AgentHandler):
    """Overrides the hooks: RUN errors are tolerated (EVAL still runs), final_result adds an artifact."""

    name = "recovering"

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["partial"] = True
        raise RuntimeError("agent crashed")

    def run_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        ctx.state["run_error"] = str(exc)
        return None

    async def eval(self, ctx: JobContext) -> dict:
        return {"reward": -1.0, "why": ctx.state["run_error"]}

    async def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        result.artifacts["reviewed"] = True
        return result


class BrokenFinalResult(AgentHandler):
    name = "broken_final"

    async def run(self, ctx: JobContext) -> None:
        return None

    async def eval(self, ctx: JobContext) -> float:
        return 1.0

    def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        raise RuntimeError("oops")


def test_exception_hooks_can_recover_and_final_result_can_amend(start_server, backend):
    server = start_server(
        [backend.address], handlers={"recovering": RecoveringHandler(), "broken_final": BrokenFinalResult()}
    )
    result = server.http.post("/process", json={"instance": {"data_source": "recovering"}}).json()
    assert result["status"] == "completed"
    assert result["reward"] == -1.0 and result["eval"] == {"why": "agent crashed"}
    assert result["artifacts"] == {"partial": True, "reviewed": True}

    broken = server.http.post("/process", json={"instance": {"data_source": "broken_final"}}).json()
    assert broken["status"] == "failed"
    error = broken["error"]
    assert (error["stage"], error["type"], error["message"]) == ("final_result", "RuntimeError", "oops")
    assert error["location"].endswith("in final_result") and "RuntimeError: oops" in error["traceback"]


class NonJsonArtifacts(AgentHandler):
    name = "nonjson"

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["sandbox"] = object()

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_non_json_artifacts_fail_the_job_and_never_break_retrieval(start_server, backend):
    server = start_server([backend.address], handlers={"nonjson": NonJsonArtifacts()})
    result = server.http.post("/process", json={"instance": {"data_source": "nonjson"}, "job_id": "nj"}).json()
    assert result["status"] == "failed" and result["error"]["type"] == "InvalidResult"
    assert "JSON" in result["error"]["message"] and result["artifacts"] == {}
    assert server.http.get("/jobs/nj").status_code == 200
    assert server.http.get("/jobs").status_code == 200
