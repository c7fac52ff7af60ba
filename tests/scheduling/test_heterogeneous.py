"""Heterogeneous workers (Heddle section 6): the presorted DP over workers with their own profiles (the
sort-initialised mapping), the simulated annealing over model-parallel allocations, and the placer that the
server's presorted_dp uses with per-backend profiles."""

from __future__ import annotations

import itertools
import math
import random
import sys

import pytest
import server_jobs
from repo_paths import BENCHMARKS

from prorl_server.llm.placement import backend_profiles
from prorl_server.scheduling import Profile, plan_migrations
from prorl_server.scheduling.heterogeneous import (
    anneal_allocation,
    parallel_profile,
    place_on_workers,
    worker_order,
)
from prorl_server.scheduling.latency_profile import DEFAULT_PROFILE
from prorl_server.scheduling.migration import LiveTrajectory
from prorl_server.scheduling.partition import place
from prorl_server.scheduling.placement_runtime import TrajectoryPlacer
from prorl_server.scheduling.view import Prediction, TrajectoryView
from prorl_server.simllm import SimLLMServer

sys.path.insert(0, str(BENCHMARKS))

BASE = Profile.from_points([(1, 0.02), (8, 0.024), (32, 0.035), (64, 0.055), (128, 0.095)])


def group_makespan(groups, order, lengths, profiles) -> float:
    return max(
        (profiles[order[k]].group_seconds([lengths[i] for i in g]) for k, g in enumerate(groups) if g),
        default=0.0,
    )


def best_sorted_mapping(lengths, profiles) -> float:
    """Exhaustive search over contiguous splits of the sorted lengths, group k on the k-th fastest worker
    (empty groups allowed)."""
    order = worker_order(profiles)
    ranked = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = math.inf
    for cuts in itertools.combinations_with_replacement(range(len(lengths) + 1), len(order) - 1):
        bounds = [0, *cuts, len(lengths)]
        groups = [ranked[a:b] for a, b in itertools.pairwise(bounds)]
        best = min(best, group_makespan(groups, order, lengths, profiles))
    return best


def test_the_dp_is_optimal_over_sorted_mappings_and_equals_place_on_equal_workers() -> None:
    rng = random.Random(3)
    for _ in range(150):
        n, workers = rng.randint(1, 7), rng.randint(1, 3)
        lengths = [float(rng.randint(1, 80)) for _ in range(n)]
        profiles = [parallel_profile(BASE, rng.choice((1, 2, 4))) for _ in range(workers)]
        placement = place_on_workers(lengths, profiles)
        assert sorted(i for g in placement.groups for i in g) == list(range(n))
        assert placement.makespan == pytest.approx(group_makespan(placement.groups, placement.order, lengths, profiles))
        assert placement.makespan == pytest.approx(best_sorted_mapping(lengths, profiles), rel=1e-12)
        assert place_on_workers(lengths, [BASE] * workers).makespan == pytest.approx(
            place(lengths, workers, BASE).makespan, rel=1e-12
        )


def test_the_longest_trajectories_go_to_the_lowest_latency_worker() -> None:
    slow, fast = parallel_profile(BASE, 1), parallel_profile(BASE, 4)
    lengths = [100.0] * 40 + [8000.0, 7000.0]
    placement = place_on_workers(lengths, [slow, slow, fast])
    assert placement.order[0] == 2
    assert set(placement.worker_of()[i] for i in (40, 41)) == {2}
    assert all(placement.worker_of()[i] != 2 for i in range(40))


def test_parallel_profile_is_faster_per_trajectory_and_slower_per_gpu() -> None:
    tp4 = parallel_profile(BASE, 4, efficiency=0.8, batch_limit=64)
    speedup = 4 * 0.8**2
    assert tp4.seconds_per_token(8) == pytest.approx(BASE.seconds_per_token(8) / speedup)
    assert tp4.batch_limit == 64
    assert speedup / 4 < 1  # per GPU, tokens per second fall
    with pytest.raises(ValueError):
        parallel_profile(BASE, 0)


def all_allocations(gpus: int, degrees: list[int]) -> set[tuple[int, ...]]:
    found: set[tuple[int, ...]] = set()

    def grow(left: int, chosen: tuple[int, ...]) -> None:
        if left < min(degrees):
            found.add(tuple(sorted(chosen, reverse=True)))
            return
        for d in degrees:
            if d <= left:
                grow(left - d, (*chosen, d))

    grow(gpus, ())
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_annealing_finds_the_best_allocation_of_a_small_budget(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.lognormvariate(5, 1.2) for _ in range(60)]
    profiles = {d: parallel_profile(BASE, d, batch_limit=16 * d) for d in (1, 2, 4)}
    result = anneal_allocation(lengths, 8, profiles, seed=seed)
    assert sum(result.degrees) == 8 and list(result.degrees) == sorted(result.degrees, reverse=True)
    exhaustive = min(
        place_on_workers(lengths, [profiles[d] for d in state]).makespan for state in all_allocations(8, [1, 2, 4])
    )
    assert result.placement.makespan == pytest.approx(exhaustive, rel=1e-9)
    assert result.evaluated <= len(all_allocations(8, [1, 2, 4]))


def test_annealing_refuses_a_budget_below_the_smallest_degree() -> None:
    with pytest.raises(ValueError, match="GPUs"):
        anneal_allocation([1.0], 1, {2: BASE})


def test_migration_weighs_each_backend_with_its_own_profile() -> None:
    fast, slow = parallel_profile(BASE, 4), BASE
    live = [
        LiveTrajectory("long", 1, 5000.0, 100, True),
        *(LiveTrajectory(f"s{i}", 1, 50.0, 100, False) for i in range(10)),
    ]
    # the long one is on the slow backend; the rescaled sizes send the longest rank to the fast backend 0
    moves = plan_migrations(live, [1, 10], [fast, slow], prefill_s_per_token=1e-4)
    assert [(m.key, m.target) for m in moves] == [("long", 0)]
    with pytest.raises(ValueError, match="profiles"):
        plan_migrations(live, [1, 10], [fast], prefill_s_per_token=1e-4)


class FixedPredictor:
    """Predicts what the test set per prompt length (a stand-in for a trained predictor)."""

    name = "fixed"

    def __init__(self, remaining: dict[int, float]) -> None:
        self.remaining = remaining

    def predict(self, view: TrajectoryView) -> Prediction:
        return Prediction(self.remaining[view.prompt_len], 1.0)

    def observe_finished(self, view: TrajectoryView) -> None:
        pass


def test_the_placer_sends_a_predicted_long_job_to_the_fast_backend_whatever_its_position() -> None:
    fast = parallel_profile(BASE, 4)
    placer = TrajectoryPlacer(FixedPredictor({1: 9000.0, 2: 20.0}), BASE, 1e-4, backend_profiles={"c": fast})
    backends = ["a", "b", "c"]
    short = TrajectoryView("d", "s", prompt_len=2)
    assert "c" in [placer.place_new(f"s{i}", short, backends) for i in range(12)]  # shorts alone: c takes some
    assert placer.place_new("L", TrajectoryView("d", "l", prompt_len=1), backends) == "c"
    later = [placer.place_new(f"t{i}", short, backends) for i in range(4)]
    assert "c" not in later  # with a long one live, new shorts go to the slow backends


def test_backend_profiles_parse_addresses_and_profiles(tmp_path) -> None:
    profiles = backend_profiles(["http://h:1/v1/=1:0.01,8:0.02", "http://h:2/v1=1:0.03"])
    assert set(profiles) == {"http://h:1/v1", "http://h:2/v1"}
    assert profiles["http://h:2/v1"].seconds == (0.03,)
    for bad in ("http://h:1/v1", "=1:0.01", "http://h:1/v1=1:fast", "http://h:1/v1=missing.json"):
        with pytest.raises(ValueError):
            backend_profiles([bad])
    with pytest.raises(ValueError, match="twice"):
        backend_profiles(["a=1:0.01", "a/=1:0.02"])


def submit_plan(server, job_id: str, prompt: str, tokens: list[int]) -> None:
    instance = {
        "data_source": "coding",
        "prompt": prompt,
        "tokens": tokens,
        "tool_s": [0.5] * (len(tokens) - 1),
        "observations": [20] * (len(tokens) - 1),
        "time_scale": SIM_SCALE,
    }
    response = server.http.post("/jobs", json={"instance": instance, "job_id": job_id})
    assert response.status_code == 202, response.text


SIM_SCALE = 200.0


def test_the_server_places_the_predicted_long_job_on_the_faster_simulated_worker(start_server) -> None:
    """Two simulated workers, one of model-parallel degree 4 (sim-llm's scaled profile), declared to the
    server with --backend-profile: after a warm-up epoch, the long prompt's trajectory runs on the fast one,
    although the fast worker is registered second."""
    from scheduling_handler import SchedulingHandler

    with SimLLMServer(time_scale=SIM_SCALE) as slow, SimLLMServer(time_scale=SIM_SCALE, model_parallel=4) as fast:
        fast_profile = ",".join(f"{b}:{s:.6g}" for b, s in fast.engine.settings.step_profile.points)
        server = start_server(
            [slow.address, fast.address],
            handlers={"coding": SchedulingHandler()},
            placement="presorted_dp",
            interference_profile=DEFAULT_PROFILE,
            backend_profiles=[f"{fast.address}={fast_profile}"],
        )
        long, short = "a long coding task", "a short coding task"
        for epoch in ("warm", "measured"):
            jobs = {f"{epoch}-long": (long, [300, 300])}
            jobs.update({f"{epoch}-short-{i}": (short, [5, 5]) for i in range(6)})
            for job_id, (prompt, tokens) in jobs.items():
                submit_plan(server, job_id, prompt, tokens)
            results = {job_id: server_jobs.result(server, job_id, timeout=60) for job_id in jobs}
            assert all(r["status"] == "completed" for r in results.values()), results
        turns = results["measured-long"]["trajectory"]["turns"]
        assert {t["backend"] for t in turns} == {fast.address}, turns
