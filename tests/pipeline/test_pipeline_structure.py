"""The pipeline's groundwork: the Stage enum, handler methods resolved once, one release per job on every
outcome, and the token stream's single owner."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from polling import wait_for

from prorl_server import AgentHandler, JobContext
from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.llm.token_stream import TokenStream
from prorl_server.pipeline import STAGES
from prorl_server.pipeline.handler_calls import HandlerMethodCache
from prorl_server.protocol import ErrorInfo, Stage, Trajectory, TurnRecord

# the Stage enum ----------------------------------------------------------------------------------------


def test_stages_are_ordered_and_chain_init_run_eval():
    assert list(Stage) == [Stage.INIT, Stage.RUN, Stage.EVAL] and tuple(Stage) == STAGES
    assert [stage.value for stage in Stage] == ["init", "run", "eval"]
    assert Stage.INIT.next is Stage.RUN and Stage.RUN.next is Stage.EVAL and Stage.EVAL.next is None
    assert Stage.RUN.exception_hook == "run_exception"


def test_a_stage_goes_on_the_wire_as_its_name():
    error = ErrorInfo(stage=Stage.EVAL, type="X", message="m")
    assert error.model_dump()["stage"] == "eval" and '"stage":"eval"' in error.model_dump_json()
    assert f"{Stage.INIT}" == "init" and Stage("run") is Stage.RUN


# handler methods resolved once -----------------------------------------------------------------------

_LOOKED_UP = {"init", "run", "eval", "init_exception", "run_exception", "eval_exception", "final_result"}


class LookupCountingHandler(AgentHandler):
    """Counts how often the pipeline's methods are looked up on the object."""

    name = "lookups"

    def __init__(self) -> None:
        object.__setattr__(self, "lookups", Counter())

    def __getattribute__(self, name: str) -> Any:
        if name in _LOOKED_UP:
            object.__getattribute__(self, "lookups")[name] += 1
        return object.__getattribute__(self, name)

    async def init(self, ctx: JobContext) -> None:
        return None

    async def run(self, ctx: JobContext) -> None:
        if ctx.instance.get("fail"):
            raise RuntimeError("run failed on purpose")

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_handler_methods_are_looked_up_once_per_handler_not_per_job(start_server, backend):
    handler = LookupCountingHandler()
    server = start_server([backend.address], handlers={"lookups": handler})
    for index in range(4):
        instance = {"data_source": "lookups", "fail": index % 2 == 1}
        result = server.http.post("/process", json={"instance": instance}).json()
        assert result["status"] == ("failed" if index % 2 else "completed")
    assert handler.lookups == Counter({name: 1 for name in _LOOKED_UP})


def test_the_method_cache_resolves_each_handler_object_once():
    cache = HandlerMethodCache()
    first, second = LookupCountingHandler(), LookupCountingHandler()
    methods = cache.get(first)
    assert cache.get(first) is methods and cache.get(second) is not methods
    assert methods.stage(Stage.RUN).is_async and methods.stage(Stage.INIT).overridden
    assert not methods.exception_hook(Stage.EVAL).overridden and not methods.final_result.overridden
    assert first.lookups == Counter({name: 1 for name in _LOOKED_UP})


# one release per job, on every outcome ------------------------------------------------------------------


class ReleaseCountingHandler(AgentHandler):
    """Registers a cleanup in every stage it reaches; fails or blocks in the stage the instance names."""

    name = "counting"

    def __init__(self) -> None:
        self.released: Counter[tuple[str, str]] = Counter()
        self.entered: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    async def init(self, ctx: JobContext) -> None:
        await self._stage(ctx, "init")

    async def run(self, ctx: JobContext) -> None:
        await self._stage(ctx, "run")

    async def eval(self, ctx: JobContext) -> float:
        await self._stage(ctx, "eval")
        return 1.0

    async def _stage(self, ctx: JobContext, stage: str) -> None:
        ctx.on_release(lambda: self._count(ctx.job_id, stage))
        with self._lock:
            self.entered.add((ctx.job_id, stage))
        if ctx.instance.get("fail") == stage:
            raise RuntimeError(f"{stage} failed on purpose")
        if ctx.instance.get("block") == stage:
            await asyncio.sleep(30)

    def _count(self, job_id: str, stage: str) -> None:
        with self._lock:
            self.released[job_id, stage] += 1

    def entered_by(self, job_id: str) -> set[str]:
        with self._lock:
            return {stage for job, stage in self.entered if job == job_id}

    def releases_of(self, job_id: str) -> dict[str, int]:
        with self._lock:
            return {stage: n for (job, stage), n in self.released.items() if job == job_id}


@pytest.fixture
def final_releases(monkeypatch) -> Counter[str]:
    """How often each job's resources were released once it had ended (spy on JobContext.release)."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    original = JobContext.release

    async def spy(self: JobContext) -> None:
        if self.finished:
            with lock:
                counts[self.job_id] += 1
        await original(self)

    monkeypatch.setattr(JobContext, "release", spy)
    return counts


def _submit(server, job_id: str, timeout: float | None = None, **instance: str) -> None:
    body: dict[str, Any] = {"instance": {"data_source": "counting", **instance}, "job_id": job_id}
    if timeout is not None:
        body["timeout"] = timeout
    assert server.http.post("/jobs", json=body).status_code == 202


def _result(server, job_id: str) -> dict[str, Any]:
    wait_for(lambda: server.http.get(f"/jobs/{job_id}").json()["result"] is not None, 10, f"{job_id} ended")
    return server.http.get(f"/jobs/{job_id}").json()["result"]


def _assert_released_once(handler: ReleaseCountingHandler, final_releases: Counter[str], job_id: str) -> None:
    expected = dict.fromkeys(handler.entered_by(job_id), 1)
    wait_for(lambda: handler.releases_of(job_id) == expected, 10, f"every cleanup of {job_id} ran")
    wait_for(lambda: final_releases[job_id] >= 1, 10, f"{job_id} was released after it ended")
    assert handler.releases_of(job_id) == expected and final_releases[job_id] == 1, job_id


def test_release_happens_once_when_a_job_completes_fails_or_times_out(start_server, backend, final_releases):
    handler = ReleaseCountingHandler()
    server = start_server([backend.address], handlers={"counting": handler})
    outcomes = {
        "done": ({}, "completed"),
        "fail-init": ({"fail": "init"}, "failed"),
        "fail-run": ({"fail": "run"}, "failed"),
        "fail-eval": ({"fail": "eval"}, "failed"),
        "late": ({"block": "run"}, "timeout"),
    }
    for job_id, (instance, _) in outcomes.items():
        _submit(server, job_id, timeout=0.5 if job_id == "late" else None, **instance)
    for job_id, (_, status) in outcomes.items():
        assert _result(server, job_id)["status"] == status, job_id
    for job_id in outcomes:
        _assert_released_once(handler, final_releases, job_id)
    assert handler.releases_of("done") == {"init": 1, "run": 1, "eval": 1}
    assert handler.releases_of("fail-init") == {"init": 1}


def test_release_happens_once_when_a_job_is_cancelled_queued_or_running(start_server, backend, final_releases):
    handler = ReleaseCountingHandler()
    server = start_server([backend.address], handlers={"counting": handler}, run_workers=1)
    _submit(server, "running", block="run")
    wait_for(lambda: server.http.get("/jobs/running").json()["status"] == "run", 10, "the first job runs")
    _submit(server, "queued")
    wait_for(lambda: server.state.orchestrator.pools["run"].depth == 1, 10, "the second job waits for RUN")
    assert server.http.delete("/jobs/queued").json()["status"] == "cancelled"
    _assert_released_once(handler, final_releases, "queued")
    assert server.http.delete("/jobs/running").json()["status"] == "cancelled"
    _assert_released_once(handler, final_releases, "running")
    # the cancelled job left the RUN queue without running, and without a second release
    wait_for(lambda: server.state.orchestrator.pools["run"].depth == 0, 10, "the RUN queue drained")
    wait_for(lambda: server.state.orchestrator.pools["run"].busy == 0, 10, "the RUN worker is idle")
    assert final_releases["queued"] == 1 and handler.releases_of("queued") == {"init": 1}
    assert _result(server, "queued")["error"]["stage"] == "run"


def test_release_happens_once_for_every_job_a_stop_cancels(start_server, backend, final_releases):
    handler = ReleaseCountingHandler()
    server = start_server([backend.address], handlers={"counting": handler}, run_workers=1)
    _submit(server, "in-eval", block="eval")
    wait_for(lambda: ("in-eval", "eval") in handler.entered, 10, "the first job is in EVAL")
    _submit(server, "in-run", block="run")
    wait_for(lambda: ("in-run", "run") in handler.entered, 10, "the second job is in RUN")
    _submit(server, "waiting")
    wait_for(lambda: server.state.orchestrator.pools["run"].depth == 1, 10, "the third job waits for RUN")
    assert server.http.post("/stop").status_code == 200
    for job_id in ("in-run", "in-eval", "waiting"):
        assert _result(server, job_id)["status"] == "cancelled"
        _assert_released_once(handler, final_releases, job_id)


# the token stream ---------------------------------------------------------------------------------------


def _turn(ids: list[int]) -> TurnRecord:
    return TurnRecord(backend="b", prompt_len=0, output_ids=ids, logprobs=[-0.5] * len(ids))


def test_token_stream_keeps_ids_mask_and_logprobs_in_step_under_concurrent_appends():
    trajectory = Trajectory()
    stream = TokenStream(trajectory)
    stream.set_prompt([1, 2, 3], [{"role": "user", "content": "q"}])
    appends_per_thread, k = 300, 3
    stop = threading.Event()
    problems: list[str] = []

    def sample() -> None:
        for _ in range(appends_per_thread):
            ids = [7] * k
            stream.append_sampled(ids, [-0.5] * k, _turn(ids), {"role": "assistant", "content": "a"})

    def observe() -> None:
        for n in range(appends_per_thread):
            stream.append_observation([9] * (1 + n % 4), [{"role": "user", "content": "o"}])

    def check() -> None:
        while not stop.is_set():
            snap = stream.snapshot()
            lengths = {len(snap.response_ids), len(snap.response_mask), len(snap.response_logprobs)}
            if len(lengths) != 1:
                problems.append(f"lengths differ: {lengths}")
                continue
            for token, mask, logprob in zip(snap.response_ids, snap.response_mask, snap.response_logprobs, strict=True):
                if (token, mask, logprob) not in {(7, 1, -0.5), (9, 0, 0.0)}:
                    problems.append(f"token {token} has mask {mask} and logprob {logprob}")
                    break
            if sum(snap.response_mask) != k * len(snap.turns):
                problems.append("a sampled turn's tokens and its record were seen apart")

    writers = [threading.Thread(target=fn) for fn in (sample, observe, sample, observe)]
    checker = threading.Thread(target=check)
    checker.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    checker.join()
    assert not problems, problems[:3]
    assert len(trajectory.response_ids) == len(trajectory.response_mask) == len(trajectory.response_logprobs)
    assert (
        len(trajectory.turns) == 2 * appends_per_thread and sum(trajectory.response_mask) == 2 * appends_per_thread * k
    )
    assert stream.token_ids[:3] == [1, 2, 3] and len(trajectory.messages) == 1 + 4 * appends_per_thread


def test_token_stream_refuses_a_sampled_turn_whose_logprobs_do_not_match_its_ids():
    stream = TokenStream(Trajectory())
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        stream.append_sampled([1, 2], [-0.1], _turn([1, 2]), {"role": "assistant", "content": ""})
    assert stream.snapshot().response_ids == [] and not stream.started


def test_token_stream_adopts_a_recorded_trajectory_only_while_empty_and_in_step():
    recorded = Trajectory(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 0])
    with pytest.raises(ValueError, match="same length"):
        TokenStream(Trajectory()).adopt(recorded)  # no logprobs: out of step
    recorded.response_logprobs = [-0.5, -0.25, 0.0]
    stream = TokenStream(Trajectory())
    assert stream.adopt(recorded) and stream.counts() == (2, 0, 2, 1)
    assert stream.snapshot().response_ids == [3, 4, 5]
    written = TokenStream(Trajectory())
    written.append_observation([9])
    assert not written.adopt(recorded) and written.snapshot().response_ids == [9]  # its own writes stay


def test_a_snapshot_is_a_copy():
    trajectory = Trajectory()
    stream = TokenStream(trajectory)
    stream.append_observation([4, 5])
    snap = stream.snapshot()
    stream.append_observation([6])
    assert snap.response_ids == [4, 5] and trajectory.response_ids == [4, 5, 6]


def test_the_session_writes_through_its_token_stream_and_uses_the_client_it_was_given():
    pool = BackendPool(VLLMClient())
    client = VLLMClient()
    trajectory = Trajectory()
    session = LLMSession("j", pool, trajectory, client=client)
    assert session.client is client and session.tokens.trajectory is trajectory
    assert LLMSession("k", pool, Trajectory()).client is pool.client
