"""Benchmark: action-level CPU allocation (ARL-Tangram) against trajectory-level static allocation, simulated
at the paper's scale with the server's own allocation code (`prorl_server.actions.allocation.plan`), and run for
real on this machine's cores with real bubblewrap sandboxes and the server's `CpuPool`.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_actions.py [--part sim|real|both] [--json out.json] [--seed 0]
        [--cores 1280] [--batches 128,256,512,1024,1536]
        [--real-trajectories 8] [--real-rounds 2] [--real-pools 2,1] [--real-turns 4,8] [--real-think-s 1.2]
        [--real-short-s 0.1] [--real-test-s 0.75] [--real-test-share 0.25]

About 2.5 minutes on 2 cores with the defaults (20 seconds of them for the simulated part).

Simulated part (`--part sim`). A discrete-event simulation of an AI-coding-like batch: each trajectory
alternates a model turn (lognormal, median 3 s) and an action, 8 to 16 times. An action is a short fixed one
(bash or an edit: 1 core, lognormal, median 0.5 s) or, one time in four, a test run whose duration on one core
is long-tailed (lognormal, median 20 s, sigma 1) and scales with its DoP by Amdahl's law (serial fraction 0.1,
DoP 1 to 16). Durations are known to the allocator (the paper profiles them).

- static (trajectory-level): each trajectory holds `cores // batch` cores (at least 1) from its first action to
  its end, and its actions run at once on them; when the batch is larger than the cores, trajectories wait for
  a core, and that wait counts in their first action's completion time.
- action-level: every action asks the pool of `--cores` for its DoP range; `plan()` decides at each arrival and
  completion which waiting actions start and with how many cores (first come first served, greedy eviction).

ACT (action completion time) = queueing + execution, averaged over every action of the batch. The paper's
Figure 8a reports 3.1x to 27.7x lower ACT for action-level allocation as the batch grows from 128 to 1536 on
1,280 cores.

Real part (`--part real`). `--real-trajectories` trajectories run concurrently, each with its own bubblewrap
sandbox (`make_runtime("bwrap", ...)`, the host root read-only). Each alternates a model wait (`asyncio.sleep`
on the host, lognormal, median `--real-think-s`, sigma 0.6) and an action in its sandbox, `--real-turns` times.
An action is a Python busy loop of fixed work: a short one (one process, lognormal, median `--real-short-s`
one-core seconds, sigma 0.5) or, with probability `--real-test-share`, a test run (lognormal, median
`--real-test-s` one-core seconds, sigma 0.8: long-tailed) whose work is 10% serial and 90% split over
`$PRORL_DOP` forked processes, so it scales with its cores. Work is counted in loop iterations, converted from
seconds with the rate this machine's Python reaches per CPU second (measured first, on the host, in CPU time so
that other load does not change it). The defaults put about 47% of a trajectory's life in actions under the
static arm, as in the paper.

- static (trajectory-level, the baseline): no pool; each sandbox has the cgroup quota `cores / trajectories`
  (`SandboxLimits.cpus`) for its whole life, on any CPU, and its test runs use `ceil(cores / trajectories)`
  processes: as many as the quota can keep busy (more would share the same quota, fewer would leave part of it
  unused).
- action (action-level): a `CpuPool` of `k` cores (`CpuPool.for_node`: the last `k` CPU ids, idle share 0.1
  core); short actions are `sandbox.bash(cmd)` (one core), test runs `sandbox.bash(cmd, dop=(1, k),
  kind="tests")` with `$PRORL_DOP` processes; each arm starts with a fresh pool (its duration models learn from
  scratch). Run for every `k` of `--real-pools` (default: all the cores, then half of them), to find the cores
  action-level needs to match the static ACT.

Every arm runs the same trace, one arm after the other, in `--real-rounds` rounds (round `r` uses seed
`--seed + r`; every other round runs the arms in reverse order, so a drift of the machine's load falls on every
arm alike); sandboxes start before the clock and close after it. ACT = from asking to answer of `sandbox.bash`,
on the host: the wait for the grant (queueing in the scheduler), the cgroup writes, the round trip and the
command. Beside each arm: the machine's busy cores meanwhile (/proc/stat: the trace and everything else running
here), the part of them that is not the trace's work ("others"), and the ACT the simulation above gives the
same traces (durations known, no overhead, no other load).

JSON keys (`--json PATH`). Simulated part: `cores`, `seed`, and `batches`: a list of {`batch`, `actions`,
`static_act_s`, `action_act_s`, `act_ratio`, `static_makespan_s`, `action_makespan_s`, `action_busy_fraction`
(the time trajectories spend in actions under static allocation, over their lifetime), `plan_us_per_action`
(wall microseconds of `plan()` per started action)}. Real part, under `real`: either {`skipped`: why} or
{`cores` (CPUs this process may use), `trajectories`, `rounds`, `seed`, `turns`, `think_s`, `short_s`, `test_s`,
`test_share` (the trace parameters), `work_core_s` (one-core seconds of work of all rounds), `static_cpus`
(quota per sandbox), `static_dop`, `spin_rate` (loop iterations per one-core second), `load_average` (1-minute,
before and after), `arms`: a list of {`arm` ("static" or "action"), `pool_cores` (the cores the arm allocates),
`actions`, `act_s` (mean ACT), `act_p95_s`, `short_act_s`, `test_act_s` (mean ACT of each kind), `wait_s`
(mean ACT minus the command's own wall time: queueing, cgroup writes, round trip, Python's start),
`makespan_s` (a round's batch, from its first model wait to its last action, averaged over rounds),
`busy_fraction` (time in actions over trajectory lifetimes), `machine_busy_cores`, `other_cores` (the machine's
busy cores minus the trace's work over the makespan: an estimate of the load that is not the benchmark's),
`simulated_act_s`},
`act_ratio` and `makespan_ratio` (static over action-level with all the cores), `cores_to_match_static` (the
fewest pool cores whose ACT is at most the static ACT; null if none of `--real-pools` did)}.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
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


def run_sim(cores: int, batches: list[int], seed: int) -> list[dict[str, float]]:
    """The simulated part: a row of figures per batch size, printed as a table."""
    rows = []
    print(f"simulated: {cores} cores, AI-coding-like trajectories (seed {seed})")
    print(f"{'batch':>6} {'actions':>8} {'static ACT s':>13} {'action ACT s':>13} {'ratio':>7} "
          f"{'static span s':>14} {'action span s':>14} {'in actions':>11} {'plan us/action':>15}")  # fmt: skip
    for batch in batches:
        trajectories = workload(batch, seed)
        static_acts, static_span, busy_fraction = run_static(trajectories, cores)
        action_acts, action_span, plan_us = run_action_level(trajectories, cores)
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
    return rows


# real part: this machine's cores, real bubblewrap sandboxes -------------------------------------------------

SPIN = """\
def spin(n):
    x = 0
    for i in range(n):
        x += i
"""
"""The work of every real action: `n` iterations of a Python loop."""

WORKER = f"""\
import os, sys, time
{SPIN}
began = time.perf_counter()
serial, parallel, procs = map(int, sys.argv[1:4])
spin(serial)
children = []
for _ in range(procs - 1):
    pid = os.fork()
    if pid == 0:
        spin(parallel // procs)
        os._exit(0)
    children.append(pid)
spin(parallel - (procs - 1) * (parallel // procs))
for pid in children:
    os.waitpid(pid, 0)
print(time.perf_counter() - began)
"""
"""Every real action's command (`python -I -S work.py SERIAL PARALLEL PROCS`): SERIAL loop iterations, then
PARALLEL ones split over PROCS processes; prints its own wall seconds."""


@dataclass(frozen=True)
class Step:
    """One turn of a real trajectory: the model wait, then an action of `work_s` one-core seconds."""

    think_s: float
    test: bool
    work_s: float


@dataclass(frozen=True)
class RealTrace:
    """The real part's trace parameters (see the module)."""

    trajectories: int
    turns: tuple[int, int]
    think_s: float
    short_s: float
    test_s: float
    test_share: float
    seed: int

    def plans(self) -> list[list[Step]]:
        """Each trajectory's turns (seeded: every arm runs the same)."""
        rng = random.Random(self.seed)
        plans = []
        for _ in range(self.trajectories):
            steps = []
            for _ in range(rng.randint(*self.turns)):
                think = rng.lognormvariate(math.log(self.think_s), 0.6)
                if rng.random() < self.test_share:
                    steps.append(Step(think, True, rng.lognormvariate(math.log(self.test_s), 0.8)))
                else:
                    steps.append(Step(think, False, rng.lognormvariate(math.log(self.short_s), 0.5)))
            plans.append(steps)
        return plans


@dataclass(frozen=True)
class Arm:
    """One way to allocate the real part's cores: a static quota and DoP per sandbox (`static_cpus` set), or a
    CpuPool of `cores` (`static_cpus` None)."""

    cores: int
    static_cpus: float | None = None
    static_dop: int = 1


@dataclass(frozen=True)
class Done:
    """A finished real action: whether it was a test run, its ACT, and the command's own wall seconds."""

    test: bool
    act_s: float
    inside_s: float


def mean(values: list[float]) -> float | None:
    """The mean of `values`, None without any."""
    return statistics.fmean(values) if values else None


def seconds(value: float | None) -> str:
    """A table cell: seconds with two decimals, or "-"."""
    return "-" if value is None else f"{value:.2f}"


def real_unavailable() -> str | None:
    """Why the real part cannot run here (None: it can): it needs bubblewrap and a writable cpu cgroup."""
    from prorl_server.sandbox.cgroups import detect
    from prorl_server.sandbox.registry import unavailable_reason

    reason = unavailable_reason("bwrap")
    if reason is not None:
        return f"bubblewrap is not available ({reason})"
    if not any("cpu" in h.controllers for h in detect(warn=False)):
        return "no writable cpu cgroup: neither the static quotas nor the per-action grants would be enforced"
    return None


def spin_rate() -> float:
    """Iterations per CPU second of SPIN here, in a Python started as the actions' is (the best of three; CPU
    time, so what else runs on the machine does not change the amounts of work)."""
    n = 2_000_000
    code = f"import time\n{SPIN}began = time.process_time()\nspin({n})\nprint(time.process_time() - began)"
    best = math.inf
    for _ in range(3):
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
        best = min(best, float(out.stdout))
    return n / best


def command(python: str, step: Step, rate: float, static_dop: int) -> str:
    """The bash command of one action: a test run uses $PRORL_DOP processes (the static DoP without a pool)."""
    work = int(step.work_s * rate)
    if not step.test:
        return f"{python} -I -S work.py {work} 0 1"
    serial = int(work * TEST_SERIAL)
    return f"{python} -I -S work.py {serial} {work - serial} ${{PRORL_DOP:-{static_dop}}}"


@dataclass
class Run:
    """One arm over one round's trace: its finished actions, trajectory lifetimes, makespan, and the machine's
    busy cores meanwhile (everything running here, not only the trace)."""

    done: list[Done]
    lifetimes: list[float]
    makespan_s: float
    machine_busy_cores: float


def simulated_act(arm: Arm, plans: list[list[Step]]) -> float:
    """The arm's mean ACT on the same trace in the simulation (durations known, no overhead, no other load): static
    runs each action at once on its quota, action-level through `run_action_level` (the server's `plan()`)."""
    if arm.static_cpus is not None:
        share, dop = arm.static_cpus, arm.static_dop
        acts = [
            s.work_s * (TEST_SERIAL / min(1.0, share) + (1.0 - TEST_SERIAL) / min(dop, share))
            if s.test
            else s.work_s / min(1.0, share)
            for steps in plans
            for s in steps
        ]
        return statistics.fmean(acts)

    def simulated(step: Step) -> Action:
        if step.test:
            return Action((1, arm.cores), step.work_s, TEST_SERIAL)
        return Action((1, 1), step.work_s, 1.0)

    trajectories = [Trajectory([(s.think_s, simulated(s)) for s in steps]) for steps in plans]
    return statistics.fmean(run_action_level(trajectories, arm.cores)[0])


def cpu_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of every CPU since boot, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


async def run_arm(arm: Arm, plans: list[list[Step]], rate: float) -> Run:
    """Start a sandbox per trajectory, run the trace through them, close them."""
    from prorl_server.sandbox import SandboxLimits, SandboxSpec, make_runtime, new_owner_id, reap, remove_owner_files
    from prorl_server.sandbox.cpu_grants import CpuPool

    owner = new_owner_id()
    pool = None
    if arm.static_cpus is None:
        pool = CpuPool.for_node(reserve=len(os.sched_getaffinity(0)) - arm.cores)
    runtime = make_runtime("bwrap", owner, cpu_pool=pool)
    spec = SandboxSpec(limits=SandboxLimits(cpus=arm.static_cpus))
    python = shlex.quote(sys.executable)
    done: list[Done] = []
    lifetimes: list[float] = []

    async def trajectory(sandbox, steps: list[Step]) -> None:
        began = time.perf_counter()
        for step in steps:
            await asyncio.sleep(step.think_s)
            line = command(python, step, rate, arm.static_dop)
            asked = time.perf_counter()
            if step.test:
                out = await sandbox.bash(line, timeout=600, dop=(1, arm.cores), kind="tests")
            else:
                out = await sandbox.bash(line, timeout=600)
            act = time.perf_counter() - asked
            if out.exit_code != 0:
                raise RuntimeError(f"action failed: {line}: {out.output}")
            done.append(Done(step.test, act, float(out.output.split()[-1])))
        lifetimes.append(time.perf_counter() - began)

    sandboxes = []
    try:
        sandboxes = list(await asyncio.gather(*(runtime.start(spec) for _ in plans)))
        for sandbox in sandboxes:
            await sandbox.write_file("work.py", WORKER)
        busy, every = cpu_jiffies()
        began = time.perf_counter()
        await asyncio.gather(*(trajectory(s, steps) for s, steps in zip(sandboxes, plans, strict=True)))
        makespan = time.perf_counter() - began
        busy_after, every_after = cpu_jiffies()
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
        runtime.close()
        reap(owner=owner)
        remove_owner_files(owner)
    machine = (busy_after - busy) / max(1, every_after - every) * (os.cpu_count() or 1)
    return Run(done, lifetimes, makespan, machine)


def figures(arm: Arm, runs: list[Run], plans: list[list[list[Step]]]) -> dict[str, float | int | str | None]:
    """One arm's row: ACTs over every action of every round, makespan and machine load averaged over rounds, and
    the ACT the simulation gives the same rounds' traces."""
    done = [d for run in runs for d in run.done]
    acts = sorted(d.act_s for d in done)
    return {
        "arm": "action" if arm.static_cpus is None else "static",
        "pool_cores": arm.cores,
        "actions": len(done),
        "act_s": statistics.fmean(acts),
        "act_p95_s": acts[math.ceil(0.95 * len(acts)) - 1],
        "short_act_s": mean([d.act_s for d in done if not d.test]),
        "test_act_s": mean([d.act_s for d in done if d.test]),
        "wait_s": statistics.fmean(d.act_s - d.inside_s for d in done),
        "makespan_s": statistics.fmean(run.makespan_s for run in runs),
        "busy_fraction": sum(acts) / sum(t for run in runs for t in run.lifetimes),
        "machine_busy_cores": statistics.fmean(run.machine_busy_cores for run in runs),
        "other_cores": statistics.fmean(
            run.machine_busy_cores - sum(s.work_s for steps in round_plans for s in steps) / run.makespan_s
            for run, round_plans in zip(runs, plans, strict=True)
        ),
        "simulated_act_s": statistics.fmean(simulated_act(arm, round_plans) for round_plans in plans),
    }


def run_real(trace: RealTrace, pools: list[int] | None, rounds: int) -> dict[str, object]:
    """The real part: the static arm and the action-level arm for each pool size, round after round (the order
    reversed every other round, so a drift of the machine's load falls on every arm alike); printed as a table."""
    reason = real_unavailable()
    if reason is not None:
        print(f"real: skipped: {reason}")
        return {"skipped": reason}
    cores = len(os.sched_getaffinity(0))
    pools = pools or sorted({cores, max(1, cores // 2)}, reverse=True)
    if not all(1 <= k <= cores for k in pools):
        raise SystemExit(f"--real-pools must be within 1..{cores} (the CPUs this process may use), got {pools}")
    static_cpus = cores / trace.trajectories
    static_dop = math.ceil(static_cpus)
    arms = [Arm(cores, static_cpus, static_dop), *(Arm(k) for k in pools)]
    traces = [replace(trace, seed=trace.seed + r) for r in range(rounds)]
    plans = [t.plans() for t in traces]
    steps = [s for round_plans in plans for steps in round_plans for s in steps]
    work = sum(s.work_s for s in steps)
    rate = spin_rate()
    load = [os.getloadavg()[0]]
    print(f"\nreal: {cores} cores, {trace.trajectories} trajectories in bubblewrap sandboxes, {rounds} round(s) of "
          f"{len(steps) / rounds:.0f} actions on average ({sum(s.test for s in steps)} test runs in all, "
          f"{work:.0f} core-seconds of work), seed {trace.seed}, {rate / 1e6:.1f}M loop iterations per "
          f"core-second, load average {load[0]:.1f}")  # fmt: skip
    runs: list[list[Run]] = [[] for _ in arms]
    for r in range(rounds):
        order = list(range(len(arms))) if r % 2 == 0 else list(reversed(range(len(arms))))
        for i in order:
            runs[i].append(asyncio.run(run_arm(arms[i], plans[r], rate)))
    load.append(os.getloadavg()[0])
    rows = [figures(arm, arm_runs, plans) for arm, arm_runs in zip(arms, runs, strict=True)]
    print(f"{'arm':<34} {'actions':>7} {'ACT s':>7} {'p95 s':>7} {'short s':>8} {'test s':>7} {'wait s':>7} "
          f"{'span s':>7} {'in actions':>10} {'machine busy':>13} {'others':>7} {'simulated ACT s':>16}")  # fmt: skip
    for arm, row in zip(arms, rows, strict=True):
        if arm.static_cpus is None:
            label = f"action-level, pool of {arm.cores} core(s)"
        else:
            label = f"static, {arm.static_cpus:g} core/sandbox, DoP {arm.static_dop}"
        print(f"{label:<34} {row['actions']:>7} {row['act_s']:>7.2f} {row['act_p95_s']:>7.2f} "
              f"{seconds(row['short_act_s']):>8} {seconds(row['test_act_s']):>7} {row['wait_s']:>7.2f} "
              f"{row['makespan_s']:>7.1f} {row['busy_fraction']:>10.0%} {row['machine_busy_cores']:>7.2f} cores "
              f"{row['other_cores']:>7.2f} {row['simulated_act_s']:>16.2f}")  # fmt: skip
    static, full = rows[0], rows[1]
    matching = [r["pool_cores"] for r in rows[1:] if r["act_s"] <= static["act_s"]]
    result = {
        "cores": cores,
        "trajectories": trace.trajectories,
        "rounds": rounds,
        "seed": trace.seed,
        "turns": list(trace.turns),
        "think_s": trace.think_s,
        "short_s": trace.short_s,
        "test_s": trace.test_s,
        "test_share": trace.test_share,
        "work_core_s": work,
        "static_cpus": static_cpus,
        "static_dop": static_dop,
        "spin_rate": rate,
        "load_average": load,
        "arms": rows,
        "act_ratio": static["act_s"] / full["act_s"],
        "makespan_ratio": static["makespan_s"] / full["makespan_s"],
        "cores_to_match_static": min(matching, default=None),
    }
    match = result["cores_to_match_static"]
    print(f"static / action-level with {full['pool_cores']} cores: ACT {result['act_ratio']:.2f}x, "
          f"makespan {result['makespan_ratio']:.2f}x; action-level matches the static ACT with "
          + (f"{match} of {cores} cores" if match else f"none of the pools tried ({pools})")
          + f"; load average {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    print("targets (issue 22): ACT >= 2x lower, or the static ACT with at most half the cores")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("sim", "real", "both"), default="both", help="what to run (default both)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed of both parts (default 0)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--cores", type=int, default=1280, help="simulated cores (default 1280, the paper's)")
    parser.add_argument(
        "--batches", default="128,256,512,1024,1536", help="simulated batch sizes (default 128,256,512,1024,1536)"
    )
    parser.add_argument("--real-trajectories", type=int, default=8, help="real trajectories (default 8)")
    parser.add_argument("--real-rounds", type=int, default=2, help="rounds of every real arm (default 2)")
    parser.add_argument("--real-pools", help="action-level pool sizes, e.g. 2,1 (default: all cores, then half)")
    parser.add_argument("--real-turns", default="4,8", help="turns per trajectory and round, min,max (default 4,8)")
    parser.add_argument("--real-think-s", type=float, default=1.2, help="median model wait (default 1.2 s)")
    parser.add_argument("--real-short-s", type=float, default=0.1, help="median short action on 1 core (default 0.1 s)")
    parser.add_argument("--real-test-s", type=float, default=0.75, help="median test run on 1 core (default 0.75 s)")
    parser.add_argument("--real-test-share", type=float, default=0.25, help="actions that are tests (default 0.25)")
    args = parser.parse_args()
    results: dict[str, object] = {}
    if args.part in ("sim", "both"):
        batches = [int(b) for b in args.batches.split(",")]
        results.update(cores=args.cores, seed=args.seed, batches=run_sim(args.cores, batches, args.seed))
    if args.part in ("real", "both"):
        low, high = (int(t) for t in args.real_turns.split(","))
        trace = RealTrace(
            args.real_trajectories,
            (low, high),
            args.real_think_s,
            args.real_short_s,
            args.real_test_s,
            args.real_test_share,
            args.seed,
        )
        pools = [int(k) for k in args.real_pools.split(",")] if args.real_pools else None
        results["real"] = run_real(trace, pools, args.real_rounds)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
