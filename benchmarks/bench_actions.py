"""Benchmark: action-level CPU allocation (ARL-Tangram) against trajectory-level static allocation, simulated at
the paper's scale with the server's own allocation code (`prorl_server.actions.allocation.plan`).

Run it from the repository root::

    .venv/bin/python benchmarks/bench_actions.py [--json out.json] [--cores 1280] [--batches 128,256,512,1024,1536]
        [--seed 0]

About a minute on 2 cores with the defaults. A discrete-event simulation of an AI-coding-like batch: each
trajectory alternates a model turn (lognormal, median 3 s) and an action, 8 to 16 times. An action is a short
fixed one (bash or an edit: 1 core, lognormal, median 0.5 s) or, one time in four, a test run whose duration on
one core is long-tailed (lognormal, median 20 s, sigma 1) and scales with its DoP by Amdahl's law (serial
fraction 0.1, DoP 1 to 16). Durations are known to the allocator (the paper profiles them).

- static (trajectory-level): each trajectory holds `cores // batch` cores (at least 1) from its first action to
  its end, and its actions run at once on them; when the batch is larger than the cores, trajectories wait for
  a core, and that wait counts in their first action's completion time.
- action-level: every action asks the pool of `--cores` for its DoP range; `plan()` decides at each arrival and
  completion which waiting actions start and with how many cores (first come first served, greedy eviction).

ACT (action completion time) = queueing + execution, averaged over every action of the batch. The paper's
Figure 8a reports 3.1x to 27.7x lower ACT for action-level allocation as the batch grows from 128 to 1536 on
1,280 cores.

JSON keys (`--json PATH`): `cores`, `seed`, and `batches`: a list of {`batch`, `actions`, `static_act_s`,
`action_act_s`, `act_ratio`, `static_makespan_s`, `action_makespan_s`, `action_busy_fraction` (the time
trajectories spend in actions under static allocation, over their lifetime), `plan_us_per_action` (wall
microseconds of `plan()` per started action)}.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from prorl_server.actions.allocation import Pending, Running, plan

TEST_DOP = (1, 16)
TEST_SERIAL = 0.1


@dataclass
class Action:
    """One action of a trajectory: its DoP range and its duration on one core (serial fraction `serial`)."""

    dop: tuple[int, int]
    t1: float
    serial: float

    def seconds(self, cores: int) -> float:
        return self.t1 * (self.serial + (1.0 - self.serial) / cores)


@dataclass
class Trajectory:
    """Model turns and the action after each."""

    turns: list[tuple[float, Action]] = field(default_factory=list)


def workload(batch: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    trajectories = []
    for _ in range(batch):
        trajectory = Trajectory()
        for _ in range(rng.randint(8, 16)):
            think = rng.lognormvariate(math.log(3.0), 0.6)
            if rng.random() < 0.25:
                action = Action(TEST_DOP, rng.lognormvariate(math.log(20.0), 1.0), TEST_SERIAL)
            else:
                action = Action((1, 1), rng.lognormvariate(math.log(0.5), 0.8), 1.0)
            trajectory.turns.append((think, action))
        trajectories.append(trajectory)
    return trajectories


def run_static(trajectories: list[Trajectory], cores: int) -> tuple[list[float], float, float]:
    """(ACTs, makespan, fraction of trajectory lifetime spent in actions) under trajectory-level allocation."""
    share = max(1, cores // len(trajectories))
    slots = cores // share
    free_at = [0.0] * slots  # when each environment slot frees, a heap
    heapq.heapify(free_at)
    acts, busy, lifetime, makespan = [], 0.0, 0.0, 0.0
    for trajectory in trajectories:  # all submitted at 0, in order: FCFS for the environments
        clock = 0.0
        think, first = trajectory.turns[0]
        clock += think
        environment = heapq.heappop(free_at)
        start = max(clock, environment)
        seconds = first.seconds(min(share, first.dop[1]))
        acts.append(start - clock + seconds)
        clock, held_from, acting = start + seconds, start, seconds
        for think, action in trajectory.turns[1:]:
            clock += think
            seconds = action.seconds(min(share, action.dop[1]))
            acts.append(seconds)
            clock += seconds
            acting += seconds
        heapq.heappush(free_at, clock)
        busy += acting
        lifetime += clock - held_from
        makespan = max(makespan, clock)
    return acts, makespan, busy / lifetime


def run_action_level(trajectories: list[Trajectory], cores: int) -> tuple[list[float], float, float]:
    """(ACTs, makespan, wall seconds spent in plan() per started action) under action-level allocation."""
    events: list[tuple[float, int, str, int]] = []  # (time, seq, what, trajectory)
    seq = 0
    for i, trajectory in enumerate(trajectories):
        events.append((trajectory.turns[0][0], seq, "ask", i))
        seq += 1
    heapq.heapify(events)
    turn = [0] * len(trajectories)
    waiting: list[tuple[Pending, int]] = []
    running: dict[int, tuple[float, int]] = {}  # trajectory -> (finish, cores)
    free = cores
    arrival: dict[int, float] = {}  # trajectory -> when its running action asked
    acts, planning, started, makespan = [], 0.0, 0, 0.0
    while events:
        now, _, what, i = heapq.heappop(events)
        if what == "ask":
            action = trajectories[i].turns[turn[i]][1]
            waiting.append((Pending(action.dop[0], action.dop[1], 0, now, action.seconds), i))
        else:  # "done"
            free += running.pop(i)[1]
            acts.append(now - arrival[i])
            turn[i] += 1
            if turn[i] < len(trajectories[i].turns):
                heapq.heappush(events, (now + trajectories[i].turns[turn[i]][0], seq, "ask", i))
                seq += 1
            else:
                makespan = max(makespan, now)
        if events and events[0][0] == now:
            continue  # decide once per instant
        busy = [Running(finish, used) for finish, used in running.values()]
        began = time.perf_counter()
        decided = plan([p for p, _ in waiting], free, 1 << 40, busy, now)
        planning += time.perf_counter() - began
        if not decided:
            continue
        chosen = dict(decided)
        keep = []
        for pending, j in waiting:
            used = chosen.get(pending)
            if used is None:
                keep.append((pending, j))
                continue
            finish = now + pending.duration(used)
            running[j] = (finish, used)
            arrival[j] = pending.arrival
            free -= used
            started += 1
            heapq.heappush(events, (finish, seq, "done", j))
            seq += 1
        waiting = keep
    return acts, makespan, planning / max(1, started) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=1280, help="cores of the pool (default 1280, the paper's)")
    parser.add_argument(
        "--batches", default="128,256,512,1024,1536", help="batch sizes (default 128,256,512,1024,1536)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    print(f"simulated: {args.cores} cores, AI-coding-like trajectories (seed {args.seed})")
    print(f"{'batch':>6} {'actions':>8} {'static ACT s':>13} {'action ACT s':>13} {'ratio':>7} "
          f"{'static span s':>14} {'action span s':>14} {'in actions':>11} {'plan us/action':>15}")  # fmt: skip
    for batch in batches:
        trajectories = workload(batch, args.seed)
        static_acts, static_span, busy_fraction = run_static(trajectories, args.cores)
        action_acts, action_span, plan_us = run_action_level(trajectories, args.cores)
        static_act = sum(static_acts) / len(static_acts)
        action_act = sum(action_acts) / len(action_acts)
        row = {
            "batch": batch,
            "actions": len(action_acts),
            "static_act_s": static_act,
            "action_act_s": action_act,
            "act_ratio": static_act / action_act,
            "static_makespan_s": static_span,
            "action_makespan_s": action_span,
            "action_busy_fraction": busy_fraction,
            "plan_us_per_action": plan_us,
        }
        rows.append(row)
        print(f"{batch:>6} {row['actions']:>8} {static_act:>13.2f} {action_act:>13.2f} {row['act_ratio']:>6.1f}x "
              f"{static_span:>14.0f} {action_span:>14.0f} {busy_fraction:>10.0%} {plan_us:>15.0f}")  # fmt: skip
    print("paper (Figure 8a, its own workload): 3.1x at batch 128 to 27.7x at 1536 on 1,280 cores")
    if args.json:
        args.json.write_text(json.dumps({"cores": args.cores, "seed": args.seed, "batches": rows}, indent=2))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
