"""`GET /metrics`: the counters and gauges follow real jobs through a real server, and parse as Prometheus text."""

from __future__ import annotations

import os
import threading

import pytest
from handlers_for_tests import GatedHandler, MultiTurnChatHandler, RaisingHandler
from polling import wait_for
from prometheus_client.parser import text_string_to_metric_families
from repo_paths import DOCS
from server_jobs import result, submit

from prorl_server import AgentHandler, JobContext
from prorl_server.actions import ActionRefused
from prorl_server.observability.metrics import OTHER, BoundedLabels
from prorl_server.sandbox import SandboxSpec
from prorl_server.sandbox.limits import SandboxLimits


def scrape(server, **headers: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of `GET /metrics`, parsed by prometheus_client's parser: (name, labels) -> value."""
    response = server.http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist yet (a labelled counter before its first event)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_follow_jobs_through_the_server(start_server, backend):
    gated = GatedHandler()
    handlers = {"multiturn": MultiTurnChatHandler(), "raising": RaisingHandler(), "gated": gated}
    server = start_server([backend.address], handlers=handlers, run_workers=1)
    address = backend.address
    before = scrape(server)
    assert value(before, "prorl_jobs_finished_total", status="completed", data_source="multiturn") == 0
    assert value(before, "prorl_stage_workers", stage="run") == 1
    assert value(before, "prorl_backend_healthy", backend=address) == 1
    assert value(before, "prorl_pipeline_running") == 1

    # two gated jobs: one holds the only RUN worker, the other waits in RUN's queue
    for job_id in ("held", "waiting"):
        gated.proceed[job_id] = threading.Event()
        body = {"instance": {"data_source": "gated", "question": "q"}, "job_id": job_id}
        body["sampling_params"] = {"max_turns": 2}
        assert server.http.post("/jobs", json=body).status_code == 202

    def holding() -> bool:  # the held job has made its first LLM call (which pins it to the backend)
        samples = scrape(server)
        return (
            value(samples, "prorl_stage_queue_depth", stage="run") == 1
            and value(samples, "prorl_backend_jobs_pinned", backend=address) == 1
        )

    wait_for(holding, 20, "one job running, pinned to the backend, and one queued for RUN")
    held = scrape(server)
    assert value(held, "prorl_stage_busy_workers", stage="run") == 1
    assert value(held, "prorl_jobs_live", status="run") == 1 and value(held, "prorl_jobs_live", status="queued") == 1
    for event in gated.proceed.values():
        event.set()

    for i in range(3):
        submit(server, f"m{i}")
    server.http.post("/jobs", json={"instance": {"data_source": "raising", "fail_in": "run"}, "job_id": "bad"})
    results = [result(server, job_id) for job_id in ("held", "waiting", "m0", "m1", "m2", "bad")]
    assert [r["status"] for r in results] == ["completed"] * 5 + ["failed"]

    after = scrape(server)
    assert value(after, "prorl_jobs_finished_total", status="completed", data_source="multiturn") == 3
    assert value(after, "prorl_jobs_finished_total", status="completed", data_source="gated") == 2
    assert value(after, "prorl_jobs_finished_total", status="failed", data_source="raising") == 1
    assert value(after, "prorl_stage_duration_seconds_count", stage="run") == 6
    assert value(after, "prorl_stage_duration_seconds_count", stage="eval") == 5  # the failed job had no EVAL
    assert value(after, "prorl_job_duration_seconds_count") == 6
    assert value(after, "prorl_trajectory_tokens_count") == 6
    tokens = sum(len(r["trajectory"]["prompt_ids"]) + len(r["trajectory"]["response_ids"]) for r in results)
    assert value(after, "prorl_trajectory_tokens_sum") == tokens
    turns = [turn for r in results for turn in r["trajectory"]["turns"]]
    assert value(after, "prorl_llm_request_duration_seconds_count", backend=address) == len(turns)
    prompt = sum(t["prompt_len"] for t in turns)
    assert value(after, "prorl_llm_prompt_tokens_total", backend=address) == prompt
    generated = sum(len(t["output_ids"]) for t in turns)
    assert value(after, "prorl_llm_generation_tokens_total", backend=address) == generated
    assert value(after, "prorl_results_stored_total") == 6
    assert value(after, "prorl_results_held") == 6
    assert value(after, "prorl_stage_busy_workers", stage="run") == 0
    assert value(after, "prorl_backend_calls_in_flight", backend=address) == 0

    assert server.http.post("/jobs/ack", json={"job_ids": ["m0", "m1"]}).status_code == 200
    acked = scrape(server)
    assert value(acked, "prorl_results_acknowledged_total") == 2
    assert value(acked, "prorl_results_held") == 4


class SandboxToolHandler(AgentHandler):
    """INIT starts a sandbox (and one that cannot start: 1 MB of memory); RUN uses two tools, one failing."""

    name = "sandboxed"

    async def init(self, ctx: JobContext) -> None:
        await ctx.start_sandbox()
        try:
            await ctx.start_sandbox(SandboxSpec(limits=SandboxLimits(memory_mb=1)))
        except Exception as exc:
            ctx.artifacts["start_failure"] = type(exc).__name__

    async def run(self, ctx: JobContext) -> None:
        observation = await ctx.sandbox.bash("echo hello")
        ctx.artifacts["output"] = observation.output
        try:
            await ctx.sandbox.read_file("/no/such/file")
        except Exception as exc:
            ctx.artifacts["read_error"] = type(exc).__name__

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_sandbox_and_tool_metrics(start_server, backend):
    server = start_server([backend.address], handlers={"sandboxed": SandboxToolHandler()}, runtime="local")
    server.http.post("/jobs", json={"instance": {"data_source": "sandboxed"}, "job_id": "s"})
    done = result(server, "s", timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["artifacts"]["start_failure"] == "SandboxError" and "read_error" in done["artifacts"]

    samples = scrape(server)
    assert value(samples, "prorl_sandbox_starts_total") == 1
    assert value(samples, "prorl_sandbox_start_failures_total") == 1
    assert value(samples, "prorl_sandbox_start_duration_seconds_count") == 1
    assert value(samples, "prorl_sandboxes_live") == 0  # released after RUN
    assert value(samples, "prorl_tool_action_duration_seconds_count", action="bash") == 1
    assert value(samples, "prorl_tool_action_duration_seconds_count", action="read_file") == 1
    assert value(samples, "prorl_tool_action_failures_total", action="read_file") == 1
    assert value(samples, "prorl_tool_action_failures_total", action="bash") == 0


def test_data_source_labels_are_bounded():
    labels = BoundedLabels(limit=2, max_chars=8)
    assert [labels(v) for v in ("a", "b", "c", "a", "b", "d")] == ["a", "b", OTHER, "a", "b", OTHER]
    assert BoundedLabels(limit=5, max_chars=8)("x" * 100) == "x" * 8


def test_two_servers_keep_their_own_metrics(start_server, backend):
    first = start_server([backend.address])
    second = start_server([backend.address])
    submit(first, "only-here")
    result(first, "only-here")
    assert value(scrape(first), "prorl_results_stored_total") == 1
    assert value(scrape(second), "prorl_results_stored_total") == 0


class ActionsHandler(AgentHandler):
    """RUN starts a sandbox (an action of kind `start`) and runs two bash actions in it, one of kind `tests` asking
    1 to 2 cores, and one asking more cores than the node has (refused)."""

    name = "actions"

    async def run(self, ctx: JobContext) -> None:
        sandbox = await ctx.start_sandbox()
        await sandbox.bash("sleep 0.2")
        ctx.artifacts["dop"] = (await sandbox.bash("echo $PRORL_DOP", dop=(1, 2), kind="tests")).output.strip()
        try:
            await sandbox.bash("echo never", dop=len(os.sched_getaffinity(0)) + 1, kind="tests")
        except ActionRefused as exc:
            ctx.artifacts["refused"] = str(exc)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_action_scheduler_metrics_and_status(start_server, backend):
    cores = len(os.sched_getaffinity(0))
    server = start_server(
        [backend.address], handlers={"actions": ActionsHandler()}, runtime="local", action_cpu_reserve=0
    )
    before = scrape(server)
    assert value(before, "prorl_action_pool_cores") == cores
    assert value(before, "prorl_action_pool_busy_cores") == value(before, "prorl_action_pool_waiting") == 0
    assert value(before, "prorl_action_pool_busy_core_seconds_total") == 0
    server.http.post("/jobs", json={"instance": {"data_source": "actions"}, "job_id": "a"})
    done = result(server, "a", timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["artifacts"]["dop"] == "1" and "refused" in done["artifacts"]

    samples = scrape(server)
    assert value(samples, "prorl_action_completion_seconds_count", kind="bash") == 1
    assert value(samples, "prorl_action_completion_seconds_sum", kind="bash") >= 0.2
    assert value(samples, "prorl_action_completion_seconds_bucket", kind="bash", le="0.1") == 0
    assert value(samples, "prorl_action_completion_seconds_bucket", kind="bash", le="+Inf") == 1
    assert value(samples, "prorl_action_completion_seconds_count", kind="tests") == 1
    assert value(samples, "prorl_action_queue_seconds_count", kind="tests") == 1
    assert value(samples, "prorl_action_queue_seconds_sum", kind="tests") < 1  # nothing else held the pool
    assert value(samples, "prorl_action_granted_cores_sum", kind="tests") == 1  # no duration model yet: the minimum
    assert value(samples, "prorl_action_granted_cores_bucket", kind="tests", le="1.0") == 1
    assert value(samples, "prorl_action_refused_total", kind="tests") == 1
    assert value(samples, "prorl_action_refused_total", kind="bash") == 0
    assert value(samples, "prorl_action_pool_busy_cores") == value(samples, "prorl_action_pool_running") == 0
    assert value(samples, "prorl_action_completion_seconds_count", kind="start") == 1  # the sandbox start
    # the three actions held one core each, for their completion time but their queueing
    kinds = ("start", "bash", "tests")
    completion = sum(value(samples, "prorl_action_completion_seconds_sum", kind=k) for k in kinds)
    queued = sum(value(samples, "prorl_action_queue_seconds_sum", kind=k) for k in kinds)
    busy = value(samples, "prorl_action_pool_busy_core_seconds_total")
    assert busy == pytest.approx(completion - queued, abs=1e-6)

    families = {f.name for f in text_string_to_metric_families(server.http.get("/metrics").text)}
    documented = (DOCS / "metrics.md").read_text()
    action_families = {name for name in families if name.startswith("prorl_action_")}
    assert len(action_families) == 9 and all(f"| `{name}" in documented for name in action_families)

    actions = server.http.get("/status").json()["actions"]
    assert (actions["cores"], actions["busy_cores"], actions["waiting"]) == (cores, 0, 0)
    assert set(actions["kinds"]) == {"start", "bash", "tests"}
    tests = actions["kinds"]["tests"]
    assert (tests["granted"], tests["completed"], tests["refused"], tests["mean_cores"]) == (1, 1, 1, 1.0)
    assert actions["kinds"]["bash"]["mean_act_s"] == value(samples, "prorl_action_completion_seconds_sum", kind="bash")


def test_without_the_action_scheduler_there_are_no_action_metrics(start_server, backend):
    server = start_server([backend.address], runtime="local", action_scheduler=False)
    assert "prorl_action_" not in server.http.get("/metrics").text
    assert server.http.get("/status").json()["actions"] is None


class LoopBlockingHandler(AgentHandler):
    """RUN blocks its stage's event loop for 300 ms (time.sleep in an async method: what not to do)."""

    name = "blocking"

    async def run(self, ctx: JobContext) -> None:
        import time

        time.sleep(0.3)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_event_loop_lag_is_sampled_on_every_loop(start_server, backend):
    server = start_server([backend.address], handlers={"blocking": LoopBlockingHandler()})

    def late(samples: dict, loop: str) -> float:
        """Samples of `loop` later than 100 ms."""
        total = value(samples, "prorl_event_loop_lag_seconds_count", loop=loop)
        return total - value(samples, "prorl_event_loop_lag_seconds_bucket", loop=loop, le="0.1")

    wait_for(
        lambda: all(value(scrape(server), "prorl_event_loop_lag_seconds_count", loop=loop) > 0 for loop in LOOPS),
        10,
        "every loop sampled",
    )
    before = scrape(server)
    submit(server, "blocks", instance={"data_source": "blocking"})
    assert result(server, "blocks")["status"] == "completed"
    wait_for(lambda: late(scrape(server), "run") > late(before, "run"), 10, "the RUN loop's late sample")


LOOPS = ("api", "init", "run", "eval")
