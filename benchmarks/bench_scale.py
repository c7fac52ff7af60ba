"""Benchmark: one server with 100 to 10,000 live multi-turn trajectories against the simulator.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_scale.py [--json out.json] [--levels 100,1000,10000] [--turns 5]
        [--tool-s 40] [--window-s 20] [--tokens 8] [--time-scale 50] [--seed 0] [--logs DIR]

About 4 minutes on 2 cores with the defaults. For each level, a fresh simulator (`prorl-server sim-llm`,
`--max-num-seqs` = the level: no engine queue) and a fresh server (`serve --runtime local`, RUN and INIT
workers = the level + 8, backend health checked at registration only: the simulator, busy with 10,000
requests on the same 2 cores, answers a health check late), both child processes (LocalStack, stopped by
PID; they import this checkout). The trajectories are bench_agent_loop.py's (agent_loop_handler.py: the built-in AgentLoop, one `work`
tool call per turn that sleeps the turn's tool time; no sandbox): `--turns` turns of `--tokens` tokens,
tool times lognormal around `--tool-s` (sigma 0.2), each starting after a seeded delay uniform in
[0, `--tool-s`], so that turns are spread evenly over time. A trajectory lives (admitted, its job not ended) for `--turns` tool times, nearly all of
it in its tool's sleep or its LLM call: what the server holds for it, and what each turn costs, is what is
measured. 16 short jobs first warm the server up (imports, first connections); then the server's idle CPU
is measured for 5 s; then the level's jobs go in with `POST /jobs` (64 requests in flight); once every start
delay is over (`--tool-s` after the last submission), a window of `--window-s` seconds is measured, and the
server is stopped with its jobs live.

Per level, over the window:
- memory per live job: the server's resident set (VmRSS, sampled every 0.5 s), median, minus the resident
  set after the warm-up, over the jobs live (`prorl_jobs_live`). It includes each trajectory so far (a
  short task's prompt and one to three turns of token ids and logprobs).
- CPU per turn: the server's CPU time (user + system, all threads) less its idle CPU over the same time,
  over the turns run (completions answered, `prorl_llm_request_duration_seconds_count`): the agent loop's
  turn with its two tokenizations, the tool call's bookkeeping, the LLM client.
- event-loop lag p99 of the API loop and of the RUN stage's loop (`prorl_event_loop_lag_seconds`, sampled
  every 50 ms; the difference of the scrapes at the window's ends): the upper bound of the histogram bucket
  holding the 99th percentile.
Growth: each figure at the largest level beside the smallest (the baseline, same run). Targets (issue 28):
<= 50 KB per live job and lag p99 <= 10 ms at 10,000; CPU per turn at most 2x the smallest level's
(nothing grows faster than linearly). Two cores run the server, the simulator and this client: at 10,000
the simulator's own CPU competes with the server's.

JSON output (`--json PATH`)::

    {
      "machine": {...}, "config": {...},
      "levels": {"<n>": {"rss_base_mb", "idle_cpu_per_s", "submit_s", "cpu_s", "window_s", "live", "finished",
                         "rss_live_mb", "memory_per_job_kb", "turns", "cpu_per_turn_us",
                         "lag_p99_ms": {"api", "run"}}},
      "growth": {"memory_per_job", "cpu_per_turn"},
      "checks": [summary rows], "elapsed_s"
    }
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _report import check, children_run_this_checkout, cpu_s, finish, positive_int, print_checks, report_header

HERE = Path(__file__).resolve().parent
HANDLER = f"agent_loop_bench={HERE / 'agent_loop_handler.py'}:AgentLoopBenchHandler"
SUBMITTERS = 64
RETRIES = 3
IDLE_S = 5.0
WARMUP_JOBS = 16


def plans(args: argparse.Namespace, count: int, prefix: str, tool_s: float) -> list[dict[str, Any]]:
    """`count` seeded trajectories (start delay, tool time and observation length per turn)."""
    out = []
    for i in range(count):
        rng = random.Random(f"{args.seed}:{prefix}:{i}")
        out.append(
            {
                "data_source": "agent_loop_bench",
                "index": i,
                "prompt": f"Task {i}: make the failing test pass. " + "x" * rng.randint(100, 300),
                "delay_s": rng.uniform(0, tool_s),
                "tool_s": [rng.lognormvariate(math.log(tool_s), 0.2) for _ in range(args.turns)],
                "observations": [rng.randint(50, 200) for _ in range(args.turns)],
                "turns": args.turns,
            }
        )
    return out


def rss_mb(pid: int) -> float:
    """Resident set of process `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Scrape:
    """One `GET /metrics` answer, parsed once: each sample name's sum over its series, and the cumulative
    bucket counts of `prorl_event_loop_lag_seconds` by loop."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.sums: dict[str, float] = {}
        self.lag: dict[str, dict[float, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.sums[sample.name] = self.sums.get(sample.name, 0.0) + sample.value
                if sample.name == "prorl_event_loop_lag_seconds_bucket":
                    self.lag.setdefault(sample.labels["loop"], {})[float(sample.labels["le"])] = sample.value

    def sum(self, name: str) -> float:
        """The sum over every series of one sample name (0 when there is none)."""
        return self.sums.get(name, 0.0)


def lag_p99_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound (ms) of the bucket holding the 99th percentile of the samples between two scrapes."""
    bounds = sorted(after)
    total = after[math.inf] - before.get(math.inf, 0.0)
    if total <= 0:
        return float("nan")
    for bound in bounds:
        if after[bound] - before.get(bound, 0.0) >= 0.99 * total:
            return 1000 * bound
    return float("inf")


class Sampler(threading.Thread):
    """Samples the server's resident set every 0.5 s until halted."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            try:
                self.samples.append(rss_mb(self.pid))
            except (OSError, RuntimeError):  # the server ended: the level fails on its requests
                return


def run_level(level: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One level on a fresh simulator and server: submit, let every trajectory start, measure a window."""
    import httpx

    from prorl_server.launch import LocalStack, auth_headers
    from prorl_server.launch.local_stack import free_port

    with LocalStack(logs) as stack:
        port = free_port()
        sim_argv = [sys.executable, "-m", "prorl_server.cli", "sim-llm", "--port", str(port)]
        sim_argv += ["--time-scale", str(args.time_scale), "--max-num-seqs", str(level + 8), "--seed", str(args.seed)]
        stack.launch("simulator", sim_argv, f"http://127.0.0.1:{port}/health")
        workers = str(level + 8)
        server = stack.server(
            *("--llm-server", f"http://127.0.0.1:{port}/v1", "--no-entry-points", "--runtime", "local"),
            *("--log-level", "warning", "--handlers", HANDLER, "--run-workers", workers, "--init-workers", workers),
            *("--health-check-interval", "3600"),  # a simulator busy with 10,000 requests answers /health late
        )
        pid = stack.procs[-1].pid
        params = {"temperature": 1.0, "max_tokens": args.tokens, "ignore_eos": True, "max_turns": args.turns}

        async def drive() -> dict[str, Any]:
            limits = httpx.Limits(max_connections=SUBMITTERS + 4)
            headers = auth_headers()
            async with httpx.AsyncClient(
                base_url=server, timeout=600, trust_env=False, headers=headers, limits=limits
            ) as http:

                async def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
                    """One request, sent again after a dropped connection (each is idempotent: a job id is
                    admitted once)."""
                    for attempt in range(RETRIES + 1):
                        try:
                            return (await http.request(method, url, **kwargs)).raise_for_status()
                        except httpx.TransportError:
                            if attempt == RETRIES:
                                raise
                            await asyncio.sleep(0.5)
                    raise AssertionError("unreachable")

                async def submit_all(jobs: list[dict[str, Any]], prefix: str, route: str) -> None:
                    queue = list(reversed(jobs))

                    async def submitter() -> None:
                        while queue:
                            plan = queue.pop()
                            body = {"instance": plan, "sampling_params": params, "job_id": f"{prefix}-{plan['index']}"}
                            await call("POST", route, json=body)

                    await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))

                await submit_all(plans(args, WARMUP_JOBS, "warm", 0.05), "warm", "/process")
                out: dict[str, Any] = {"rss_base_mb": rss_mb(pid)}
                idle0 = cpu_s(pid)
                await asyncio.sleep(IDLE_S)  # the server's own background: health checks, heartbeats
                out["idle_cpu_per_s"] = (cpu_s(pid) - idle0) / IDLE_S
                started = time.monotonic()
                await submit_all(plans(args, level, "run", args.tool_s), "run", "/jobs")
                out["submit_s"] = time.monotonic() - started
                await asyncio.sleep(args.tool_s)  # every start delay is over: all have started, turns are spread
                sampler = Sampler(pid)
                first = (await call("GET", "/metrics")).text
                cpu0, window0 = cpu_s(pid), time.monotonic()
                sampler.start()
                await asyncio.sleep(args.window_s)
                last = (await call("GET", "/metrics")).text
                out["cpu_s"], out["window_s"] = cpu_s(pid) - cpu0, time.monotonic() - window0
                sampler.halt.set()
                sampler.join()
                out.update(rss=sampler.samples, first=first, last=last)
                return out

        measured = asyncio.run(drive())
    first, last = Scrape(measured.pop("first")), Scrape(measured.pop("last"))
    live = last.sum("prorl_jobs_live")
    turns = last.sum("prorl_llm_request_duration_seconds_count") - first.sum("prorl_llm_request_duration_seconds_count")
    finished = last.sum("prorl_jobs_finished_total")
    samples = measured.pop("rss")
    rss_live = statistics.median(samples) if samples else float("nan")
    before, after = first.lag, last.lag
    net_cpu = measured["cpu_s"] - measured["idle_cpu_per_s"] * measured["window_s"]
    return {
        **measured,
        "live": live,
        "finished": finished - WARMUP_JOBS,
        "rss_live_mb": rss_live,
        "memory_per_job_kb": (rss_live - measured["rss_base_mb"]) * 1024 / live if live else float("nan"),
        "turns": turns,
        "cpu_per_turn_us": 1e6 * net_cpu / turns if turns else float("nan"),
        "lag_p99_ms": {loop: lag_p99_ms(before.get(loop, {}), after[loop]) for loop in ("api", "run") if loop in after},
    }


def print_report(report: dict[str, Any]) -> None:
    config = report["config"]
    print(
        f"\nLive trajectories on one server ({config['turns']} turns, tool ~{config['tool_s']} s; figures over a "
        f"{config['window_s']} s window with every trajectory live)"
    )
    print(
        f"  {'level':>7} {'live':>7} {'submit s':>9} {'RSS base':>9} {'RSS live':>9} {'KB/job':>7} {'turns':>7} "
        f"{'us/turn':>8} {'lag api':>8} {'lag run':>8} {'ended':>6}"
    )
    for level, row in report["levels"].items():
        lag = row["lag_p99_ms"]
        print(
            f"  {level:>7} {row['live']:>7.0f} {row['submit_s']:>9.1f} {row['rss_base_mb']:>8.0f}M "
            f"{row['rss_live_mb']:>8.0f}M {row['memory_per_job_kb']:>7.1f} {row['turns']:>7.0f} "
            f"{row['cpu_per_turn_us']:>8.0f} {lag.get('api', float('nan')):>7.1f}m {lag.get('run', float('nan')):>7.1f}m "
            f"{row['finished']:>6.0f}"
        )
    print("  (lag: p99 of the event loop's lag, the upper bound of its histogram bucket; ended: trajectories that")
    print("   ended before the window closed, 0 when every one was live throughout)")


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    levels = report["levels"]
    if not levels:
        return []
    small, large = min(levels, key=int), max(levels, key=int)
    top, base = levels[large], levels[small]
    rows = [
        check(
            f"memory per live job at {large}",
            f"{top['memory_per_job_kb']:.1f} KB",
            f"{small}: {base['memory_per_job_kb']:.1f} KB",
            "<= 50 KB",
            top["memory_per_job_kb"] <= 50,
        ),
        check(
            f"server CPU per turn at {large}",
            f"{top['cpu_per_turn_us']:.0f} us",
            f"{small}: {base['cpu_per_turn_us']:.0f} us",
            f"<= 2x at {small}",
            top["cpu_per_turn_us"] <= 2 * base["cpu_per_turn_us"],
        ),
    ]
    for loop in ("api", "run"):
        value = top["lag_p99_ms"].get(loop, float("nan"))
        rows.append(
            check(
                f"event-loop lag p99 ({loop}) at {large}",
                f"<= {value:g} ms",
                f"{small}: <= {base['lag_p99_ms'].get(loop, float('nan')):g} ms",
                "<= 10 ms",
                value <= 10,
            )
        )
    ended = sum(row["finished"] for row in levels.values())
    rows.append(check("trajectories ended inside the window", f"{ended:.0f}", "-", "0 (all live)", ended == 0))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--levels", default="100,1000,10000", help="live trajectories per run, comma-separated")
    parser.add_argument("--turns", type=positive_int, default=5, help="turns per trajectory")
    parser.add_argument("--tokens", type=positive_int, default=8, help="output tokens per turn")
    parser.add_argument("--tool-s", type=float, default=40.0, help="median tool time per turn, wall seconds")
    parser.add_argument("--window-s", type=float, default=20.0, help="seconds measured with every trajectory live")
    parser.add_argument("--time-scale", type=float, default=50.0, help="the simulator's simulated s per wall s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logs", type=Path, help="keep the simulator's and servers' logs here (default: discarded)")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        parser.error("--levels: one or more positive integers")
    children_run_this_checkout()
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    report["levels"] = {}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for level in levels:
            logs = (args.logs or Path(tmp)) / str(level)
            logs.mkdir(parents=True, exist_ok=True)
            print(f"level {level}: {level} trajectories ...", flush=True)
            try:
                report["levels"][str(level)] = run_level(level, args, logs)
            except Exception as exc:  # a level that cannot run at all
                failures[f"level {level}"] = f"{type(exc).__name__}: {exc}"
    done = report["levels"]
    if len(done) >= 2:
        small, large = done[min(done, key=int)], done[max(done, key=int)]
        report["growth"] = {
            "memory_per_job": large["memory_per_job_kb"] / small["memory_per_job_kb"],
            "cpu_per_turn": large["cpu_per_turn_us"] / small["cpu_per_turn_us"],
        }
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    if done:
        print_report(report)
    print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
