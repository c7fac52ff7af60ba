"""Benchmark: what the Prometheus metrics cost on the hot path (`GET /metrics`, docs/metrics.md).

Run it from the repository root::

    .venv/bin/python benchmarks/bench_metrics.py [--json out.json]

A few seconds on a 2-core machine with the defaults. Each event the metrics count is timed on the real
component that raises it, with the server's metrics attached (`ServerState.build` hooks a `ServerMetrics` to
it) and detached (its `on_*` hook set to None: the baseline), in the same run, alternating for `--rounds`
rounds; each figure is the median over rounds of the mean per event:

- result stored: `ResultStore.put` of a finished job's result (10 turns, 2,500 tokens), once per job;
- completion answered: `BackendPool.observe_completion`, once per answered LLM request;
- tool request: `ToolClient.request("ping")` to a real execution server in a `local` runtime sandbox (a round
  trip through its Unix socket), once per tool action.

Then `GET /metrics` itself: `generate_latest` of the registry after traffic on `--backends` backends and
every tool action, in milliseconds per scrape (read at scrape time: no cost between scrapes). Other work on
the machine skews the figures: the 1-minute load average at start is printed and kept.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "events": {"result_stored" | "completion" | "tool_request":
                   {"n_per_round", "without_us", "with_us", "added_us"}},   # microseconds per event
      "scrape_ms": milliseconds per GET /metrics body,
      "exposition_bytes": size of that body,
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s": wall time of the whole benchmark,
      "failures": {part: error message}                                    # normally empty
    }

The exit code is 0 whatever the figures; it is 1 only when a part could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header
from prometheus_client import generate_latest

from prorl_server.api import ServerState
from prorl_server.config import ServerSettings
from prorl_server.protocol import JobResult, JobStatus, StageTiming, Trajectory, TurnRecord
from prorl_server.tool_server.responses import RESPONSES


def sample_result(job_id: str) -> JobResult:
    """A completed job of 10 turns: 500 prompt tokens, 2,000 response tokens."""
    turn = TurnRecord(backend="http://127.0.0.1:8000/v1", prompt_len=500, output_ids=[7] * 100, logprobs=[0.0] * 100)
    trajectory = Trajectory(prompt_ids=[1] * 500, response_ids=[7] * 2000, response_mask=[1] * 2000, turns=[turn] * 10)
    timing = StageTiming(init_s=0.2, run_s=12.0, eval_s=1.0, total_s=13.5, turns=10)
    return JobResult(
        job_id=job_id, status=JobStatus.COMPLETED, reward=1.0, trajectory=trajectory, data_source="math", timing=timing
    )


def alternate(run: Callable[[bool], float], rounds: int) -> tuple[float, float]:
    """Median seconds per event without and with the metrics, over `rounds` alternating rounds."""
    without, with_ = [], []
    for _ in range(rounds):
        without.append(run(False))
        with_.append(run(True))
    return statistics.median(without), statistics.median(with_)


def part_result_stored(state: ServerState, n: int, rounds: int) -> tuple[float, float]:
    store = state.orchestrator.results
    hook = store.on_stored
    results = [sample_result(f"job-{i}") for i in range(n)]

    def run(attached: bool) -> float:
        store.on_stored = hook if attached else None
        started = time.perf_counter()
        for result in results:
            store.put(result)
        elapsed = time.perf_counter() - started
        store.ack(through=10**12)
        return elapsed / n

    try:
        return alternate(run, rounds)
    finally:
        store.on_stored = hook


def part_completion(state: ServerState, n: int, rounds: int) -> tuple[float, float]:
    pool = state.backends
    hook = pool.on_completion
    (backend,) = pool.backends()[:1]

    def run(attached: bool) -> float:
        pool.on_completion = hook if attached else None
        started = time.perf_counter()
        for _ in range(n):
            pool.observe_completion(backend, 2000, 100, 0.5)
        return (time.perf_counter() - started) / n

    try:
        return alternate(run, rounds)
    finally:
        pool.on_completion = hook


async def part_tool_request(state: ServerState, n: int, rounds: int) -> tuple[float, float]:
    manager = state.orchestrator.sandboxes
    assert manager is not None
    sandbox = await manager.start()
    tools = sandbox.tools
    hook = tools.on_request
    try:
        for _ in range(20):  # warm up the connection pool
            await tools.request("ping")
        without, with_ = [], []
        for _ in range(rounds):
            for attached, series in ((False, without), (True, with_)):
                tools.on_request = hook if attached else None
                started = time.perf_counter()
                for _ in range(n):
                    await tools.request("ping")
                series.append((time.perf_counter() - started) / n)
        return statistics.median(without), statistics.median(with_)
    finally:
        tools.on_request = hook
        await manager.shutdown()


def part_scrape(state: ServerState, backends: int, reps: int) -> tuple[float, int]:
    metrics = state.metrics
    for i in range(backends):
        address = state.backends.add(f"http://10.0.0.{i + 1}:8000/v1").address
        metrics.completion(address, 2000, 100, 0.5)
        metrics.llm_failure(address)
    for action in RESPONSES:
        metrics.tool_request(action, 0.01, False)
    body = generate_latest(metrics.registry)
    started = time.perf_counter()
    for _ in range(reps):
        generate_latest(metrics.registry)
    return (time.perf_counter() - started) / reps, len(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=positive_int, default=5000, help="events per round (results, completions)")
    parser.add_argument("--tool-requests", type=positive_int, default=500, help="tool requests per round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating rounds without and with metrics")
    parser.add_argument("--backends", type=positive_int, default=16, help="backends with traffic when scraping")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    report: dict[str, Any] = report_header(args)
    print(f"metrics benchmark: load average {report['machine']['load_avg_1m_at_start']:.2f} (other work skews it)")
    started = time.monotonic()
    settings = ServerSettings(runtime="local", llm_servers=["http://127.0.0.1:8000/v1"], result_retention_s=1e9)
    state = ServerState.build(settings)
    failures: dict[str, str] = {}
    parts: dict[str, tuple[int, Callable[[], Any]]] = {
        "result_stored": (args.events, lambda: part_result_stored(state, args.events, args.rounds)),
        "completion": (args.events, lambda: part_completion(state, args.events, args.rounds)),
        "tool_request": (
            args.tool_requests,
            lambda: asyncio.run(part_tool_request(state, args.tool_requests, args.rounds)),
        ),
    }
    events: dict[str, dict[str, float]] = {}
    for name, (n, run) in parts.items():
        try:
            without, with_ = run()
        except Exception as exc:  # report it, go on with the other parts
            failures[name] = f"{type(exc).__name__}: {exc}"
            continue
        events[name] = {
            "n_per_round": n,
            "without_us": without * 1e6,
            "with_us": with_ * 1e6,
            "added_us": (with_ - without) * 1e6,
        }
    report["events"] = events
    scrape_s, size = part_scrape(state, args.backends, reps=200)
    report["scrape_ms"], report["exposition_bytes"] = scrape_s * 1e3, size

    print(f"\n{'event':16s} {'without (us)':>13s} {'with (us)':>10s} {'added (us)':>11s}")
    for name, row in events.items():
        print(f"{name:16s} {row['without_us']:13.1f} {row['with_us']:10.1f} {row['added_us']:11.1f}")
    print(f"\nGET /metrics body with {args.backends} backends: {scrape_s * 1e3:.2f} ms, {size} bytes")
    report["checks"] = [
        check(f"{name}: added per event", f"{row['added_us']:.1f} us", f"{row['without_us']:.1f} us without", "", None)
        for name, row in events.items()
    ]
    print_checks(report["checks"])
    report["elapsed_s"] = time.monotonic() - started
    report["failures"] = failures
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
