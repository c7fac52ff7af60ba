"""Benchmark: the cost of Heddle's scheduler itself per turn, at 10,000 live trajectories (CPU time, this CPU).

Run it from the repository root::

    .venv/bin/python benchmarks/bench_scheduler_cost.py [--json out.json] [--live 10000] [--backends 8]
        [--trajectories 3000] [--baseline-trajectories 40] [--seed 0]

About a minute on 2 cores with the defaults. Times are the CPU time of the benchmark's thread
(`time.thread_time`), so that other processes on a shared machine do not count; the scheduler's own work,
garbage collection included, does. It fills a `TrajectoryPlacer` (the `presorted_dp` placement's
runtime, with the online predictor, warmed on a finished epoch) with `--live` trajectories on `--backends`
backends, then runs a steady state in which trajectories end and new ones arrive, keeping `--live` live:
the live trajectories are spread over their lives (each at a random turn), each takes its next step in
turn, each new trajectory is placed (`place_new`: the presorted DP again once more than a quarter of the live
count arrived since the last solve, a rank in the kept group sizes otherwise), each later turn is a
tool-call boundary (`at_boundary`: a fresh prediction and the migration decision), every turn's call gets
its dispatch priority (`DispatchPolicy("progressive").priority`: a prediction) and goes through a waiting
heap of `--live` calls as the admission gate orders them, and an ending trajectory is forgotten and taught
to the predictor. Trajectories have about 6 turns (lognormal; `mean_turns` T in the JSON). The cost per turn is a
trajectory's life over its turns, (placement + end + (T - 1) boundaries + T dispatches) / T, from the mean
time of each kind of call while `--trajectories` trajectories end and are replaced.

The baseline, measured in the same run on the same live set: the runtime before issue 26, which solved
the DP at every new trajectory (`resolve_fraction=0`) and judged every boundary with `plan_migrations`
over all live trajectories (O(n log n)); `--baseline-trajectories` of them (it is slow). Both fill the live
set the same way (the current runtime's placement; a DP per arrival would take many minutes to fill). Target (issue 26):
<= 100 us per turn at 10,000 trajectories.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"}, "config": {every command-line option},
      "fill_s": seconds to place the first --live trajectories,
      "heddle": {"mean_turns", "per_turn_us", "place_new_us", "dp_solves", "dp_us" (null without a solve), "at_boundary_us",
                 "dispatch_us", "finish_us", "trajectories", "turns", "migrations"},
      "baseline": {the same keys},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header

from prorl_server.scheduling.dispatch import DispatchPolicy
from prorl_server.scheduling.latency_profile import DEFAULT_PROFILE, LatencyProfile
from prorl_server.scheduling.migration import LiveTrajectory, plan_migrations
from prorl_server.scheduling.placement_runtime import RESOLVE_FRACTION, TrajectoryPlacer
from prorl_server.scheduling.predictor import make_predictor
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.view import TrajectoryView


class Synthetic:
    """Trajectories of `prompts` prompts, each with a lasting scale; views as they grow turn by turn."""

    def __init__(self, rng: random.Random, prompts: int = 2000) -> None:
        self.rng = rng
        self.scales = [rng.lognormvariate(0, 1.0) for _ in range(prompts)]

    def new(self) -> tuple[int, list[int]]:
        prompt = self.rng.randrange(len(self.scales))
        turns = max(1, round(self.rng.lognormvariate(math.log(6), 0.4)))
        return prompt, [
            max(1, round(self.rng.lognormvariate(math.log(150 * self.scales[prompt]), 0.5))) for _ in range(turns)
        ]

    @staticmethod
    def view(prompt: int, tokens: list[int], turn: int) -> TrajectoryView:
        return TrajectoryView(
            "coding",
            f"p{prompt}",
            600,
            turns=turn,
            model_tokens=sum(tokens[:turn]),
            observation_tokens=150 * turn,
            finished=turn == len(tokens),
        )


class BaselinePlacer(TrajectoryPlacer):
    """The runtime before issue 26: a DP at every new trajectory, and every boundary judged by
    `plan_migrations` over all live trajectories."""

    def at_boundary(self, key: str, view: TrajectoryView, current: str, backends: list[str]) -> str | None:
        remaining = self.predictor.predict(view).remaining_tokens
        self._remove(key)
        self._add(key, current, remaining, 0.0)
        index = {address: i for i, address in enumerate(self._ranked)}
        live = [
            LiveTrajectory(k, index[p.backend], p.remaining, view.prompt_len + view.tokens if k == key else 0, k == key)
            for k, p in self._live.items()
            if p.backend in index
        ]
        profiles = [self.profile_of(address) for address in self._ranked]
        for move in plan_migrations(live, self._sizes, profiles, self.prefill_s_per_token):
            if move.key == key:
                self._remove(key)
                self._add(key, self._ranked[move.target], remaining, 0.0)
                return self._ranked[move.target]
        return None


def run(
    placer: TrajectoryPlacer, args: argparse.Namespace, trajectories: int, seed: int, resolve_fraction: float
) -> dict[str, Any]:
    """Fill to --live (placed as the current runtime does), then `trajectories` whole lives in the steady
    state with the placer's DP re-solved at `resolve_fraction`; the cost of each kind of call."""
    rng = random.Random(seed)
    synthetic = Synthetic(rng)
    predictor = placer.predictor
    dispatch = DispatchPolicy("progressive", predictor)
    backends = [f"b{i}" for i in range(args.backends)]
    for _ in range(4 * len(synthetic.scales)):  # a finished epoch teaches the predictor
        prompt, tokens = synthetic.new()
        predictor.observe_finished(synthetic.view(prompt, tokens, len(tokens)))
    counter = itertools.count()
    live: dict[str, tuple[int, list[int], int, str]] = {}  # key -> prompt, tokens, next turn, backend
    waiting: list[tuple[int, int]] = []
    started = time.thread_time()
    for _ in range(args.live):
        key = f"t{next(counter)}"
        prompt, tokens = synthetic.new()
        address = placer.place_new(key, synthetic.view(prompt, tokens, 0), backends)
        live[key] = (prompt, tokens, rng.randint(1, len(tokens)), address)  # somewhere in its life: a steady state
        heapq.heappush(waiting, (dispatch.priority(0, lambda p=prompt, t=tokens: synthetic.view(p, t, 0)), 0))
    fill_s = time.thread_time() - started
    placer.resolve_fraction = resolve_fraction
    times = {"place_new": 0.0, "at_boundary": 0.0, "dispatch": 0.0, "finish": 0.0}
    solves_before, moves, turns, boundaries, done = placer.solves, 0, 0, 0, 0
    keys = list(live)
    dp_time = [0.0]
    runtime = sys.modules[TrajectoryPlacer.__module__]
    solve = runtime.place

    def timed_place(*a: Any) -> Any:
        t0 = time.thread_time()
        try:
            return solve(*a)
        finally:
            dp_time[0] += time.thread_time() - t0

    def dispatch_call(view: TrajectoryView) -> None:
        t0 = time.thread_time()
        heapq.heappushpop(waiting, (dispatch.priority(0, lambda: view), 0))
        times["dispatch"] += time.thread_time() - t0

    runtime.place = timed_place
    try:
        for slot in itertools.cycle(range(len(keys))):  # each live trajectory in turn takes its next step
            if done >= trajectories:
                break
            key = keys[slot]
            prompt, tokens, turn, backend = live[key]
            view = synthetic.view(prompt, tokens, turn)
            if turn < len(tokens):  # its next call, at a tool-call boundary
                t0 = time.thread_time()
                target = placer.at_boundary(key, view, backend, backends)
                times["at_boundary"] += time.thread_time() - t0
                dispatch_call(view)
                moves += target is not None
                live[key] = (prompt, tokens, turn + 1, target or backend)
                turns += 1
                boundaries += 1
                continue
            t0 = time.thread_time()  # it ended; a new one arrives and makes its first call
            placer.forget(key)
            dispatch.observe_finished(view)
            times["finish"] += time.thread_time() - t0
            del live[key]
            new_key = f"t{next(counter)}"
            new_prompt, new_tokens = synthetic.new()
            first = synthetic.view(new_prompt, new_tokens, 0)
            t0 = time.thread_time()
            address = placer.place_new(new_key, first, backends)
            times["place_new"] += time.thread_time() - t0
            dispatch_call(first)
            live[new_key] = (new_prompt, new_tokens, 1, address)
            keys[slot] = new_key
            turns += 1
            done += 1
    finally:
        runtime.place = solve
    solves = placer.solves - solves_before
    mean_turns = statistics.fmean(len(synthetic.new()[1]) for _ in range(10_000))
    means = {
        "place_new": times["place_new"] / done,
        "finish": times["finish"] / done,
        "at_boundary": times["at_boundary"] / max(1, boundaries),
        "dispatch": times["dispatch"] / turns,
    }
    # a trajectory's life: one placement, mean_turns - 1 boundaries, mean_turns dispatches, one end
    life = means["place_new"] + means["finish"] + (mean_turns - 1) * means["at_boundary"]
    life += mean_turns * means["dispatch"]
    return {
        "fill_s": fill_s,
        "mean_turns": mean_turns,
        "per_turn_us": 1e6 * life / mean_turns,
        "place_new_us": 1e6 * times["place_new"] / done,
        "dp_solves": solves,
        "dp_us": 1e6 * dp_time[0] / solves if solves else None,
        "at_boundary_us": 1e6 * times["at_boundary"] / max(1, boundaries),
        "dispatch_us": 1e6 * times["dispatch"] / turns,
        "finish_us": 1e6 * times["finish"] / done,
        "trajectories": done,
        "turns": turns,
        "migrations": moves,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--live", type=positive_int, default=10_000, help="live trajectories")
    parser.add_argument("--backends", type=positive_int, default=8)
    parser.add_argument("--trajectories", type=positive_int, default=3000, help="lives timed in the steady state")
    parser.add_argument("--baseline-trajectories", type=positive_int, default=40, help="lives timed for the baseline")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    profile = Profile.from_points(LatencyProfile.parse(DEFAULT_PROFILE).points).with_batch_limit(128)
    heddle = run(
        TrajectoryPlacer(make_predictor("online"), profile, 1e-4), args, args.trajectories, args.seed, RESOLVE_FRACTION
    )
    report["fill_s"] = heddle.pop("fill_s")
    report["heddle"] = heddle
    baseline_placer = BaselinePlacer(make_predictor("online"), profile, 1e-4)
    baseline = run(baseline_placer, args, args.baseline_trajectories, args.seed, 0.0)
    baseline.pop("fill_s")
    report["baseline"] = baseline
    print(f"\nscheduler cost at {args.live} live trajectories on {args.backends} backends (thread CPU time)")
    rows = [
        ("per turn (us)", "per_turn_us"),
        ("place a new trajectory (us)", "place_new_us"),
        ("  DP solves", "dp_solves"),
        ("  one DP solve (us)", "dp_us"),
        ("boundary: prediction + migration decision (us)", "at_boundary_us"),
        ("dispatch priority + waiting heap (us)", "dispatch_us"),
        ("trajectory end: forget + learn (us)", "finish_us"),
        ("trajectories timed", "trajectories"),
        ("migrations", "migrations"),
    ]
    width = max(len(title) for title, _ in rows)
    print("  " + "figure".ljust(width) + "  " + "heddle".ljust(14) + "baseline (DP per arrival, plan_migrations)")
    for title, key in rows:
        cells = [f"{r[key]:.1f}" if isinstance(r[key], float) else str(r[key]) for r in (heddle, baseline)]
        print("  " + title.ljust(width) + "  " + cells[0].ljust(14) + cells[1])
    report["checks"] = [
        check(
            f"scheduler cost per turn at {args.live} trajectories",
            f"{heddle['per_turn_us']:.1f} us",
            f"before issue 26: {baseline['per_turn_us']:.0f} us",
            "<= 100 us",
            heddle["per_turn_us"] <= 100,
        )
    ]
    report["elapsed_s"] = time.monotonic() - started
    print_checks(report["checks"])
    return finish(report, {}, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
