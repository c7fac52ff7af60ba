"""Benchmark: rollout throughput over 1 to 8 server nodes (ProRL Agent's Figure 5), and 10,000 live rollouts
over 8 servers through one client.

Run it from the repository root, as root, with Slurm installed (`bash scripts/setup-slurm.sh install`)::

    .venv/bin/python benchmarks/bench_multinode.py [--json out.json] [--nodes 1,2,4,8] [--live 10000]
        [--skip-live] [--slots 16] [--jobs-per-node 96] [--tokens 40] [--step-s 0.1] [--hold-s 60]

About 4 minutes on a 2-core machine with the defaults. Other work on the machine skews the figures: the
machine's CPU utilisation during each run is measured and kept, with the 1-minute load average at start.

The nodes: `scripts/setup-slurm.sh start --nodes N` (`LocalSlurm`), started once for the largest count: each
node a network + UTS namespace with its own address, hostname and port space, behind one bridge with the
host. Slurm schedules nothing here: the processes are started straight inside the nodes (`LocalSlurm.run_on`:
`nsenter --net` + `unshare --uts`, which exec in place, so their PIDs are known and their CPU is read from
/proc/<pid>/stat), so that the benchmark measures rollouts, not Slurm's scheduling. Each node used runs one
`prorl-server sim-llm` (0.0.0.0:8001; a flat profile, `--step-s` per decode step at any batch size, so a
rollout's time does not depend on how many share the backend) and one `prorl-server serve` (0.0.0.0:8000,
its node's simulator as its one backend; RUN workers `--slots`, INIT and EVAL workers 4; the handler
benchmarks/multinode_handler.py, async stages that do nothing but the LLM turn or the hold). Both start
fresh for each node count and are stopped by PID (SIGTERM, SIGKILL after 15 s); the cluster's stop kills by
PID whatever is left in a node and removes the namespaces and the /etc/hosts lines, on error and Ctrl-C too.

Part 1, scaling: one `RolloutClient` in this process, on the host, over the N servers by hostname
(http://nI:8000). A closed loop keeps `--inflight-per-node` x N jobs in flight (default 2 x slots: every
server's RUN workers busy, the rest queued, whatever the client's placement does) until `--jobs-per-node` x
N results came back (`client.jobs.stream(ack=True)`; a result frees a place for the next submit). A job is one
LLM turn of a seeded length, uniform in [tokens / 2, 3 tokens / 2] (the same lengths at every N; rollouts
started together do not end together), about tokens x step-s seconds on average. The same per-node offered
load at every N, after a warm-up round of one-token jobs. Per N: jobs, wall seconds (first submit to last
result) and jobs over them, the steady rate (the results between the 10% and the 90% marks over the time
between them: without the ramp-up and the tail), the jobs the client placed on each server (min-max),
scaling efficiency = steady jobs/s(N) / (N x jobs/s(1)) (the smallest N as the base when 1 is not run), the
CPU per job of the servers and of their simulators (/proc/<pid>/stat) and of the client (this process,
`time.process_time`), how long the servers' and simulators' threads waited for a CPU per job
(/proc/<pid>/task/*/schedstat), and the machine's CPU utilisation over the run (/proc/stat: busy over total
jiffies of all cores, other work included; and without niced work, such as a build at nice 10, which yields
the CPU). A run whose un-niced utilisation is above `--cpu-bound-pct` (80) is CPU-bound: its efficiency
measures the 2 cores, not the design, and the target (>= 0.9 of linear, the one asked for at 4 nodes) is
not applied to it ("n/a").

Part 2, live: 8 servers (RUN workers `--live` / 8 + 16 each), `--live` jobs submitted through one client
(`client.jobs.submit_many`, 64 at a time, the client's least-loaded placement); each job holds its RUN
stage until `--hold-s` seconds after the first submit (the same moment for all: `release_at`), so that every
job is live at once once submitted, and all end together; then `client.jobs.collect(ack=True)` takes every
result. Measured: the submit rate, the jobs live at once (the servers' `GET /status`, every 2 s during
the hold), each server's resident set before and at the peak (KB per live job), the client's CPU time
(`time.process_time`: this process; the lag probe and the status sampling included) in submit, hold and
collect, per job over submit + collect, the event-loop lag of the client's loop (a task sleeping 10 ms and
measuring its overshoot) p50/p99/max per phase, and of it the part the loop's thread spent running (its
CPU time over the sample less the 10 ms, at most the lag: the rest is waiting for a CPU), and the CPU of the client, the servers and the machine
during submit: the client is the bottleneck when its one event loop uses >= 0.9 of a core there, else the
machine's CPU when its un-niced utilisation is above `--cpu-bound-pct`. Targets: lag p99 <= `--lag-bound-ms`
(100) in submit and in collect (the hold, idle, is not counted), client CPU per job <= `--client-cpu-bound-ms` (2 ms:
a 10,000-rollout step then costs the trainer at most 20 s of one core), every job live at once.

JSON output (`--json PATH`); times in seconds::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "cluster_start_s",
      "scaling": {"<N>": {"nodes", "start_s", "jobs", "failed", "placed" (jobs per server, sorted), "wall_s",
                          "jobs_per_s_wall", "jobs_per_s" (steady), "run_s_mean", "slot_use", "efficiency",
                          "server_cpu_per_job_ms",
                          "backend_cpu_per_job_ms", "client_cpu_per_job_ms", "cpu_wait_per_job_ms",
                          "bench_cores" (servers + simulators + client, CPU s per s), "cpu_util_pct",
                          "cpu_unniced_pct", "cpu_bound", "load_avg_1m_end", "verdict"}},
      "live": {"servers", "jobs", "failed", "start_s", "submit_s", "submit_per_s", "hold_s" (after submit),
               "collect_s", "live_peak", "rss_before_mb", "rss_peak_mb" (per server), "kb_per_live_job",
               "client_cpu": {"submit", "hold", "collect"} (CPU s), "client_cpu_per_job_ms",
               "lag_ms": {"submit" | "hold" | "collect" | "all": {"p50", "p99", "max", "own_p99", "own_max", "samples"}},
               "during_submit" | "during_collect": {"client_cores", "servers_cores", "backends_cores",
                   "cpu_util_pct", "cpu_unniced_pct", "client_share_pct", "client_cpu_wait_pct" (of the phase's
                   wall time, the client's threads runnable without a CPU)},
               "submit_bound" ("client" | "machine CPU" | "none")},
      "checks": [summary rows], "elapsed_s"
    }

Exit code 0 whatever the figures; 1 if a part could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import httpx
from _report import (
    check,
    children_run_this_checkout,
    cpu_s,
    finish,
    percentile_ms,
    positive_int,
    print_checks,
    report_header,
)

from prorl_server.client import RolloutClient
from prorl_server.testing.slurm import LocalSlurm, missing_namespaces, missing_slurm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HANDLER = f"multinode={HERE / 'multinode_handler.py'}:MultinodeHandler"
SERVER_PORT = 8000
SIM_PORT = 8001
STAGE_WORKERS = "4"
"""INIT and EVAL workers of every server (both stages do nothing here)."""
READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
LAG_INTERVAL_S = 0.01
LIVE_SERVERS = 8
SUBMIT_CONCURRENCY = 64
STATUS_EVERY_S = 2.0
CLIENT_BOUND_CORES = 0.9
SUBMIT_BOUNDS = {
    "client": "the client is the bottleneck (its event loop near a core)",
    "machine CPU": "the machine's CPU is the bound (the client and the servers share it), not the client alone",
    "none": "neither the client nor the machine's CPU is the bound",
}
"""Part 2's verdict on the submit rate, by `submit_bound`."""
STEADY = (0.1, 0.9)
"""Part 1's throughput: results between these fractions of the run's results, over the time between them."""


def rss_mb(pid: int) -> float:
    """Resident set of process `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def runqueue_wait_s(pid: int) -> float:
    """Seconds the threads of process `pid` (those alive now) spent runnable but waiting for a CPU
    (/proc/<pid>/task/*/schedstat, second field)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError):  # a thread that just ended
            continue
    return total / 1e9


def machine_jiffies() -> tuple[int, int, int]:
    """(busy, busy without niced work, total) jiffies of all cores since boot, from the first line of
    /proc/stat (user, nice, system, idle, iowait, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy, busy - fields[1], sum(fields)


class Meter:
    """CPU of the servers, their backends, this process and the machine between `start()` and `stop()`."""

    def __init__(self, servers: list[int], backends: list[int]) -> None:
        self.servers, self.backends = servers, backends

    def read(self) -> tuple[float, float, float, float, float, tuple[int, int, int], float]:
        return (
            sum(cpu_s(pid) for pid in self.servers),
            sum(cpu_s(pid) for pid in self.backends),
            time.process_time(),
            sum(runqueue_wait_s(pid) for pid in [*self.servers, *self.backends]),
            runqueue_wait_s(os.getpid()),
            machine_jiffies(),
            time.monotonic(),
        )

    def start(self) -> None:
        self.first = self.read()

    def stop(self) -> dict[str, float]:
        """Seconds of CPU of each part, the seconds the servers' and backends' threads and this process's
        waited for a CPU, the wall seconds, and the machine's utilisation in percent, with and without niced work."""
        (s0, b0, c0, w0, cw0, j0, t0), (s1, b1, c1, w1, cw1, j1, t1) = self.first, self.read()
        total = j1[2] - j0[2]
        util, unniced = (100 * (j1[k] - j0[k]) / total if total else float("nan") for k in (0, 1))
        return {
            "servers": s1 - s0,
            "backends": b1 - b0,
            "client": c1 - c0,
            "waited": w1 - w0,
            "client_waited": cw1 - cw0,
            "wall": t1 - t0,
            "util_pct": util,
            "unniced_pct": unniced,
        }


class NodeStack:
    """One simulator and one prorl-server on each of `names`, started inside the nodes; stopped by PID."""

    def __init__(self, nodes: LocalSlurm, names: list[str], run_workers: int, args: argparse.Namespace, logs: Path):
        self.nodes, self.names, self.run_workers, self.args, self.logs = nodes, names, run_workers, args, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.labels: dict[int, str] = {}
        self.sims: list[int] = []
        self.servers: list[int] = []

    @property
    def urls(self) -> list[str]:
        """The servers' base URLs, by hostname."""
        return [f"http://{name}:{SERVER_PORT}" for name in self.names]

    def __enter__(self) -> NodeStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Every simulator at once, wait until they answer; then every server at once, wait until healthy."""
        profile = f"1:{self.args.step_s},100000:{self.args.step_s}"
        for i, name in enumerate(self.names):
            argv = [sys.executable, "-m", "prorl_server.cli", "sim-llm", "--host", "0.0.0.0", "--port", str(SIM_PORT)]
            argv += ["--profile", profile, "--max-num-seqs", "65536", "--seed", str(i)]
            self.sims.append(self._launch(name, "sim", argv))
        self._wait_ready([f"http://{name}:{SIM_PORT}/health" for name in self.names])
        for name in self.names:
            argv = [sys.executable, "-m", "prorl_server.cli", "serve", "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
            argv += ["--llm-server", f"http://127.0.0.1:{SIM_PORT}/v1", "--handlers", HANDLER, "--no-entry-points"]
            argv += ["--runtime", "local", "--log-level", "warning", "--run-workers", str(self.run_workers)]
            argv += ["--init-workers", STAGE_WORKERS, "--eval-workers", STAGE_WORKERS]
            self.servers.append(self._launch(name, "server", argv))
        self._wait_ready([f"{url}/health" for url in self.urls])

    def _launch(self, node: str, role: str, argv: list[str]) -> int:
        with (self.logs / f"{node}-{role}.log").open("wb") as out:
            proc = self.nodes.run_on(node, argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.labels[proc.pid] = f"{node}-{role}"
        return proc.pid

    def _wait_ready(self, urls: list[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(urls)
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while waiting:
                for proc in self.procs:
                    if proc.poll() is not None:
                        label = self.labels[proc.pid]
                        raise RuntimeError(f"{label} exited ({proc.returncode}): {self.logs / label}.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready within {READY_TIMEOUT_S:.0f} s: {waiting}; logs in {self.logs}")
                try:
                    if http.get(waiting[0]).status_code == 200:
                        waiting.pop(0)
                        continue
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM to every process by PID, servers first; SIGKILL to any still there after the grace period."""
        for proc in sorted(self.procs, key=lambda p: p.pid not in self.servers):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


class LagProbe:
    """A task on the running loop that sleeps LAG_INTERVAL_S and records how late it woke up, per phase; and
    how much of that the loop's thread spent running (its own work: the thread's CPU time over the sample
    minus the interval, within 0 and the lag); the rest it waited for a CPU."""

    def __init__(self) -> None:
        self.phase = "start"
        self.lags: dict[str, list[float]] = {}
        self.own: dict[str, list[float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self, phase: str) -> None:
        self.phase = phase
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            began, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(LAG_INTERVAL_S)
            lag = max(0.0, time.perf_counter() - began - LAG_INTERVAL_S)
            self.lags.setdefault(self.phase, []).append(lag)
            self.own.setdefault(self.phase, []).append(min(lag, max(0.0, time.thread_time() - cpu - LAG_INTERVAL_S)))

    async def stop(self) -> dict[str, dict[str, float]]:
        """p50, p99 and max (ms), the same of the loop's own part, and the sample count of each phase and of
        all of them."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        phases = {**self.lags, "all": [lag for lags in self.lags.values() for lag in lags]}
        own = {**self.own, "all": [lag for lags in self.own.values() for lag in lags]}
        return {
            phase: {
                "p50": percentile_ms(lags, 50),
                "p99": percentile_ms(lags, 99),
                "max": percentile_ms(lags, 100),
                "own_p99": percentile_ms(own[phase], 99),
                "own_max": percentile_ms(own[phase], 100),
                "samples": len(lags),
            }
            for phase, lags in phases.items()
        }


def tokens_of(index: int, mean: int) -> int:
    """Job `index`'s output tokens: seeded, uniform in [mean / 2, 3 mean / 2] (the same at every node count),
    so that rollouts started together do not end together."""
    return random.Random(index).randint(max(1, mean // 2), mean + mean // 2)


def job(prefix: str, index: int, tokens: int, release_at: float | None = None) -> dict[str, Any]:
    """One job of the multinode handler."""
    instance: dict[str, Any] = {"data_source": "multinode", "tokens": tokens, "prompt": f"Task {index}: solve it."}
    if release_at is not None:
        instance["release_at"] = release_at
    return {"job_id": f"{prefix}-{index}", "instance": instance, "sampling_params": {"temperature": 1.0}}


@dataclass
class LoopOutcome:
    """What a closed loop saw: results that did not complete, when each result came back (monotonic
    seconds), each job's RUN stage seconds, and how many jobs the client placed on each server."""

    failed: int = 0
    back_at: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)
    placed: dict[str, int] = field(default_factory=dict)


async def closed_loop(
    client: RolloutClient, total: int, inflight: int, make: Callable[[int], dict[str, Any]]
) -> LoopOutcome:
    """Keep `inflight` jobs submitted and not yet back until `total` results came back. A refused submit
    (after the client's retries) stops the loop and is raised."""
    loop = asyncio.get_running_loop()
    outcome = LoopOutcome(placed=dict.fromkeys(client.servers, 0))
    submitted = 0
    submits: set[asyncio.Task[None]] = set()
    refused: list[BaseException] = []

    async def consume() -> None:
        async with client.jobs.stream(ack=True, wait=5.0) as stream:
            async for result in stream:
                outcome.back_at.append(time.monotonic())
                outcome.run_s.append(result.timing.run_s)
                outcome.failed += result.status.value != "completed"
                if submitted < total:
                    submit_next()
                if len(outcome.back_at) == total:
                    return

    consumer = loop.create_task(consume())

    async def submit(index: int) -> None:
        job_id = await client.jobs.submit(make(index))
        outcome.placed[client.jobs.server_of(job_id) or "?"] += 1

    def submitted_one(task: asyncio.Task[None]) -> None:
        submits.discard(task)
        if not task.cancelled() and task.exception() is not None:
            refused.append(task.exception() or AssertionError("unreachable"))
            consumer.cancel()

    def submit_next() -> None:
        nonlocal submitted
        task = loop.create_task(submit(submitted))
        submitted += 1
        submits.add(task)
        task.add_done_callback(submitted_one)

    for _ in range(min(inflight, total)):
        submit_next()
    try:
        await consumer
    except asyncio.CancelledError:
        if not refused:
            raise
    finally:
        await asyncio.gather(*submits, return_exceptions=True)
    if refused:
        raise refused[0]
    return outcome


def run_scaling(nodes: LocalSlurm, count: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Part 1 at `count` nodes: fresh stacks, a warm-up round, then the closed loop, measured."""
    started = time.monotonic()
    with NodeStack(nodes, nodes.node_names[:count], args.slots, args, logs) as stack:
        start_s = time.monotonic() - started
        meter = Meter(stack.servers, stack.sims)
        total = args.jobs_per_node * count

        async def drive() -> tuple[LoopOutcome, dict[str, float]]:
            async with RolloutClient(stack.urls, trust_env=False, timeout=60.0) as client:
                warm = count * args.slots
                await closed_loop(client, warm, warm, lambda i: job(f"warm{count}", i, 1))
                meter.start()
                outcome = await closed_loop(
                    client,
                    total,
                    args.inflight_per_node * count,
                    lambda i: job(f"run{count}", i, tokens_of(i, args.tokens)),
                )
                return outcome, meter.stop()

        outcome, used = asyncio.run(drive())
    back = sorted(outcome.back_at)
    lo, hi = int(STEADY[0] * total), int(STEADY[1] * total) - 1
    return {
        "nodes": count,
        "start_s": start_s,
        "jobs": total,
        "failed": outcome.failed,
        "placed": sorted(outcome.placed.values()),
        "wall_s": used["wall"],
        "jobs_per_s_wall": total / used["wall"],
        "jobs_per_s": (hi - lo) / (back[hi] - back[lo]),
        "run_s_mean": statistics.fmean(outcome.run_s),
        "server_cpu_per_job_ms": 1000 * used["servers"] / total,
        "backend_cpu_per_job_ms": 1000 * used["backends"] / total,
        "client_cpu_per_job_ms": 1000 * used["client"] / total,
        "cpu_wait_per_job_ms": 1000 * used["waited"] / total,
        "bench_cores": (used["servers"] + used["backends"] + used["client"]) / used["wall"],
        "cpu_util_pct": used["util_pct"],
        "cpu_unniced_pct": used["unniced_pct"],
        "cpu_bound": used["unniced_pct"] > args.cpu_bound_pct,
        "load_avg_1m_end": os.getloadavg()[0],
    }


def judge_scaling(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """Each row's efficiency against the smallest node count, and its verdict against the 0.9 target."""
    base = rows[min(rows, key=int)]
    per_node = base["jobs_per_s"] / base["nodes"]
    for row in rows.values():
        row["efficiency"] = row["jobs_per_s"] / (row["nodes"] * per_node)
        row["slot_use"] = row["jobs_per_s"] * row["run_s_mean"] / (row["nodes"] * args.slots)
        if row is base:
            row["verdict"] = "base"
        elif row["cpu_bound"]:
            row["verdict"] = f"n/a (CPU-bound: {row['cpu_unniced_pct']:.0f}%)"
        else:
            row["verdict"] = "PASS" if row["efficiency"] >= args.efficiency_target else "FAIL"
    if base["cpu_bound"]:
        base["verdict"] = f"base, CPU-bound: {base['cpu_unniced_pct']:.0f}%"


def phase_figures(used: dict[str, float]) -> dict[str, float]:
    """Part 2's figures of one phase: the cores the client, servers and simulators used, the machine's
    utilisation, the client's share of the three's CPU and the share of the phase its threads waited for a CPU."""
    ours = used["client"] + used["servers"] + used["backends"]
    return {
        "client_cores": used["client"] / used["wall"],
        "servers_cores": used["servers"] / used["wall"],
        "backends_cores": used["backends"] / used["wall"],
        "cpu_util_pct": used["util_pct"],
        "cpu_unniced_pct": used["unniced_pct"],
        "client_share_pct": 100 * used["client"] / ours if ours else float("nan"),
        "client_cpu_wait_pct": 100 * used["client_waited"] / used["wall"],
    }


def run_live(nodes: LocalSlurm, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Part 2: `--live` jobs over LIVE_SERVERS servers through one client, held live, then collected."""
    started = time.monotonic()
    workers = math.ceil(args.live / LIVE_SERVERS) + 16
    with NodeStack(nodes, nodes.node_names[:LIVE_SERVERS], workers, args, logs) as stack:
        out: dict[str, Any] = {"servers": LIVE_SERVERS, "jobs": args.live, "start_s": time.monotonic() - started}

        async def drive() -> None:
            async with RolloutClient(stack.urls, trust_env=False, timeout=60.0) as client:
                warm = 2 * LIVE_SERVERS
                await closed_loop(client, warm, warm, lambda i: job("warm-live", i, 1))
                out["rss_before_mb"] = [rss_mb(pid) for pid in stack.servers]
                probe = LagProbe()
                meter = Meter(stack.servers, stack.sims)
                meter.start()
                probe.start("submit")
                release_at = time.time() + args.hold_s
                t0 = time.monotonic()
                c0 = time.process_time()
                job_ids = await client.jobs.submit_many(
                    (job("live", i, 0, release_at) for i in range(args.live)), concurrency=SUBMIT_CONCURRENCY
                )
                out["submit_s"] = time.monotonic() - t0
                submit = meter.stop()
                c1 = time.process_time()
                probe.phase = "hold"
                peak, rss_peak = 0, [0.0] * len(stack.servers)
                while time.time() < release_at - 0.5:
                    statuses = await asyncio.gather(*(client.status(server=url) for url in stack.urls))
                    live = sum(n for s in statuses for key, n in s.jobs.items() if key != "stored_results")
                    if live >= peak:
                        peak, rss_peak = live, [rss_mb(pid) for pid in stack.servers]
                    await asyncio.sleep(min(STATUS_EVERY_S, max(0.0, release_at - 0.5 - time.time())))
                c2 = time.process_time()
                probe.phase = "collect"
                meter.start()
                t2 = time.monotonic()
                results = await client.jobs.collect(job_ids, ack=True, timeout=args.hold_s + 300)
                out["collect_s"] = time.monotonic() - t2
                collect = meter.stop()
                c3 = time.process_time()
                out["lag_ms"] = await probe.stop()
                out["hold_s"] = t2 - t0 - out["submit_s"]
                out["failed"] = sum(r.status.value != "completed" for r in results)
                out["live_peak"] = peak
                out["rss_peak_mb"] = rss_peak
                out["client_cpu"] = {"submit": c1 - c0, "hold": c2 - c1, "collect": c3 - c2}
                out["during_submit"], out["during_collect"] = phase_figures(submit), phase_figures(collect)

        asyncio.run(drive())
    out["submit_per_s"] = args.live / out["submit_s"]
    out["client_cpu_per_job_ms"] = 1000 * (out["client_cpu"]["submit"] + out["client_cpu"]["collect"]) / args.live
    grown = [peak - before for peak, before in zip(out["rss_peak_mb"], out["rss_before_mb"], strict=True)]
    out["kb_per_live_job"] = 1024 * sum(grown) / out["live_peak"] if out["live_peak"] else float("nan")
    during = out["during_submit"]
    if during["client_cores"] >= CLIENT_BOUND_CORES:
        out["submit_bound"] = "client"
    elif during["cpu_unniced_pct"] > args.cpu_bound_pct:
        out["submit_bound"] = "machine CPU"
    else:
        out["submit_bound"] = "none"
    return out


def print_scaling(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nThroughput by server nodes ({args.slots} RUN slots per node, {args.inflight_per_node} jobs in flight "
        f"per node, {args.jobs_per_node} jobs per node, one LLM turn of ~{args.tokens} tokens at {args.step_s} s a step)"
    )
    print(
        "  nodes  jobs  wall s  jobs/s  steady  placed   RUN s  slots  eff.  server  sim    client  wait   "
        f"cores  CPU util (un-niced)  verdict (>= {args.efficiency_target} of linear)"
    )
    for row in rows.values():
        placed = f"{min(row['placed'])}-{max(row['placed'])}"
        print(
            f"  {row['nodes']:>5} {row['jobs']:>5} {row['wall_s']:>7.1f} {row['jobs_per_s_wall']:>7.2f} "
            f"{row['jobs_per_s']:>7.2f}  {placed:<8}{row['run_s_mean']:>5.2f} {row['slot_use']:>6.2f} "
            f"{row['efficiency']:>5.2f} {row['server_cpu_per_job_ms']:>7.1f} {row['backend_cpu_per_job_ms']:>6.1f} "
            f"{row['client_cpu_per_job_ms']:>6.1f} {row['cpu_wait_per_job_ms']:>6.1f} {row['bench_cores']:>6.2f}  "
            f"{row['cpu_util_pct']:>4.0f}% ({row['cpu_unniced_pct']:>3.0f}%)        {row['verdict']}"
            + (f" ({row['failed']} failed)" if row["failed"] else "")
        )
    print("  steady: jobs/s between the 10% and 90% marks; placed: jobs the client sent each server (min-max); RUN s:")
    print("  a job's mean RUN stage; slots: busy share of the RUN slots, steady jobs/s x RUN s / (nodes x slots);")
    print("  eff.: steady jobs/s over linear; server, sim, client: CPU ms per job of the servers, their simulators")
    print("  and the client; wait: ms per job the servers' and simulators' threads were runnable but had no CPU;")
    print(f"  cores: CPU s per s of the three; CPU util: busy share of all {os.cpu_count()} cores, other work included")
    print(f"  (un-niced: without niced work, which yields the CPU); CPU-bound: un-niced above {args.cpu_bound_pct:g}%")


def print_live(live: dict[str, Any]) -> None:
    lag, during = live["lag_ms"], live["during_submit"]
    print(f"\n{live['jobs']} live rollouts over {live['servers']} servers through one client")
    print(
        f"  submit {live['submit_s']:.1f} s ({live['submit_per_s']:.0f} jobs/s), hold {live['hold_s']:.1f} s more, "
        f"collect {live['collect_s']:.1f} s; live at once: {live['live_peak']}; failed: {live['failed']}"
    )
    print(
        f"  server resident set {max(live['rss_before_mb']):.0f} -> {max(live['rss_peak_mb']):.0f} MB at most "
        f"({live['kb_per_live_job']:.1f} KB per live job)"
    )
    cpu = live["client_cpu"]
    print(
        f"  client CPU: submit {cpu['submit']:.2f} s, hold {cpu['hold']:.2f} s, collect {cpu['collect']:.2f} s: "
        f"{live['client_cpu_per_job_ms']:.2f} ms per job over submit + collect"
    )
    print(
        "  client event-loop lag, ms: "
        + "; ".join(f"{phase} p50 {f['p50']:.1f}, p99 {f['p99']:.1f}, max {f['max']:.0f}" for phase, f in lag.items())
    )
    print(
        "  of which the loop's own work (the rest: waiting for a CPU), ms: "
        + "; ".join(f"{phase} p99 {f['own_p99']:.1f}, max {f['own_max']:.0f}" for phase, f in lag.items())
    )
    print(
        f"  during submit: client {during['client_cores']:.2f} cores, servers {during['servers_cores']:.2f}, "
        f"simulators {during['backends_cores']:.2f}, machine {during['cpu_util_pct']:.0f}% busy "
        f"({during['cpu_unniced_pct']:.0f}% un-niced); client share "
        f"{during['client_share_pct']:.0f}%, waited for a CPU {during['client_cpu_wait_pct']:.0f}% of the time -> "
        f"{SUBMIT_BOUNDS[live['submit_bound']]}"
    )
    during = live["during_collect"]
    print(
        f"  during collect: client {during['client_cores']:.2f} cores, servers {during['servers_cores']:.2f}, "
        f"machine {during['cpu_util_pct']:.0f}% busy ({during['cpu_unniced_pct']:.0f}% un-niced); the client "
        f"waited for a CPU {during['client_cpu_wait_pct']:.0f}% of the time"
    )


def build_checks(report: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    scaling = report.get("scaling", {})
    base = min(scaling, key=int) if scaling else None
    for n, row in scaling.items():
        if n == base:
            continue
        passed = None if row["cpu_bound"] else row["efficiency"] >= args.efficiency_target
        target = f">= {args.efficiency_target}" + (" (the target: at 4)" if n == "4" else "")
        value = f"{row['efficiency']:.2f}" + (f" ({row['verdict']})" if row["cpu_bound"] else "")
        rows.append(check(f"scaling efficiency at {n} nodes", value, f"{base} node(s)", target, passed))
    live = report.get("live")
    if live:
        bound = args.lag_bound_ms
        rows += [
            check(
                f"client loop lag p99 in {phase}",
                f"{live['lag_ms'][phase]['p99']:.1f} ms",
                f"max {live['lag_ms'][phase]['max']:.0f} ms",
                f"<= {bound:g} ms",
                live["lag_ms"][phase]["p99"] <= bound,
            )
            for phase in ("submit", "collect")
        ]
        servers_ms = 1000 * live["during_submit"]["servers_cores"] * live["submit_s"] / live["jobs"]
        rows += [
            check(
                "client CPU per job",
                f"{live['client_cpu_per_job_ms']:.2f} ms",
                f"servers' {servers_ms:.2f} ms in submit",
                f"<= {args.client_cpu_bound_ms:g} ms",
                live["client_cpu_per_job_ms"] <= args.client_cpu_bound_ms,
            ),
            check(
                "jobs live at once", str(live["live_peak"]), "-", f"{live['jobs']}", live["live_peak"] >= live["jobs"]
            ),
        ]
    return rows


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--nodes", default="1,2,4,8", help="server node counts of part 1, comma-separated")
    parser.add_argument("--slots", type=positive_int, default=16, help="RUN workers per server in part 1")
    parser.add_argument("--inflight-per-node", type=positive_int, default=32, help="jobs kept in flight per node")
    parser.add_argument("--jobs-per-node", type=positive_int, default=96, help="measured jobs per node")
    parser.add_argument("--tokens", type=positive_int, default=40, help="output tokens of a part-1 rollout")
    parser.add_argument("--step-s", type=float, default=0.1, help="the simulators' seconds per decode step")
    parser.add_argument("--cpu-bound-pct", type=float, default=80.0, help="machine CPU utilisation deemed the bound")
    parser.add_argument("--efficiency-target", type=float, default=0.9, help="of linear, where not CPU-bound")
    parser.add_argument("--live", type=positive_int, default=10000, help="live rollouts of part 2")
    parser.add_argument("--hold-s", type=float, default=60.0, help="part 2's jobs end this long after the first submit")
    parser.add_argument("--skip-live", action="store_true", help="part 1 only")
    parser.add_argument("--lag-bound-ms", type=float, default=100.0, help="part 2's target for the lag p99")
    parser.add_argument("--client-cpu-bound-ms", type=float, default=2.0, help="part 2's target, client CPU per job")
    parser.add_argument("--logs", type=Path, help="keep the servers' and simulators' logs here")
    args = parser.parse_args(argv)
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    if counts and min(counts) < 1:
        parser.error("--nodes: positive integers")
    problem = missing_slurm() or missing_namespaces()
    if problem:
        print(f"bench_multinode: {problem}")
        return 1
    children_run_this_checkout()
    began = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM cleans up as Ctrl-C does
    largest = max([2, *counts, *([] if args.skip_live else [LIVE_SERVERS])])  # one node: no namespaces
    try:
        with tempfile.TemporaryDirectory(prefix="bench-multinode-") as tmp:
            logs = args.logs or Path(tmp)
            logs.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            with LocalSlurm(ROOT / "scripts/setup-slurm.sh", nodes=largest) as nodes:
                report["cluster_start_s"] = time.monotonic() - started
                print(f"{largest}-node cluster started in {report['cluster_start_s']:.2f} s", flush=True)
                report["scaling"] = {}
                for count in counts:
                    print(f"part 1: {count} node(s) ...", flush=True)
                    level_logs = logs / f"scaling-{count}"
                    level_logs.mkdir(exist_ok=True)
                    try:
                        row = report["scaling"][str(count)] = run_scaling(nodes, count, args, level_logs)
                        print(
                            f"  {row['jobs_per_s']:.2f} jobs/s steady (started in {row['start_s']:.1f} s; "
                            f"CPU {row['cpu_unniced_pct']:.0f}% un-niced)",
                            flush=True,
                        )
                    except Exception as exc:  # a level that cannot run at all
                        failures[f"scaling at {count} nodes"] = f"{type(exc).__name__}: {exc}"
                if not args.skip_live:
                    print(f"part 2: {args.live} live rollouts over {LIVE_SERVERS} servers ...", flush=True)
                    (logs / "live").mkdir(exist_ok=True)
                    try:
                        report["live"] = run_live(nodes, args, logs / "live")
                    except Exception as exc:
                        failures["live"] = f"{type(exc).__name__}: {exc}"
    finally:
        signal.signal(signal.SIGTERM, previous)
    if report.get("scaling"):
        judge_scaling(report["scaling"], args)
        print_scaling(report["scaling"], args)
    if "live" in report:
        print_live(report["live"])
    report["checks"] = build_checks(report, args)
    print_checks(report["checks"])
    report["elapsed_s"] = time.monotonic() - began
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
