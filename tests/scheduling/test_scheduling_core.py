"""The scheduling core (Heddle): length predictors and their accuracy, presorted DP placement, migration."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Iterator

import pytest

from prorl_server.protocol.jobs import Trajectory, TurnRecord
from prorl_server.scheduling import (
    LiveTrajectory,
    OnlinePredictor,
    Profile,
    SourceMeanPredictor,
    TrajectoryView,
    accuracy_at_step,
    make_predictor,
    partition_makespan,
    pearson,
    place,
    plan_migrations,
    prompt_key_of,
    recall_at_top,
    replay,
    scaled_targets,
    view_of,
)
from prorl_server.scheduling.history import BoundedMap, LengthHistory
from prorl_server.scheduling.synthetic import synthetic_trace

# ------------------------------------------------------------------------------------------------
# Predictors
# ------------------------------------------------------------------------------------------------


def finished(source: str, key: str, turns: int, tokens: int, prompt_len: int = 100) -> TrajectoryView:
    return TrajectoryView(source, key, prompt_len, turns, tokens, 0, finished=True)


def live(source: str, key: str, turns: int, tokens: int, prompt_len: int = 100) -> TrajectoryView:
    return TrajectoryView(source, key, prompt_len, turns, tokens, 0)


def test_unknown_predictor_name_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown length predictor 'oracle'.*\['none', 'online', 'source_mean'\]"):
        make_predictor("oracle")
    assert make_predictor("online").name == "online"


def test_online_prediction_is_the_conditional_expectation_and_is_refined_each_step() -> None:
    predictor = OnlinePredictor()
    for turns in (2, 4, 6, 8):  # one prompt, 100 tokens per turn
        predictor.observe_finished(finished("math", "p", turns, 100 * turns))
    start = predictor.predict(live("math", "p", 0, 0))
    assert start.remaining_tokens == pytest.approx(500)  # E[L]
    assert start.remaining_turns == pytest.approx(5)
    remaining = []
    for turns in (1, 3, 5, 7):
        prediction = predictor.predict(live("math", "p", turns, 100 * turns))
        remaining.append(prediction.remaining_tokens)
    # E[T - k | T >= k] turns at 100 tokens per turn: 4, 3, 2, 1 turns to go
    assert remaining == pytest.approx([400, 300, 200, 100])
    assert predictor.predict(finished("math", "p", 8, 800)).remaining_tokens == 0


def test_online_prediction_follows_the_trajectorys_own_pace() -> None:
    predictor = OnlinePredictor(rate_shrinkage=1.0)
    for turns in (2, 4, 6, 8):
        predictor.observe_finished(finished("math", "p", turns, 100 * turns))
    slow = predictor.predict(live("math", "p", 1, 100)).remaining_tokens
    verbose = predictor.predict(live("math", "p", 1, 300)).remaining_tokens
    assert verbose > slow  # 300 tokens in one turn: the remaining turns are expected longer too


def test_a_trajectory_that_outgrew_its_prompts_history_falls_back_to_its_data_source() -> None:
    predictor = OnlinePredictor()
    for tokens in (1000, 2000, 3000):
        predictor.observe_finished(finished("code", f"other-{tokens}", 1, tokens))
    for _ in range(5):
        predictor.observe_finished(finished("code", "short", 1, 100))
    assert predictor.predict(live("code", "short", 0, 0)).remaining_tokens < 500  # the prompt's own samples
    # at 1500 tokens none of the prompt's samples count; the data source's longer ones (2000, 3000) do
    assert predictor.predict(TrajectoryView("code", "short", 100, 0, 1500)).remaining_tokens == pytest.approx(1000)


def test_unseen_prompts_use_their_data_source_and_nothing_learnt_uses_the_prior() -> None:
    predictor = OnlinePredictor(prior_tokens=64.0, prior_turns=3.0)
    empty = predictor.predict(live("math", "new", 0, 0))
    assert (empty.remaining_tokens, empty.remaining_turns) == (64.0, 3.0)
    assert predictor.predict(TrajectoryView("math", "new", 10, 0, 500)).remaining_tokens == 500  # as much again
    predictor.observe_finished(finished("search", "a", 1, 50))
    predictor.observe_finished(finished("math", "b", 1, 5000))
    assert predictor.predict(live("math", "new", 0, 0)).remaining_tokens > 2500
    assert predictor.predict(live("search", "new", 0, 0)).remaining_tokens < 2500


def test_observe_finished_needs_a_finished_view() -> None:
    for name in ("online", "source_mean", "none"):
        with pytest.raises(ValueError, match="finished=True"):
            make_predictor(name).observe_finished(live("math", "p", 1, 10))


def test_baselines() -> None:
    mean = SourceMeanPredictor()
    mean.observe_finished(finished("math", "a", 2, 100))
    mean.observe_finished(finished("math", "b", 4, 300))
    assert mean.predict(live("math", "c", 1, 50)).remaining_tokens == 150
    assert mean.predict(live("math", "c", 1, 500)).remaining_tokens == 0
    assert mean.predict(live("other", "c", 0, 0)).remaining_tokens == 200  # everything's mean
    assert make_predictor("none").predict(live("math", "c", 1, 50)).remaining_tokens == 0


def test_histories_are_bounded() -> None:
    history = LengthHistory(capacity=3)
    for value in (10, 20, 30, 40):
        history.add(value)
    assert len(history) == 3
    assert history.remaining_past(0) == (30.0, 3)  # 10 was forgotten
    assert history.remaining_past(25) == (10.0, 2)
    assert history.remaining_past(41) == (0.0, 0)
    table: BoundedMap[str, LengthHistory] = BoundedMap(2, lambda: LengthHistory(1))
    first = table.setdefault("a")
    table.setdefault("b")
    table.get("a")  # "b" is now the least recently used
    table.setdefault("c")
    assert len(table) == 2 and table.get("a") is first and table.get("b") is None


def test_a_large_history_answers_from_a_snapshot_rebuilt_after_a_64th_of_its_samples() -> None:
    history = LengthHistory(capacity=1000)
    for value in range(1, 201):  # 200 samples: rebuilt once more than 200 // 64 = 3 arrived
        history.add(value)
    assert history.remaining_past(0) == (100.5, 200)
    for _ in range(3):
        history.add(1000)
    assert history.remaining_past(0) == (100.5, 200)  # 3 of 203 new: not yet in the answer
    history.add(1000)
    assert history.remaining_past(0) == (pytest.approx((20100 + 4000) / 204), 204)
    small = LengthHistory(capacity=10)
    small.add(5)
    assert small.remaining_past(0) == (5.0, 1)
    small.add(7)  # below 64 samples every arrival counts at once
    assert small.remaining_past(0) == (6.0, 2)


def test_view_of_a_recorded_trajectory() -> None:
    turn = TurnRecord(backend="b", prompt_len=3, output_ids=[7, 8], logprobs=[0.0, 0.0])
    trajectory = Trajectory(prompt_ids=[1, 2, 3], response_ids=[7, 8, 9, 9, 9], response_mask=[1, 1, 0, 0, 0])
    trajectory.turns.append(turn)
    view = view_of(trajectory, "math")
    assert (view.prompt_len, view.turns, view.model_tokens, view.observation_tokens, view.tokens) == (3, 1, 2, 3, 5)
    assert view.prompt_key == prompt_key_of([1, 2, 3]) != prompt_key_of([1, 2, 4])
    assert not view.finished and view_of(trajectory, "math", finished=True).finished


def test_recall_and_pearson() -> None:
    actual = [float(i) for i in range(20)]
    assert recall_at_top(actual, actual, 0.1) == 1.0
    assert recall_at_top([-x for x in actual], actual, 0.1) == 0.0
    assert recall_at_top([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0], actual, 0.1) == 0.5
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_accuracy_after_a_step_uses_the_final_view_of_trajectories_that_ended_sooner() -> None:
    one_turn = [live("m", "a", 0, 0), finished("m", "a", 1, 10)]
    three_turns = [live("m", "b", 0, 0), live("m", "b", 1, 5), live("m", "b", 2, 50), finished("m", "b", 3, 90)]
    accuracy = accuracy_at_step(make_predictor("none"), [one_turn, three_turns], step=2, fraction=0.5)
    assert (accuracy.recall, accuracy.pearson) == (1.0, pytest.approx(1.0))  # predicted totals 10 and 50


def mean_figures(name: str, seed: int = 0) -> dict[int, tuple[float, float]]:
    scores = replay(make_predictor(name), synthetic_trace(seed, epochs=6), steps=(1, 2), warmup=2)
    return {
        step: (statistics.mean(a.recall for a in runs), statistics.mean(a.pearson for a in runs))
        for step, runs in scores.items()
    }


def test_online_predictor_learns_the_synthetic_trace_and_beats_the_data_source_mean() -> None:
    online, baseline = mean_figures("online"), mean_figures("source_mean")
    for step in (1, 2):
        (recall, r), (base_recall, base_r) = online[step], baseline[step]
        assert recall >= base_recall + 0.1, (step, recall, base_recall)
        assert r >= base_r + 0.05, (step, r, base_r)
    assert online[2][0] > online[1][0] and online[2][1] > online[1][1]  # refined by the second step


# ------------------------------------------------------------------------------------------------
# Profile
# ------------------------------------------------------------------------------------------------


def test_profile_interpolates_piecewise_linearly() -> None:
    profile = Profile.from_points([(8, 0.03), (1, 0.01), (4, 0.02)])
    assert profile.batch_sizes == (1.0, 4.0, 8.0)
    assert profile.seconds_per_token(1) == 0.01
    assert profile.seconds_per_token(2.5) == pytest.approx(0.015)
    assert profile.seconds_per_token(6) == pytest.approx(0.025)
    assert profile.seconds_per_token(0.5) == 0.01  # flat below the first point
    assert profile.seconds_per_token(12) == pytest.approx(0.04)  # the last slope extended
    assert profile.nondecreasing
    assert Profile.from_points([(4, 0.5)]).seconds_per_token(100) == 0.5
    assert not Profile.from_points([(1, 0.2), (2, 0.1)]).nondecreasing


def test_past_the_batch_limit_trajectories_share_the_slots() -> None:
    profile = Profile.from_points([(1, 0.01), (4, 0.02)]).with_batch_limit(4)
    assert profile.seconds_per_token(4) == pytest.approx(0.02)
    assert profile.seconds_per_token(8) == pytest.approx(0.04)  # 8 share 4 slots: half a slot each
    assert profile.with_batch_limit(None).seconds_per_token(8) == pytest.approx(0.1 / 3)  # extended slope
    with pytest.raises(ValueError, match="at least 1"):
        profile.with_batch_limit(0)


def test_placement_weighs_a_group_past_the_batch_limit_as_waiting() -> None:
    lengths = [1000.0] + [400.0] * 11
    unlimited = Profile.from_points([(1, 0.01), (16, 0.011)])
    assert place(lengths, 2, unlimited).sizes == (1, 11)
    # two slots per backend: eleven shorter ones would queue behind each other; the long one takes company.
    # Draining, the long one shares its slots with 4 (1000 x 0.01 + 400 x (I(2) - I(1)) + 1200 x I(2) / 2 =
    # 16.1 s) against the other 7 queueing for theirs (14.1 s); with 2 and 9 the 9 would take 18.1 s
    assert place(lengths, 2, unlimited.with_batch_limit(2)).sizes == (5, 7)


@pytest.mark.parametrize(
    "points", [[], [(1, 0.1), (1, 0.2)], [(0, 0.1)], [(1, -0.1)]], ids=["empty", "duplicate", "zero", "negative"]
)
def test_profile_rejects_bad_points(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError):
        Profile.from_points(points)


# ------------------------------------------------------------------------------------------------
# Presorted DP placement
# ------------------------------------------------------------------------------------------------


def set_partitions(n: int, blocks: int) -> Iterator[list[list[int]]]:
    """Every partition of range(n) into at most `blocks` non-empty groups (restricted growth strings)."""

    def grow(i: int, groups: list[list[int]]) -> Iterator[list[list[int]]]:
        if i == n:
            yield groups
            return
        for group in groups:
            group.append(i)
            yield from grow(i + 1, groups)
            group.pop()
        if len(groups) < blocks:
            groups.append([i])
            yield from grow(i + 1, groups)
            groups.pop()

    yield from grow(0, [])


def best_contiguous(lengths: list[float], blocks: int, profile: Profile) -> float:
    """Exhaustive search over contiguous partitions of the lengths sorted longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = math.inf
    for parts in range(1, min(blocks, len(lengths)) + 1):
        for cuts in itertools.combinations(range(1, len(lengths)), parts - 1):
            bounds = [0, *cuts, len(lengths)]
            groups = [order[a:b] for a, b in itertools.pairwise(bounds)]
            best = min(best, partition_makespan(groups, lengths, profile))
    return best


def random_profile(rng: random.Random, monotone: bool) -> Profile:
    sizes = rng.sample(range(1, 10), rng.randint(1, 4))
    seconds = [rng.uniform(0.01, 0.1) for _ in sizes]
    if monotone:
        sizes.sort()
        seconds.sort()
    return Profile.from_points(zip(sizes, seconds, strict=True))


def check_placement(lengths: list[float], backends: int, profile: Profile) -> float:
    placement = place(lengths, backends, profile)
    assert len(placement.groups) == backends
    assert sorted(i for group in placement.groups for i in group) == list(range(len(lengths)))
    assert placement.makespan == pytest.approx(partition_makespan(placement.groups, lengths, profile))
    assert placement.backend_of() == {i: b for b, group in enumerate(placement.groups) for i in group}
    return placement.makespan


@pytest.mark.parametrize("monotone", [True, False], ids=["nondecreasing-profile", "any-profile"])
def test_dp_is_optimal_against_brute_force_on_small_instances(monotone: bool) -> None:
    rng = random.Random(12 + monotone)
    for _ in range(200):
        n, backends = rng.randint(1, 7), rng.randint(1, 3)
        lengths = [float(rng.randint(1, 60)) for _ in range(n)]
        profile = random_profile(rng, monotone)
        assert profile.nondecreasing or not monotone
        makespan = check_placement(lengths, backends, profile)
        brute = min(partition_makespan(groups, lengths, profile) for groups in set_partitions(n, backends))
        assert makespan >= brute * (1 - 1e-12)
        # the best contiguous partition: Heddle's Lemma 5.1 makes that the optimum for its formula 2, not for
        # the draining group time (a group with a long member can take one more medium one at a small cost)
        assert makespan == pytest.approx(best_contiguous(lengths, backends, profile), rel=1e-12)
        if backends == 1 or n <= 1:
            assert makespan == pytest.approx(brute, rel=1e-12)


def test_bisecting_dp_matches_exhaustive_contiguous_search_on_larger_instances() -> None:
    rng = random.Random(7)
    for _ in range(5):
        lengths = [rng.lognormvariate(6, 1) for _ in range(40)]
        profile = random_profile(rng, monotone=True)
        assert check_placement(lengths, 3, profile) == pytest.approx(best_contiguous(lengths, 3, profile))


def test_placement_segregates_long_trajectories_and_orders_groups_longest_first() -> None:
    profile = Profile.from_points([(1, 0.01), (16, 0.05)])
    lengths = [100.0] * 12 + [5000.0, 4800.0]
    placement = place(lengths, 2, profile)
    # the longest alone; the second drains with the short ones, which leave its batch after 100 tokens
    assert placement.groups[0] == (12,) and placement.sizes == (1, 13)
    assert place([], 3, profile).makespan == 0.0
    assert place([5.0], 3, profile).sizes == (1, 0, 0)
    with pytest.raises(ValueError):
        place([1.0], 0, profile)


# ------------------------------------------------------------------------------------------------
# Migration
# ------------------------------------------------------------------------------------------------


def test_scaled_targets_scale_the_placed_group_sizes_to_the_live_trajectories() -> None:
    assert scaled_targets([10, 500, 20, 30], [1, 3]) == [1, 0, 1, 1]
    assert scaled_targets([10, 500, 20, 30], [2, 6]) == [1, 0, 1, 1]  # 2/8 of 4 live -> 1
    assert scaled_targets([10, 500, 20, 30, 600, 5], [4, 4]) == [1, 0, 1, 0, 0, 1]


def migration_case(boundary: bool, context: int) -> list[LiveTrajectory]:
    """Backend 0 was given the long group (1), backend 1 the short one (3); predictions swapped since."""
    return [
        LiveTrajectory("was-long", 0, 50.0, 1000, boundary),
        LiveTrajectory("now-long", 1, 5000.0, context, boundary),
        LiveTrajectory("short-a", 1, 4000.0, 1000, True),
        LiveTrajectory("short-b", 1, 3000.0, 1000, True),
    ]


PROFILE = Profile.from_points([(1, 0.01), (4, 0.04)])


def test_migration_moves_a_trajectory_whose_gain_exceeds_its_prefix_recompute() -> None:
    moves = plan_migrations(migration_case(True, 1000), [1, 3], PROFILE, prefill_s_per_token=1e-4)
    # was-long stays: next to the other two on backend 1 it would raise that backend's 70 s to 70.5 s
    assert [(m.key, m.source, m.target) for m in moves] == [("now-long", 1, 0)]
    first = moves[0]
    # before: backend 1 drains 5000, 4000 and 3000 tokens, each co-runner adding 0.01 s/token: 0.01 * 12000 =
    # 120 s; after: 0.01 * 7000 = 70 s there, 0.01 * 5050 = 50.5 s on backend 0
    assert (first.gain_s, first.cost_s) == (pytest.approx(50.0), pytest.approx(0.1))


def test_migration_waits_for_a_tool_boundary() -> None:
    assert plan_migrations(migration_case(False, 1000), [1, 3], PROFILE, prefill_s_per_token=1e-4) == []


def test_migration_is_skipped_when_the_recompute_costs_more_than_it_gains() -> None:
    moves = plan_migrations(migration_case(True, 10**6), [1, 3], PROFILE, prefill_s_per_token=1e-4)
    assert all(m.key != "now-long" for m in moves)  # 100 s of prefill for 50 s of gain


def test_migration_between_backends_that_finish_before_the_slowest_gains_nothing() -> None:
    live = [
        LiveTrajectory("long", 0, 5000.0, 10, False),  # backend 0 sets the makespan: 0.01 * 5000 = 50 s
        LiveTrajectory("a", 1, 50.0, 10, False),
        LiveTrajectory("b", 2, 90.0, 10, False),
        LiveTrajectory("c", 2, 80.0, 10, True),  # ranked into backend 1's group; moving it saves 0.2 s there
    ]
    assert plan_migrations(live, [1, 2, 1], PROFILE, prefill_s_per_token=0.0) == []


def test_migration_leaves_well_placed_trajectories_alone() -> None:
    placed = [LiveTrajectory("long", 0, 5000.0, 10, True), LiveTrajectory("short", 1, 40.0, 10, True)]
    assert plan_migrations(placed, [1, 1], PROFILE, prefill_s_per_token=0.0) == []
    with pytest.raises(ValueError, match="outside"):
        plan_migrations([LiveTrajectory("x", 2, 1.0, 1, True)], [1, 1], PROFILE, 0.0)


def test_a_group_drains_each_member_leaving_the_batch_when_done() -> None:
    profile = Profile.from_points([(1, 0.01), (4, 0.04)])  # 0.01 s more per token for each co-runner
    assert profile.interference_steps(6) == [(0, 6, pytest.approx(0.01))]
    # 100 tokens all four together (0.04 s each), 200 more three together, 300 two, 400 alone
    assert profile.group_seconds([1000.0, 600.0, 300.0, 100.0]) == pytest.approx(
        100 * 0.04 + 200 * 0.03 + 300 * 0.02 + 400 * 0.01
    )
    assert profile.group_seconds([]) == 0.0
    limited = profile.with_batch_limit(2)  # past 2, each shares 2 slots: I(n) = I(2) * n / 2
    assert limited.group_seconds([10.0, 10.0, 10.0]) == pytest.approx(10 * limited.seconds_per_token(3))
    # never more than Heddle's formula 2, I(n) * longest
    assert profile.group_seconds([1000.0, 1.0, 1.0, 1.0]) < profile.seconds_per_token(4) * 1000


def test_placement_charges_each_group_its_members_extra_seconds() -> None:
    profile = Profile.from_points([(1, 0.01), (16, 0.01)])  # no interference: only the extras differ
    lengths = [100.0, 100.0, 100.0, 100.0]
    assert place(lengths, 2, profile).makespan == pytest.approx(1.0)
    placement = place(lengths, 2, profile, extra_s=[5.0, 0.0, 0.0, 5.0])
    assert placement.makespan == pytest.approx(6.0)  # the two 5 s extras on different backends
    assert sorted(sum(i in (0, 3) for i in group) for group in placement.groups) == [1, 1]
    with pytest.raises(ValueError, match="extra"):
        place(lengths, 2, profile, extra_s=[1.0])
