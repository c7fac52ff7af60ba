"""Placement policies (`--placement`): least_loaded re-chooses at every call; presorted_dp places a job by the
presorted DP at its first completion, keeps it there, and moves it at a tool-call boundary when the rescaled
group sizes send it elsewhere and the gain beats recomputing its prefix.

Jobs of the "gated" handler wait between turns (their "tool time") until the test sets their event, so the
jobs a placement has to weigh are live at once. Each job's replies are scripted on every backend, since the
policy decides where they run.
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest
import server_jobs
from handlers_for_tests import GatedHandler
from polling import wait_for
from pydantic import ValidationError

from prorl_server.api.state import ServerState
from prorl_server.config import ServerSettings
from prorl_server.llm.placement import POLICIES, interference_profile, make_policy
from prorl_server.scheduling import placement_runtime
from prorl_server.scheduling.latency_profile import DEFAULT_PROFILE
from prorl_server.scheduling.partition import place
from prorl_server.scheduling.placement_runtime import TrajectoryPlacer
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.view import Prediction, TrajectoryView
from prorl_server.testing import ScriptedReply

LONG, SHORT = "the long task", "the short task"


def start(start_server, backends, **settings):
    handler = GatedHandler()
    server = start_server([b.address for b in backends], handlers={"gated": handler}, **settings)
    return server, handler


def script(backends, job_id: str, *replies) -> None:
    for backend in backends:
        backend.double.push(*replies, job=job_id)


def submit(server, job_id: str, question: str = "q", turns: int = 1) -> None:
    body = {"instance": {"data_source": "gated", "question": question}, "job_id": job_id}
    response = server.http.post("/jobs", json={**body, "agent_config": {"max_turns": turns}})
    assert response.status_code == 202, response.text


def result(server, job_id: str) -> dict:
    found = server_jobs.result(server, job_id, timeout=30)
    assert found["status"] == "completed", found
    return found


def backend_of(backends, job_id: str, call: int = 0):
    """The backend that received the job's `call`-th completion."""
    seen = [(r.started, b) for b in backends for r in b.double.requests if r.job_id == job_id]
    return sorted(seen, key=lambda item: item[0])[call][1]


def wait_calls(backends, job_id: str, count: int) -> None:
    wait_for(
        lambda: sum(r.job_id == job_id and r.outcome == "done" for b in backends for r in b.double.requests) >= count,
        20,
        f"{count} completion(s) of {job_id} answered",
    )


def servers(server) -> dict[str, dict]:
    return {s["address"]: s for s in server.http.get("/llm_servers").json()["servers"]}


WORDS = "word " * 100
REPLIES = {LONG: (WORDS, WORDS), SHORT: ("ok", "ok")}


def train(server, backends) -> None:
    """Finish two-turn jobs of a long and of a short prompt, so the shared predictor tells them apart."""
    for i in range(2):
        for question, kind in ((LONG, "long"), (SHORT, "short")):
            script(backends, f"{kind}-{i}", *REPLIES[question])
            submit(server, f"{kind}-{i}", question=question, turns=2)
            result(server, f"{kind}-{i}")


def hold(server, handler, backends, job_id: str, question: str, *replies) -> None:
    """Start a two-turn job that waits after its first answer until released."""
    handler.proceed[job_id] = threading.Event()
    script(backends, job_id, *(replies or REPLIES[question]))
    submit(server, job_id, question=question, turns=2)
    wait_calls(backends, job_id, 1)


def release(server, handler, job_ids) -> list[dict]:
    """Let the jobs go on one at a time, each finishing before the next goes on; their results."""
    results = []
    for job_id in job_ids:
        handler.proceed[job_id].set()
        results.append(result(server, job_id))
    return results


def test_every_policy_name_is_known_and_an_unknown_one_fails_at_start():
    assert set(POLICIES) == {"sticky_least_loaded", "min_heap", "least_loaded", "presorted_dp"}
    for name in POLICIES:
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="unknown placement policy 'random'"):
        make_policy("random")
    with pytest.raises(ValidationError):
        ServerSettings(placement="random")
    with pytest.raises(ValueError, match="latency profile"):
        ServerState.build(ServerSettings(placement="presorted_dp", interference_profile="8:fast"))


def test_least_loaded_spreads_one_jobs_calls_across_backends(start_server, start_backend):
    backends = [start_backend(), start_backend()]
    server, _ = start(start_server, backends, placement="least_loaded")
    script(backends, "j", "a", "b", "c", "d")
    submit(server, "j", turns=4)
    turns = result(server, "j")["trajectory"]["turns"]
    assert {t["backend"] for t in turns} == {b.address for b in backends}, turns
    for earlier, later in itertools.pairwise(turns):  # each call resends the whole context
        assert later["prompt_len"] > earlier["prompt_len"] + len(earlier["output_ids"])


def test_sticky_least_loaded_keeps_a_jobs_calls_on_one_backend(start_server, start_backend):
    backends = [start_backend(), start_backend()]
    server, _ = start(start_server, backends)
    script(backends, "j", "a", "b", "c", "d")
    submit(server, "j", turns=4)
    assert len({t["backend"] for t in result(server, "j")["trajectory"]["turns"]}) == 1


def test_presorted_dp_separates_predicted_long_from_short_jobs(start_server, start_backend):
    backends = [start_backend(), start_backend()]
    server, handler = start(start_server, backends, placement="presorted_dp")
    train(server, backends)
    hold(server, handler, backends, "L", LONG)
    hold(server, handler, backends, "S1", SHORT)
    hold(server, handler, backends, "S2", SHORT)  # sticky_least_loaded would put it next to L
    long_backend = backend_of(backends, "L")
    assert backend_of(backends, "S1") is backend_of(backends, "S2") is not long_backend

    for res in release(server, handler, ["L", "S1", "S2"]):  # sticky: no job changed backend
        turns = res["trajectory"]["turns"]
        assert len(turns) == 2 and turns[0]["backend"] == turns[1]["backend"], turns
    assert all(s["migrations"] == 0 for s in servers(server).values())


def test_presorted_dp_sends_the_predicted_long_job_to_the_backend_with_the_faster_profile(start_server, start_backend):
    backends = [start_backend(), start_backend()]
    fast = backends[1]  # listed second: its own profile, not its position, draws the long job
    server, handler = start(
        start_server,
        backends,
        placement="presorted_dp",
        interference_profile="1:0.04,8:0.05",
        backend_profiles=[f"{fast.address}=1:0.02,8:0.025"],  # twice as fast: a short fits the slow one
    )
    train(server, backends)
    hold(server, handler, backends, "S1", SHORT)
    hold(server, handler, backends, "L", LONG)
    hold(server, handler, backends, "S2", SHORT)
    assert backend_of(backends, "L") is fast
    assert backend_of(backends, "S2") is not fast
    release(server, handler, ["L", "S1", "S2"])


def migrating_run(start_server, start_backend, **settings):
    """L (its one call kept running) on one backend, S1, S2 and M (a short prompt) on the other; M's first
    answer is far longer than any finished trajectory, so at its tool-call boundary it is the longest. The
    first backend is twice as fast (its own profile), so the long L goes there and M, once the longest,
    runs its 1,200 tokens far sooner there next to L than where it is (the short S1 and S2 would hardly slow
    it: they leave the batch after a few tokens)."""
    backends = [start_backend(), start_backend()]
    settings.setdefault("interference_profile", "1:0.02,2:0.025,3:0.03")
    settings.setdefault("backend_profiles", [f"{backends[0].address}=1:0.01,2:0.0125,3:0.015"])
    server, handler = start(start_server, backends, placement="presorted_dp", **settings)
    train(server, backends)
    script(backends, "L", ScriptedReply(text="hold", delay_s=30))
    submit(server, "L", question=LONG)
    wait_for(lambda: any(r.job_id == "L" for b in backends for r in b.double.requests), 20, "L's call runs")
    hold(server, handler, backends, "S1", SHORT)
    hold(server, handler, backends, "S2", SHORT)
    hold(server, handler, backends, "M", SHORT, ScriptedReply(text="word " * 1200), "done")
    assert backend_of(backends, "M") is backend_of(backends, "S1") is not backend_of(backends, "L")
    results = dict(zip(["M", "S1", "S2"], release(server, handler, ["M", "S1", "S2"]), strict=True))
    assert server.http.post("/cancel", json={"job_id": "L"}).json()["status"] == "cancelled"
    return server, backends, results


def test_presorted_dp_migrates_a_job_at_its_tool_call_boundary_with_its_whole_context(start_server, start_backend):
    server, backends, results = migrating_run(start_server, start_backend)
    long_backend = backend_of(backends, "L")
    turns = results["M"]["trajectory"]["turns"]
    assert turns[0]["backend"] != turns[1]["backend"] == long_backend.address, turns
    first = next(r for b in backends for r in b.double.requests if r.job_id == "M")
    assert first.outcome == "done"  # the call ran to its end where it started: moves happen between calls
    moved = [r for r in long_backend.double.requests if r.job_id == "M"]
    assert len(moved) == 1 and len(moved[0].prompt) == turns[1]["prompt_len"]
    assert moved[0].prompt[: len(first.prompt)] == first.prompt  # the whole context went to the new backend
    # a short one may follow to the faster backend too (its few tokens cost L almost nothing there), but
    # nothing moves away from it
    moves = sum(len({t["backend"] for t in results[job_id]["trajectory"]["turns"]}) - 1 for job_id in results)
    migrations = {address: s["migrations"] for address, s in servers(server).items()}
    assert migrations == {long_backend.address: moves, turns[0]["backend"]: 0} and moves >= 1


def test_presorted_dp_does_not_migrate_when_recomputing_the_prefix_costs_more(start_server, start_backend):
    server, _, results = migrating_run(start_server, start_backend, migration_prefill_s_per_token=10.0)
    turns = results["M"]["trajectory"]["turns"]
    assert turns[0]["backend"] == turns[1]["backend"], turns
    assert all(s["migrations"] == 0 for s in servers(server).values())


class FixedPredictor:
    """Predicts what the test set for each prompt length (a stand-in for a trained predictor)."""

    name = "fixed"

    def __init__(self) -> None:
        self.remaining: dict[int, float] = {}

    def predict(self, view: TrajectoryView) -> Prediction:
        return Prediction(self.remaining[view.prompt_len], 1.0)

    def observe_finished(self, view: TrajectoryView) -> None:
        pass


@pytest.mark.parametrize("resolve_fraction", [0.0, 0.25])
def test_the_placer_solves_the_dp_for_new_jobs_and_moves_by_the_rescaled_sizes(monkeypatch, resolve_fraction):
    predictor = FixedPredictor()
    predictor.remaining.update({1: 1000.0, 2: 300.0})
    profile = interference_profile(DEFAULT_PROFILE)
    placer = TrajectoryPlacer(predictor, profile, prefill_s_per_token=1e-4, resolve_fraction=resolve_fraction)
    solved = []
    monkeypatch.setattr(placement_runtime, "place", lambda *args: solved.append(args) or place(*args))
    backends = ["a", "b"]
    assert placer.place_new("L", TrajectoryView("d", "l", prompt_len=1), backends) == "a"
    shorts = ["S"] + [f"s{i}" for i in range(15)]
    assert [placer.place_new(k, TrajectoryView("d", "s", prompt_len=2), backends) for k in shorts] == ["b"] * 16
    # 0: a DP per new job; a quarter: again once more than a quarter of the live count arrived since the last
    # (the 1st to 4th jobs, then the 6th, 8th, 11th and 15th)
    assert len(solved) == (17 if resolve_fraction == 0 else 8) == placer.solves
    grown = TrajectoryView("d", "s", prompt_len=2, turns=1, model_tokens=50)
    assert placer.at_boundary("S", grown, "b", backends) is None  # still short: stays
    predictor.remaining[2] = 5000.0  # S is now predicted the longest: the first group's backend is its target
    placer.prefill_s_per_token = 1.0  # but recomputing its 52 context tokens would cost more than the move saves
    assert placer.at_boundary("S", grown, "b", backends) is None
    # draining, on "a" it runs 1000 tokens at I(2), not 300 at I(16): 100.6 s instead of 102.3 s
    placer.prefill_s_per_token = 1e-4
    assert placer.at_boundary("S", grown, "b", backends) == "a"
    assert placer.solves == len(solved)  # boundaries never re-solve the DP


def test_the_placer_keeps_each_backends_draining_time_up_to_date_through_moves() -> None:
    predictor = FixedPredictor()
    rng = random.Random(5)
    profile = Profile.from_points([(1, 0.02), (4, 0.03), (16, 0.05)]).with_batch_limit(24)
    placer = TrajectoryPlacer(predictor, profile, prefill_s_per_token=0.0, resolve_fraction=0.25)
    backends = ["a", "b", "c"]
    for i in range(120):
        predictor.remaining[i] = float(rng.randint(1, 5000))
        placer.place_new(f"t{i}", TrajectoryView("d", "p", prompt_len=i), backends)
    for step in range(600):  # refreshed predictions at boundaries (moves among them) and ends
        i = rng.randrange(120)
        key = f"t{i}"
        if key not in placer:
            continue
        if step % 7 == 0:
            placer.forget(key)
            continue
        predictor.remaining[i] = float(rng.randint(1, 5000))
        current = placer._live[key].backend
        placer.at_boundary(key, TrajectoryView("d", "p", prompt_len=i, turns=1, model_tokens=1), current, backends)
    for backend, on in placer._on.items():
        assert on.decode_s == pytest.approx(profile.group_seconds(on.lengths), rel=1e-9, abs=1e-9), backend
        assert on.lengths == sorted(p.remaining for p in placer._live.values() if p.backend == backend)
