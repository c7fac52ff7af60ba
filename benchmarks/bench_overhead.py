"""Benchmark: prorl-server's own overhead, and the three-pool pipeline against a single worker pool.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_overhead.py [--json out.json] [--pin] [--engine vllm]
    .venv/bin/python benchmarks/bench_overhead.py --engine vllm --skip-overhead --skip-pipeline --skip-journal

About two minutes on a 2-core machine with the defaults. Every server under test runs in this process on
a real uvicorn socket (127.0.0.1 only), with the garbage collector set as `prorl-server serve` sets it
(`prorl_server.process_gc`; both arms share it). The load generator runs in its own *process* (multiprocessing,
spawn) so it never competes with the server for the GIL; it is a minimal asyncio HTTP/1.1 keep-alive
client (pre-encoded request bytes, Content-Length framing), cheap on CPU. The scripted vLLM-protocol
backend (a test double, `prorl_server.testing`) runs in a third process. `--pin` puts the client and
the backend on the last CPU and the server on the others (by default the OS places everything).
Other work on the machine skews the figures: the 1-minute load average at start is printed and kept.

Part 1 - overhead
    A no-op handler (async init/run/eval that return at once; eval returns 1.0) on the real server
    (`ServerState.build` + `create_app` + `UvicornThread`), with the scripted backend registered (the
    no-op handler never calls it; health checks every hour). First `--latency-jobs` jobs go one at a
    time through `POST /process` on the fresh server: "added latency" is the client-observed latency
    minus the time the job spent inside handler stages (`timing.init_s + run_s + eval_s`, about 0.2 ms
    of stage machinery for no-op). Then `--jobs` jobs go with `--concurrency` requests in flight:
    jobs/s, and the server process's CPU time per job. The same client then does the same against a
    bare FastAPI/uvicorn route that parses a JSON body and echoes it, padded to the size of a no-op
    job result: the HTTP ceiling of this machine and Python stack.

Part 2 - pipeline vs single pool
    A seeded synthetic workload: INIT is a sandbox start (uniform in `--init-ms`), RUN is 1-3 real LLM
    turns (`ctx.llm.start`, `generate`, `add_messages` between turns) against the scripted backend,
    each completion taking `--llm-delay-ms`; EVAL is scoring with a heavy-tailed duration (lognormal,
    median a fifth of the range's top, clipped to `--eval-ms`). Every design runs the same job list on
    the same server code, through the same client at the same concurrency (`--pipeline-concurrency`,
    more than any design's workers, so every design always has work queued).

    Stage resources are slots. A sandbox start holds one of I sandbox-start slots (what the container
    runtime can start at once), scoring holds one of E CPU slots, an LLM turn holds only its request
    (the backend batches). The sandbox started in INIT lives until right after RUN, as in the server.

    - pipeline: the three pools sized to the stage resources: init=I, run=R, eval=E
      (`--init-workers`, `--run-workers`, `--eval-workers`).
    - single_pool (same slots): N = I+R+E generic workers, each doing INIT, RUN and EVAL of one job in
      turn: a handler whose `run` does all three, on a RUN pool of N (INIT is not overridden, EVAL only
      returns the reward). It obeys the same stage limits: a worker waits for a sandbox-start or CPU
      slot while holding its own worker slot. This is the comparison the target is about. Note that
      it is the best case for a single pool: for a pipeline to sustain X jobs/s each pool needs at
      least X*t_stage workers, so I+R+E >= X*(t_init+t_run+t_eval), which is just what N workers need
      to sustain X (Little's law). With equal slots and work-conserving stages the pipeline cannot be
      faster in steady state; expect a ratio near 1.
    - single_pool_capped: the single pool as usually built, without per-stage limits (each worker
      owns what every stage needs, like "N environment workers"). Then N must not exceed any stage's
      resource, so N = min(I, E). This is where sizing each stage to its own resource pays: RUN gets
      R workers instead of min(I, E).

Part 3 - results journal on vs off
    The no-op workload of part 1 (POST /process) through a server without a journal ("off") and one with
    `--journal` on a fresh file in a temporary directory ("on", `--journal-sync normal`), same client,
    same run, interleaved `--journal-rounds` times (off, on, off, on, ...) so that drift in the machine's
    load hits both alike; each mode's figure is the median over its rounds. Each run: `--latency-jobs`
    one at a time, then `--journal-jobs` at `--concurrency`, each result padded with an artifact of
    `--journal-payload-bytes` (a trajectory stand-in: the journal writes every result). With the journal,
    every /process answer waits until its result is committed. The server's CPU per job counts the
    serialization of every change (by the thread that makes it) and the API loop's sends to the writer
    process; the writer process (SQLite's own work, outside the server's GIL) is measured apart, from /proc. The hot-path cost is reported as percentages: jobs/s lost,
    server CPU per job added, and CPU per job added with the writer process's counted in.
    No-op jobs are the worst case (the server does nothing else per job); the same comparison is then made
    on part 2's synthetic workload (the "pipeline" design, same job list, same rounds), whose jobs spend
    tens of milliseconds in stages, as real ones spend seconds to minutes.

Part 4 - the real vLLM, through the server and alone (only with `--engine vllm`; about 10 minutes on 2 cores)
    The CPU build of vLLM (`scripts/setup-vllm.sh`; SmolLM2-135M-Instruct, max_num_seqs
    `--engine-concurrency`) and `prorl-server serve` in front of it (`LocalStack`, child processes stopped by
    PID) with a one-turn chat handler (fidelity_handler.py, `turns` 1). Each round sends `--engine-requests`
    one-turn requests of exactly `--engine-max-tokens` tokens (`ignore_eos`, temperature 1, seed per request),
    `--engine-concurrency` at a time, either straight to vLLM (`POST /v1/completions` with the body the server
    sends: the chat's prompt ids from vLLM's /tokenize, made before timing, `return_token_ids`, `logprobs` 0)
    or through the server's job path (`POST /process`: the server tokenizes the chat, calls vLLM, builds the
    trajectory). The arms alternate (direct, server, server, direct, ...) `--engine-rounds` times after an
    unmeasured warm-up of each; each arm's figure is its tokens over its wall time, all rounds summed.
    Checked on the way: the server's prompt ids equal the direct ones, and the server tokenizes locally
    (`prorl_backend_local_tokenizer` 1: no /tokenize round trip per turn). Target: cost <= 5% of tokens/s.

JSON output (`--json PATH`); times in milliseconds unless a key says otherwise::

    {
      "machine": {"cpus", "python", "platform", "uvicorn_http", "uvicorn_loop", "load_avg_1m_at_start",
                  "pinning": {"server", "helpers"}},     # CPU lists, only with --pin
      "config": {every command-line option},
      "elapsed_s": wall time of the whole benchmark,
      "overhead": {                                      # absent with --skip-overhead
        "prorl":     {"jobs", "concurrency", "wall_s", "jobs_per_s", "latency_p50_ms", "latency_p99_ms",
                      "server_cpu_us_per_job", "errors", "first_error"},
        "bare_http": {same keys as "prorl"},
        "throughput_vs_bare": prorl jobs/s / bare jobs/s,
        "latency":   {"jobs", "concurrency": 1, "client_p50_ms", "client_p99_ms",
                      "stage_p50_ms",           # inside handler stages (timing.init_s + run_s + eval_s)
                      "server_total_p50_ms",    # submit -> result inside the server (timing.total_s)
                      "server_queue_p50_ms",    # of which between stages: queues, thread hand-offs
                      "added_p50_ms", "added_p99_ms", "errors"},
        "bare_latency": {"jobs", "concurrency": 1, "client_p50_ms", "client_p99_ms", "errors"},
        "response_bytes": size of one no-op job result
      },
      "pipeline": {                                      # absent with --skip-pipeline
        "jobs", "seed", "client_concurrency",
        "workload": {"init_ms", "turns", "llm_delay_ms", "eval_ms", "eval_mean_ms"},
        "designs": {
          "pipeline" | "single_pool" | "single_pool_capped": {
            "workers": {"init", "run", "eval"},   # pool sizes given to the server
            "total_workers",                      # I+R+E for the pipeline, N for the single pools
            "wall_s", "jobs_per_s", "completed", "errors", "first_error",
            "latency_p50_ms", "latency_p99_ms",   # client-observed, queueing included
            "server_cpu_us_per_job",              # this (server) process's CPU time per measured job
            "mean_stage_ms": {"queue", "init", "run", "eval"},   # from result timing
            "peak": {"init", "run", "eval", "sandboxes"}         # most stage work / live sandboxes at once
          }
        },
        "speedup_vs_single_pool", "speedup_vs_single_pool_capped"   # pipeline jobs/s / design jobs/s
      },
      "journal": {                                       # absent with --skip-journal
        "rounds", "jobs", "latency_jobs", "concurrency", "payload_bytes", "sync": "normal",
        "off" | "on": {"jobs_per_s", "server_cpu_us_per_job", "writer_cpu_us_per_job",  # medians
                       "latency_p50_ms", "latency_p99_ms",                                  # c=1
                       "errors",                                                              # all rounds
                       "runs": [{"jobs_per_s", "server_cpu_us_per_job", "writer_cpu_us_per_job",
                                 "latency_p50_ms", "latency_p99_ms", "errors", "first_error"}]},  # per round
        "throughput_cost_pct": 100 * (1 - on jobs/s / off jobs/s),
        "cpu_cost_pct": 100 * (on server CPU per job / off server CPU per job - 1),
        "total_cpu_cost_pct": the same with the writer process's CPU added to "on",
        "latency_p50_added_ms": on latency p50 - off latency p50 (one job at a time),
        "journal_results": result rows in the last "on" journal after its server stopped (every job's),
        "journal_bytes": that journal's file size,
        "pipeline": {"jobs", "concurrency",               # part 2's workload, "pipeline" design
                     "off" | "on": {"jobs_per_s", "server_cpu_us_per_job", "latency_p50_ms",  # medians
                                    "errors", "runs": [part 2's per-design figures, per round]},
                     "throughput_cost_pct", "cpu_cost_pct"}   # as above (server process only)
      },
      "engine": {                                        # only with --engine vllm
        "requests", "max_tokens", "concurrency", "rounds", "vllm_start_s", "same_prompt_ids",
        "server_tokenizes_locally", "load_avg_1m_at_end",
        "direct" | "server": {"tokens", "wall_s", "tokens_per_s", "failed",   # all rounds summed
                              "server_cpu_ms_per_turn", "vllm_cpu_s_per_round",  # medians over rounds
                              "runs": [{"tokens", "wall_s", "tokens_per_s", "failed",
                                        "server_cpu_ms_per_turn", "vllm_cpu_s"}]},  # per round
        "cost_pct": 100 * (1 - server tokens/s / direct tokens/s),
        "cost_pct_median_of_rounds": the same per round (its direct and server runs), median over the rounds
      },
      "checks": [{"metric", "value", "baseline", "target", "pass"}],  # the summary table; pass is
                                                                     # true/false, or null without target
      "failures": {part: error message}               # parts that could not run (normally empty)
    }

The exit code is 0 whatever the figures (this is a measurement, not a test); it is 1 only when a part
could not run at all (its error is printed and kept under "failures": {part: message}).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _report import check, finish, percentile_ms, positive_int, print_checks
from fastapi import FastAPI, Response

from prorl_server import AgentHandler, JobContext
from prorl_server.api import ServerState, create_app
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerRegistry
from prorl_server.process_gc import tune_gc_for_serving
from prorl_server.testing import ScriptedBackend, UvicornThread, create_scripted_backend_app
from prorl_server.testing.uvicorn_thread import free_port

HOST = "127.0.0.1"
TARGET_JOBS_PER_S = 1000.0
TARGET_ADDED_P50_MS = 0.5
TARGET_CPU_VS_BARE = 2.0  # server CPU per no-op job, over bare FastAPI's per request
TARGET_SPEEDUP = 2.0  # the pipeline over the capped single pool (the same-slots row has no target: Little's law)
TARGET_JOURNAL_COST_PCT = 5.0
TARGET_JOURNAL_ADDED_P50_MS = 0.3
TARGET_ENGINE_COST_PCT = 5.0

# ------------------------------------------------------------------------------------------------
# Load generator (runs in its own process)
# ------------------------------------------------------------------------------------------------


@dataclass
class LoadSpec:
    """One load run: pre-encoded HTTP requests sent over `concurrency` keep-alive connections."""

    port: int
    requests: list[bytes]
    concurrency: int
    warmup: list[bytes] = field(default_factory=list)
    parse_json: bool = False
    expect: bytes = b""


@dataclass
class LoadResult:
    """What the client saw: per-request latencies (s), the measured wall time, errors, parsed timings."""

    latencies: list[float]
    wall_s: float
    errors: int
    first_error: str | None
    timings: list[dict[str, float]]
    response_bytes: int


def encode_post(port: int, path: str, body: dict[str, Any]) -> bytes:
    """A complete HTTP/1.1 POST request (keep-alive) with a JSON body."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    return head + payload


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Read one response framed by Content-Length; returns (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
    end = lower.index(b"\r\n", at + 2)
    length = int(lower[at + 17 : end])
    body = await reader.readexactly(length) if length else b""
    return status, body


async def _run_load(spec: LoadSpec, ready: multiprocessing.connection.Connection) -> LoadResult:
    """Open the connections, send the warm-up requests, then the measured ones; collect figures."""
    conns = [await asyncio.open_connection(HOST, spec.port) for _ in range(spec.concurrency)]
    errors = 0
    first_error: str | None = None
    latencies: list[float] = []
    timings: list[dict[str, float]] = []
    response_bytes = 0

    async def drive(
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], queue: Iterator[bytes], record: bool
    ) -> None:
        nonlocal errors, first_error, response_bytes
        reader, writer = conn
        perf = time.perf_counter
        for request in queue:
            t0 = perf()
            writer.write(request)
            try:
                status, body = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as exc:
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
                writer.close()
                reader, writer = await asyncio.open_connection(HOST, spec.port)
                continue
            elapsed = perf() - t0
            if status != 200 or (spec.expect and spec.expect not in body):
                errors += 1
                first_error = first_error or f"HTTP {status}: {body[:300]!r}"
            if not record:
                continue
            latencies.append(elapsed)
            response_bytes = len(body)
            if spec.parse_json:
                timing = json.loads(body).get("timing") or {}
                timings.append({k: float(v) for k, v in timing.items()})

    warm = iter(spec.warmup)
    await asyncio.gather(*(drive(c, warm, False) for c in conns))
    ready.send("start")
    measured = iter(spec.requests)
    t0 = time.perf_counter()
    await asyncio.gather(*(drive(c, measured, True) for c in conns))
    wall = time.perf_counter() - t0
    for _, writer in conns:
        writer.close()
    return LoadResult(latencies, wall, errors, first_error, timings, response_bytes)


def client_process(conn: multiprocessing.connection.Connection) -> None:
    """Client process main: run each LoadSpec received on `conn`, answer with its LoadResult; None ends."""
    while True:
        spec = conn.recv()
        if spec is None:
            return
        try:
            result: LoadResult | str = asyncio.run(_run_load(spec, conn))
        except Exception as exc:
            result = f"{type(exc).__name__}: {exc}"
        conn.send(result)


class LoadClient:
    """Parent-side handle of the client process."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext) -> None:
        self._ctx = ctx
        self._start()

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=client_process, args=(child,), name="bench-client", daemon=True)
        self._proc.start()
        child.close()

    def _wait(self, timeout_s: float, what: str) -> Any:
        """The next message from the client; on a time-out, replace the (busy) client and raise."""
        if not self._conn.poll(timeout_s):
            self._proc.terminate()
            self._proc.join(5)
            self._conn.close()
            self._start()
            raise TimeoutError(f"the client did not finish {what} within {timeout_s:g}s")
        return self._conn.recv()

    def run(
        self, spec: LoadSpec, timeout_s: float, on_start: Callable[[], None] | None = None
    ) -> tuple[LoadResult, float]:
        """Run a load; returns the result and the CPU seconds this (server) process used while the
        measured requests ran. `on_start` is called when the warm-up is over."""
        self._conn.send(spec)
        first = self._wait(timeout_s, "warming up")
        if first != "start":
            raise RuntimeError(f"client failed: {first}")
        if on_start is not None:
            on_start()
        cpu0 = _cpu_s()
        result = self._wait(timeout_s, "the measured requests")
        cpu = _cpu_s() - cpu0
        if isinstance(result, str):
            raise RuntimeError(f"client failed: {result}")
        return result, cpu

    @property
    def pid(self) -> int:
        """The client process id."""
        assert self._proc.pid is not None
        return self._proc.pid

    def close(self) -> None:
        """Ask the process to exit and join it (terminate it if it does not)."""
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# ------------------------------------------------------------------------------------------------
# Scripted backend (runs in its own process)
# ------------------------------------------------------------------------------------------------


def backend_process(port: int, delay_s: float, conn: multiprocessing.connection.Connection) -> None:
    """Serve the scripted vLLM-protocol test double until anything arrives on `conn`."""
    server = UvicornThread(
        create_scripted_backend_app(ScriptedBackend(default_delay_s=delay_s, default_reply="reply")), port=port
    )
    server.start()
    conn.send("ready")
    with contextlib.suppress(EOFError):
        conn.recv()
    server.stop()


class BackendProcess:
    """Parent-side handle of the scripted backend process."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext, delay_s: float) -> None:
        self.port = free_port(HOST)
        self.address = f"http://{HOST}:{self.port}/v1"
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=backend_process, args=(self.port, delay_s, child), name="bench-backend", daemon=True
        )
        self._proc.start()
        child.close()
        if not self._conn.poll(60) or self._conn.recv() != "ready":
            raise RuntimeError("the scripted backend did not start")

    @property
    def pid(self) -> int:
        """The backend process id."""
        assert self._proc.pid is not None
        return self._proc.pid

    def close(self) -> None:
        """Stop the backend and join its process."""
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send("stop")
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()


# ------------------------------------------------------------------------------------------------
# Servers under test
# ------------------------------------------------------------------------------------------------


class NoOpHandler(AgentHandler):
    """Every stage returns at once; reward 1. With `instance["payload_bytes"]`, the result carries an
    artifact of that many characters (a stand-in for a trajectory)."""

    name = "bench_noop"

    async def init(self, ctx: JobContext) -> None:
        """Nothing to set up."""
        return None

    async def run(self, ctx: JobContext) -> None:
        """No agent loop."""
        payload = int(ctx.instance.get("payload_bytes", 0))
        if payload:
            ctx.artifacts["payload"] = "x" * payload

    async def eval(self, ctx: JobContext) -> float:
        """Always 1."""
        return 1.0


@contextlib.contextmanager
def prorl_server(handlers: dict[str, AgentHandler], backend: str, **settings: Any) -> Iterator[UvicornThread]:
    """A real prorl-server (uvicorn on a socket) with `handlers` registered and `backend` added."""
    registry = HandlerRegistry()
    for name, handler in handlers.items():
        registry.register(name, handler)
    config = ServerSettings(
        llm_servers=[backend],
        entry_point_handlers=False,
        health_check_interval_s=3600.0,
        default_timeout_s=600.0,
        **settings,
    )
    state = ServerState.build(config, registry=registry)
    server = UvicornThread(create_app(state=state)).start()
    try:
        yield server
    finally:
        server.stop()


def create_echo_app() -> FastAPI:
    """The bare-HTTP ceiling: a FastAPI route that parses a JSON body and sends it back."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> Response:
        return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")

    return app


# ------------------------------------------------------------------------------------------------
# Part 2: the synthetic workload
# ------------------------------------------------------------------------------------------------


class StageModel:
    """Stage resources (slots) and counters shared by one design's stage functions.

    `slot(stage)` is a semaphore of the stage's capacity on the running event loop (stages of the
    pipeline run on different loops; each stage only ever uses its own). Counters are thread-safe.
    """

    def __init__(self, capacity: dict[str, int]) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._sems: dict[tuple[int, str], asyncio.Semaphore] = {}
        self.active = {"init": 0, "run": 0, "eval": 0, "sandboxes": 0}
        self.peak = dict(self.active)

    def reset_peaks(self) -> None:
        """Forget the peaks seen so far (after the warm-up)."""
        with self._lock:
            self.peak = dict(self.active)

    def _count(self, key: str, delta: int) -> None:
        with self._lock:
            self.active[key] += delta
            self.peak[key] = max(self.peak[key], self.active[key])

    @contextlib.asynccontextmanager
    async def slot(self, stage: str) -> AsyncIterator[None]:
        """Hold one of the stage's resource slots (if it has a limit) while the block runs."""
        sem: asyncio.Semaphore | None = None
        if stage in self.capacity:
            key = (id(asyncio.get_running_loop()), stage)
            with self._lock:
                sem = self._sems.get(key)
                if sem is None:
                    sem = self._sems[key] = asyncio.Semaphore(self.capacity[stage])
            await sem.acquire()
        self._count(stage, 1)
        try:
            yield
        finally:
            self._count(stage, -1)
            if sem is not None:
                sem.release()

    async def init(self, ctx: JobContext) -> None:
        """Start a sandbox: hold a sandbox-start slot for `init_s`; the sandbox lives until release."""
        async with self.slot("init"):
            await asyncio.sleep(float(ctx.instance["init_s"]))
        self._count("sandboxes", 1)
        released = False

        def stop_sandbox() -> None:
            nonlocal released
            if not released:
                released = True
                self._count("sandboxes", -1)

        ctx.on_release(stop_sandbox)

    async def run(self, ctx: JobContext) -> None:
        """The agent loop: `turns` real LLM turns, an observation between turns."""
        async with self.slot("run"):
            await ctx.llm.start([{"role": "user", "content": f"task {ctx.instance['index']}"}])
            turns = int(ctx.instance["turns"])
            for turn in range(turns):
                await ctx.llm.generate(max_tokens=16)
                if turn + 1 < turns:
                    await ctx.llm.add_messages([{"role": "user", "content": f"observation {turn}"}])

    async def eval(self, ctx: JobContext) -> float:
        """Score: hold a CPU slot for the job's heavy-tailed `eval_s`."""
        async with self.slot("eval"):
            await asyncio.sleep(float(ctx.instance["eval_s"]))
        return 1.0


class PipelineStages(AgentHandler):
    """The pipeline design: each stage in its own pool."""

    name = "bench_pipeline"

    def __init__(self, model: StageModel) -> None:
        self.model = model

    async def init(self, ctx: JobContext) -> None:
        """Sandbox start (INIT pool)."""
        await self.model.init(ctx)

    async def run(self, ctx: JobContext) -> None:
        """LLM turns (RUN pool)."""
        await self.model.run(ctx)

    async def eval(self, ctx: JobContext) -> float:
        """Scoring (EVAL pool)."""
        return await self.model.eval(ctx)


class SinglePoolStages(AgentHandler):
    """The single-pool design: one worker does INIT, RUN and EVAL of a job in turn (all in `run`)."""

    name = "bench_single"

    def __init__(self, model: StageModel) -> None:
        self.model = model

    async def run(self, ctx: JobContext) -> None:
        """INIT + RUN, release the sandbox (as the server does after RUN), then EVAL."""
        await self.model.init(ctx)
        await self.model.run(ctx)
        await ctx.release()
        ctx.state["reward"] = await self.model.eval(ctx)

    async def eval(self, ctx: JobContext) -> float:
        """The reward computed in `run`."""
        return float(ctx.state["reward"])


def make_workload(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The seeded job list: per job, INIT seconds, LLM turns and EVAL seconds."""
    rng = random.Random(args.seed)
    init_lo, init_hi = args.init_ms
    eval_lo, eval_hi = args.eval_ms
    # Lognormal with its median at 1/5 of the range's top, sigma 1: mostly short, a long tail to the cap.
    mu, sigma = math.log(max(eval_lo, eval_hi / 5)), 1.0
    jobs = []
    for index in range(args.pipeline_jobs + args.pipeline_warmup):
        eval_ms = min(eval_hi, max(eval_lo, rng.lognormvariate(mu, sigma)))
        jobs.append(
            {
                "index": index,
                "init_s": rng.uniform(init_lo, init_hi) / 1000,
                "turns": rng.randint(1, 3),
                "eval_s": eval_ms / 1000,
            }
        )
    return jobs


def run_design(
    name: str,
    workers: dict[str, int],
    capacity: dict[str, int],
    jobs: list[dict[str, Any]],
    args: argparse.Namespace,
    client: LoadClient,
    backend: BackendProcess,
    **settings: Any,
) -> dict[str, Any]:
    """Serve one design (with extra server `settings`), push the job list through `POST /process`, summarize."""
    model = StageModel(capacity)
    single = name != "pipeline"
    handler: AgentHandler = SinglePoolStages(model) if single else PipelineStages(model)
    with prorl_server(
        {handler.name: handler},
        backend.address,
        init_workers=workers["init"],
        run_workers=workers["run"],
        eval_workers=workers["eval"],
        **settings,
    ) as server:
        bodies = [
            encode_post(server.port, "/process", {"instance": {"data_source": handler.name, **job}}) for job in jobs
        ]
        warm = args.pipeline_warmup
        spec = LoadSpec(
            port=server.port,
            requests=bodies[warm:],
            warmup=bodies[:warm],
            concurrency=args.pipeline_concurrency,
            parse_json=True,
            expect=b'"status":"completed"',
        )
        result, cpu = client.run(spec, args.timeout, on_start=model.reset_peaks)
    timings = result.timings

    def mean_ms(key: str) -> float:
        return 1000 * statistics.fmean(t.get(key, 0.0) for t in timings) if timings else float("nan")

    total = workers["run"] if single else sum(workers.values())
    return {
        "workers": workers,
        "total_workers": total,
        "wall_s": result.wall_s,
        "jobs_per_s": len(result.latencies) / result.wall_s,
        "completed": len(result.latencies) - result.errors,
        "errors": result.errors,
        "first_error": result.first_error,
        "latency_p50_ms": percentile_ms(result.latencies, 50),
        "latency_p99_ms": percentile_ms(result.latencies, 99),
        "server_cpu_us_per_job": 1e6 * cpu / len(result.latencies) if result.latencies else float("nan"),
        "mean_stage_ms": {
            "queue": mean_ms("queue_s"),
            "init": mean_ms("init_s"),
            "run": mean_ms("run_s"),
            "eval": mean_ms("eval_s"),
        },
        "peak": dict(model.peak),
    }


def part_pipeline(args: argparse.Namespace, client: LoadClient, backend: BackendProcess) -> dict[str, Any]:
    """Part 2: the same job list through the pipeline and the two single-pool designs."""
    jobs = make_workload(args)
    i, r, e = args.init_workers, args.run_workers, args.eval_workers
    capacity = {"init": i, "eval": e}
    designs: dict[str, dict[str, Any]] = {}
    plans = [
        ("pipeline", {"init": i, "run": r, "eval": e}),
        ("single_pool", {"init": 1, "run": i + r + e, "eval": 1}),
        ("single_pool_capped", {"init": 1, "run": min(i, e), "eval": 1}),
    ]
    for name, workers in plans:
        print(f"  part 2: {name} ({workers}) ...", flush=True)
        designs[name] = run_design(name, workers, capacity, jobs, args, client, backend)
    measured = jobs[args.pipeline_warmup :]
    base = designs["pipeline"]["jobs_per_s"]
    return {
        "jobs": args.pipeline_jobs,
        "seed": args.seed,
        "client_concurrency": args.pipeline_concurrency,
        "workload": {
            "init_ms": list(args.init_ms),
            "turns": [1, 3],
            "llm_delay_ms": args.llm_delay_ms,
            "eval_ms": list(args.eval_ms),
            "eval_mean_ms": 1000 * statistics.fmean(j["eval_s"] for j in measured),
        },
        "designs": designs,
        "speedup_vs_single_pool": base / designs["single_pool"]["jobs_per_s"],
        "speedup_vs_single_pool_capped": base / designs["single_pool_capped"]["jobs_per_s"],
    }


# ------------------------------------------------------------------------------------------------
# Part 1: overhead
# ------------------------------------------------------------------------------------------------


def _throughput_figures(result: LoadResult, cpu_s: float, concurrency: int) -> dict[str, Any]:
    n = len(result.latencies)
    return {
        "jobs": n,
        "concurrency": concurrency,
        "wall_s": result.wall_s,
        "jobs_per_s": n / result.wall_s,
        "latency_p50_ms": percentile_ms(result.latencies, 50),
        "latency_p99_ms": percentile_ms(result.latencies, 99),
        "server_cpu_us_per_job": 1e6 * cpu_s / n if n else float("nan"),
        "errors": result.errors,
        "first_error": result.first_error,
    }


def part_overhead(args: argparse.Namespace, client: LoadClient, backend: BackendProcess) -> dict[str, Any]:
    """Part 1: no-op jobs through the real server, then the bare echo endpoint, same client."""
    out: dict[str, Any] = {}
    handler = NoOpHandler()
    with prorl_server({handler.name: handler}, backend.address) as server:
        request = encode_post(server.port, "/process", {"instance": {"data_source": handler.name, "prompt": "x" * 32}})
        probe = httpx.post(
            f"{server.url}/process", json={"instance": {"data_source": handler.name, "prompt": "x" * 32}}
        )
        probe.raise_for_status()
        response_bytes = len(probe.content)
        expect = b'"status":"completed"'
        # Latency first, on a fresh server: one job at a time, nothing queued, no results piled up.
        print(f"  part 1: prorl-server, {args.latency_jobs} no-op jobs one at a time ...", flush=True)
        spec = LoadSpec(server.port, [request] * args.latency_jobs, 1, [request] * 50, parse_json=True, expect=expect)
        result, _ = client.run(spec, args.timeout)
        stage = [t.get("init_s", 0.0) + t.get("run_s", 0.0) + t.get("eval_s", 0.0) for t in result.timings]
        added = [lat - s for lat, s in zip(result.latencies, stage, strict=True)]
        out["latency"] = {
            "jobs": len(result.latencies),
            "concurrency": 1,
            "client_p50_ms": percentile_ms(result.latencies, 50),
            "client_p99_ms": percentile_ms(result.latencies, 99),
            "stage_p50_ms": percentile_ms(stage, 50),
            "server_total_p50_ms": percentile_ms([t.get("total_s", 0.0) for t in result.timings], 50),
            "server_queue_p50_ms": percentile_ms([t.get("queue_s", 0.0) for t in result.timings], 50),
            "added_p50_ms": percentile_ms(added, 50),
            "added_p99_ms": percentile_ms(added, 99),
            "errors": result.errors,
        }
        print(f"  part 1: prorl-server, {args.jobs} no-op jobs, concurrency {args.concurrency} ...", flush=True)
        spec = LoadSpec(server.port, [request] * args.jobs, args.concurrency, [request] * args.warmup, expect=expect)
        result, cpu = client.run(spec, args.timeout)
        out["prorl"] = _throughput_figures(result, cpu, args.concurrency)
    with UvicornThread(create_echo_app()) as echo:
        # Pad the echoed body to the size of a no-op job result.
        pad = max(0, response_bytes - len(json.dumps({"pad": ""}, separators=(",", ":"))))
        request = encode_post(echo.port, "/echo", {"pad": "x" * pad})
        spec = LoadSpec(echo.port, [request] * args.latency_jobs, 1, [request] * 50)
        result, _ = client.run(spec, args.timeout)
        out["bare_latency"] = {
            "jobs": len(result.latencies),
            "concurrency": 1,
            "client_p50_ms": percentile_ms(result.latencies, 50),
            "client_p99_ms": percentile_ms(result.latencies, 99),
            "errors": result.errors,
        }
        print(f"  part 1: bare FastAPI echo ({response_bytes} B), concurrency {args.concurrency} ...", flush=True)
        spec = LoadSpec(echo.port, [request] * args.jobs, args.concurrency, [request] * args.warmup)
        result, cpu = client.run(spec, args.timeout)
        out["bare_http"] = _throughput_figures(result, cpu, args.concurrency)
    out["throughput_vs_bare"] = out["prorl"]["jobs_per_s"] / out["bare_http"]["jobs_per_s"]
    out["response_bytes"] = response_bytes
    return out


# ------------------------------------------------------------------------------------------------
# Part 3: results journal on vs off
# ------------------------------------------------------------------------------------------------


def _journal_run(
    args: argparse.Namespace, client: LoadClient, backend: BackendProcess, journal: Path | None
) -> dict[str, Any]:
    """One server (with `journal`, or without one): latency one job at a time, then throughput."""
    handler = NoOpHandler()
    settings = {"journal": str(journal)} if journal is not None else {}
    instance = {"data_source": handler.name, "prompt": "x" * 32, "payload_bytes": args.journal_payload_bytes}
    expect = b'"status":"completed"'
    with prorl_server({handler.name: handler}, backend.address, **settings) as server:
        request = encode_post(server.port, "/process", {"instance": instance})
        spec = LoadSpec(server.port, [request] * args.latency_jobs, 1, [request] * 50, expect=expect)
        latency, _ = client.run(spec, args.timeout)
        spec = LoadSpec(
            server.port, [request] * args.journal_jobs, args.concurrency, [request] * args.warmup, expect=expect
        )
        writer_cpu = [0.0]
        result, cpu = client.run(spec, args.timeout, on_start=lambda: writer_cpu.__setitem__(0, _writer_cpu_s()))
        writer_cpu[0] = _writer_cpu_s() - writer_cpu[0]
    figures = _throughput_figures(result, cpu, args.concurrency)
    jobs = len(result.latencies)
    return {
        "jobs_per_s": figures["jobs_per_s"],
        "server_cpu_us_per_job": figures["server_cpu_us_per_job"],
        "writer_cpu_us_per_job": 1e6 * writer_cpu[0] / jobs if jobs else float("nan"),
        "latency_p50_ms": percentile_ms(latency.latencies, 50),
        "latency_p99_ms": percentile_ms(latency.latencies, 99),
        "errors": latency.errors + result.errors,
        "first_error": latency.first_error or result.first_error,
    }


def _writer_cpu_s() -> float:
    """CPU seconds used so far by the journal writer processes of this process's servers (from /proc)."""
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != os.getpid() or b"journal/commit_loop.py" not in (proc / "cmdline").read_bytes():
                continue
        except (OSError, ValueError):  # it ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def part_journal(args: argparse.Namespace, client: LoadClient, backend: BackendProcess) -> dict[str, Any]:
    """Part 3: the no-op workload without and with a results journal, interleaved rounds, same client."""
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as tmp:
        journal = Path(tmp) / "journal.sqlite3"
        for round_ in range(args.journal_rounds):
            for mode in ("off", "on"):
                print(f"  part 3: journal {mode}, round {round_ + 1} of {args.journal_rounds} ...", flush=True)
                if mode == "on":
                    for path in Path(tmp).iterdir():  # a fresh journal each round
                        path.unlink()
                runs[mode].append(_journal_run(args, client, backend, journal if mode == "on" else None))
        with sqlite3.connect(journal) as db:
            rows = db.execute("SELECT count(*) FROM results").fetchone()[0]
        size = journal.stat().st_size
        pipeline = _journal_pipeline(args, client, backend, Path(tmp))

    def median(mode: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[mode])

    out: dict[str, Any] = {
        "rounds": args.journal_rounds,
        "jobs": args.journal_jobs,
        "latency_jobs": args.latency_jobs,
        "concurrency": args.concurrency,
        "payload_bytes": args.journal_payload_bytes,
        "sync": "normal",
    }
    for mode in ("off", "on"):
        out[mode] = {
            key: median(mode, key)
            for key in (
                "jobs_per_s",
                "server_cpu_us_per_job",
                "writer_cpu_us_per_job",
                "latency_p50_ms",
                "latency_p99_ms",
            )
        }
        out[mode]["errors"] = sum(run["errors"] for run in runs[mode])
        out[mode]["runs"] = runs[mode]
    off, on = out["off"], out["on"]
    out["throughput_cost_pct"] = 100 * (1 - on["jobs_per_s"] / off["jobs_per_s"])
    out["cpu_cost_pct"] = 100 * (on["server_cpu_us_per_job"] / off["server_cpu_us_per_job"] - 1)
    out["total_cpu_cost_pct"] = 100 * (
        (on["server_cpu_us_per_job"] + on["writer_cpu_us_per_job"]) / off["server_cpu_us_per_job"] - 1
    )
    out["latency_p50_added_ms"] = on["latency_p50_ms"] - off["latency_p50_ms"]
    out["journal_results"] = rows
    out["journal_bytes"] = size
    out["pipeline"] = pipeline
    return out


def _journal_pipeline(
    args: argparse.Namespace, client: LoadClient, backend: BackendProcess, tmp: Path
) -> dict[str, Any]:
    """Part 2's workload through the pipeline design, without and with a journal, interleaved rounds."""
    jobs = make_workload(args)
    workers = {"init": args.init_workers, "run": args.run_workers, "eval": args.eval_workers}
    capacity = {"init": args.init_workers, "eval": args.eval_workers}
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for round_ in range(args.journal_rounds):
        for mode in ("off", "on"):
            print(f"  part 3: part 2's workload, journal {mode}, round {round_ + 1} ...", flush=True)
            settings: dict[str, Any] = {}
            if mode == "on":
                for path in tmp.iterdir():
                    path.unlink()
                settings["journal"] = str(tmp / "journal.sqlite3")
            runs[mode].append(run_design("pipeline", workers, capacity, jobs, args, client, backend, **settings))
    out: dict[str, Any] = {"jobs": args.pipeline_jobs, "concurrency": args.pipeline_concurrency}
    for mode in ("off", "on"):
        out[mode] = {
            key: statistics.median(run[key] for run in runs[mode])
            for key in ("jobs_per_s", "server_cpu_us_per_job", "latency_p50_ms")
        }
        out[mode]["errors"] = sum(run["errors"] for run in runs[mode])
        out[mode]["runs"] = runs[mode]
    out["throughput_cost_pct"] = 100 * (1 - out["on"]["jobs_per_s"] / out["off"]["jobs_per_s"])
    out["cpu_cost_pct"] = 100 * (out["on"]["server_cpu_us_per_job"] / out["off"]["server_cpu_us_per_job"] - 1)
    return out


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# Part 4: the real vLLM, through the server and alone (--engine vllm)
# ------------------------------------------------------------------------------------------------

ENGINE_HANDLER_FILE = Path(__file__).resolve().parent / "fidelity_handler.py"
ENGINE_QUESTIONS = [
    "Name three colors of the rainbow.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "Why is the sky blue?",
    "Describe a cat in one sentence.",
    "What is a prime number?",
    "Tell me a fun fact about space.",
]
ENGINE_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def _engine_sampling(args: argparse.Namespace) -> dict[str, Any]:
    """Every request's sampling: exactly `--engine-max-tokens` tokens (ignore_eos), temperature 1."""
    return {"temperature": 1.0, "max_tokens": args.engine_max_tokens, "ignore_eos": True}


async def _engine_round(
    http: httpx.AsyncClient, arm: str, target: str, prompts: list[list[int]], args: argparse.Namespace, model: str
) -> tuple[int, float, int]:
    """One round of one arm: every prompt, `--engine-concurrency` at a time; returns (generated tokens, wall
    seconds, failed requests). `direct`: POST /v1/completions to vLLM with the same body the server sends
    (prompt ids, return_token_ids, logprobs 0, the job's seed); `server`: POST /process of a one-turn job."""
    limit = asyncio.Semaphore(args.engine_concurrency)
    tokens = failed = 0

    async def one(i: int) -> None:
        nonlocal tokens, failed
        sampling = _engine_sampling(args)
        if arm == "direct":
            body = {
                **sampling, "prompt": prompts[i], "seed": i * 100, "return_token_ids": True, "logprobs": 0,
                "stream": False, "n": 1, "model": model,
            }  # fmt: skip
            url = f"{target}/completions"
        else:
            instance = {"data_source": "followup", "question": ENGINE_QUESTIONS[i % len(ENGINE_QUESTIONS)], "seed": i}
            body = {"instance": instance, "sampling_params": {**sampling, "turns": 1}}
            url = f"{target}/process"
        async with limit:
            response = await http.post(url, json=body)
        answer = response.json() if response.status_code == 200 else {}
        if arm == "direct":
            ids = answer.get("choices", [{}])[0].get("token_ids") or []
        else:
            ids = answer.get("trajectory", {}).get("response_ids") or [] if answer.get("status") == "completed" else []
        tokens += len(ids)
        failed += not ids

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return tokens, time.monotonic() - started, failed


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` and its children (vLLM's API server and its engine-core process)."""
    import psutil

    total = 0.0
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def part_engine(args: argparse.Namespace, client: LoadClient, backend: BackendProcess) -> dict[str, Any]:
    """Part 4: the real vLLM (CPU build) alone and through `prorl-server serve` in front of it, rounds
    alternated (direct, server, server, direct, ...) so that drift in the machine's load hits both arms alike."""
    from prorl_server.launch import LocalStack, auth_headers
    from prorl_server.vllm_cpu import SERVED_MODEL_NAME, VllmCpuSettings

    n = args.engine_requests
    with tempfile.TemporaryDirectory(prefix="bench-overhead-vllm-") as tmp, LocalStack(Path(tmp)) as stack:
        print(f"  part 4: starting vLLM (CPU build, max_num_seqs {args.engine_concurrency}) ...", flush=True)
        started = time.monotonic()
        llm = stack.vllm(VllmCpuSettings(max_num_seqs=args.engine_concurrency))
        start_s = time.monotonic() - started
        vllm_pid = stack.procs[-1].pid
        server = stack.server(
            "--llm-server", llm, "--handler", f"followup={ENGINE_HANDLER_FILE}:FollowUpHandler", "--no-entry-points",
            "--runtime", "local", "--run-workers", str(args.engine_concurrency), "--log-level", "warning",
        )  # fmt: skip
        server_pid = stack.procs[-1].pid
        root = llm.removesuffix("/v1")
        with httpx.Client(timeout=60, trust_env=False) as http:
            prompts = []
            for i in range(n):
                messages = [ENGINE_SYSTEM, {"role": "user", "content": ENGINE_QUESTIONS[i % len(ENGINE_QUESTIONS)]}]
                body = {"model": SERVED_MODEL_NAME, "messages": messages, "add_generation_prompt": True}
                prompts.append(http.post(f"{root}/tokenize", json=body).json()["tokens"])
        out: dict[str, Any] = {
            "requests": n, "max_tokens": args.engine_max_tokens, "concurrency": args.engine_concurrency,
            "rounds": args.engine_rounds, "vllm_start_s": start_s,
        }  # fmt: skip

        async def run_all() -> None:
            headers = auth_headers()
            async with httpx.AsyncClient(timeout=600, trust_env=False, headers=headers) as http:
                # the same prompts through the server: its trajectory's prompt ids must be what was sent direct
                probe = await http.post(
                    f"{server}/process",
                    json={
                        "instance": {"data_source": "followup", "question": ENGINE_QUESTIONS[0], "seed": 0},
                        "sampling_params": {**_engine_sampling(args), "turns": 1},
                    },
                )
                out["same_prompt_ids"] = probe.json()["trajectory"]["prompt_ids"] == prompts[0]
                for arm, target in (("direct", llm), ("server", server)):  # warm-up, unmeasured
                    await _engine_round(http, arm, target, prompts[: args.engine_concurrency], args, SERVED_MODEL_NAME)
                metrics = (await http.get(f"{server}/metrics")).text
                out["server_tokenizes_locally"] = any(
                    line.startswith("prorl_backend_local_tokenizer{") and line.rstrip().endswith(" 1.0")
                    for line in metrics.splitlines()
                )
                runs: dict[str, list[dict[str, Any]]] = {"direct": [], "server": []}
                order = ["direct", "server"]
                for r in range(args.engine_rounds):
                    for arm in order if r % 2 == 0 else order[::-1]:
                        target = llm if arm == "direct" else server
                        cpu0, vcpu0 = _tree_cpu_s(server_pid), _tree_cpu_s(vllm_pid)
                        tokens, wall, failed = await _engine_round(http, arm, target, prompts, args, SERVED_MODEL_NAME)
                        cpu, vcpu = _tree_cpu_s(server_pid) - cpu0, _tree_cpu_s(vllm_pid) - vcpu0
                        runs[arm].append(
                            {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "failed": failed,
                             "server_cpu_ms_per_turn": 1000 * cpu / n, "vllm_cpu_s": vcpu}
                        )  # fmt: skip
                        print(
                            f"    round {r + 1} {arm:<6}: {tokens / wall:6.1f} tokens/s ({failed} failed)", flush=True
                        )
                for arm, arm_runs in runs.items():
                    tokens, wall = sum(x["tokens"] for x in arm_runs), sum(x["wall_s"] for x in arm_runs)
                    out[arm] = {
                        "tokens": tokens,
                        "wall_s": wall,
                        "tokens_per_s": tokens / wall,
                        "failed": sum(x["failed"] for x in arm_runs),
                        "server_cpu_ms_per_turn": statistics.median(x["server_cpu_ms_per_turn"] for x in arm_runs),
                        "vllm_cpu_s_per_round": statistics.median(x["vllm_cpu_s"] for x in arm_runs),
                        "runs": arm_runs,
                    }

        asyncio.run(run_all())
    out["cost_pct"] = 100 * (1 - out["server"]["tokens_per_s"] / out["direct"]["tokens_per_s"])
    # each round's pair (direct and server back to back): robust to a burst of other load in one round
    pairs = zip(out["direct"]["runs"], out["server"]["runs"], strict=True)
    out["cost_pct_median_of_rounds"] = statistics.median(
        100 * (1 - s["tokens_per_s"] / d["tokens_per_s"]) for d, s in pairs
    )
    out["load_avg_1m_at_end"] = os.getloadavg()[0]
    return out


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the final table; `pass` is None for figures without a target."""
    rows: list[dict[str, Any]] = []
    over = report.get("overhead")
    if over:
        p, b, lat, blat = over["prorl"], over["bare_http"], over["latency"], over["bare_latency"]
        c = p["concurrency"]
        cpu_ratio = p["server_cpu_us_per_job"] / max(b["server_cpu_us_per_job"], 1e-9)
        rows += [
            check(
                f"no-op jobs/s, POST /process, c={c}",
                f"{p['jobs_per_s']:,.0f}/s",
                f"bare HTTP {b['jobs_per_s']:,.0f}/s",
                f">= {TARGET_JOBS_PER_S:,.0f}/s",
                p["jobs_per_s"] >= TARGET_JOBS_PER_S and p["errors"] == 0,
            ),
            check(
                "added latency p50, c=1",
                f"{lat['added_p50_ms']:.2f} ms",
                f"bare HTTP {blat['client_p50_ms']:.2f} ms",
                f"<= {TARGET_ADDED_P50_MS:g} ms",
                lat["added_p50_ms"] <= TARGET_ADDED_P50_MS and lat["errors"] == 0,
            ),
            check(
                "added latency p99, c=1",
                f"{lat['added_p99_ms']:.2f} ms",
                f"bare HTTP {blat['client_p99_ms']:.2f} ms",
                "-",
                None,
            ),
            check(
                f"client latency p50, c={c}",
                f"{p['latency_p50_ms']:.1f} ms",
                f"bare HTTP {b['latency_p50_ms']:.1f} ms",
                "-",
                None,
            ),
            check(
                f"client latency p99, c={c}",
                f"{p['latency_p99_ms']:.1f} ms",
                f"bare HTTP {b['latency_p99_ms']:.1f} ms",
                "-",
                None,
            ),
            check(
                "server CPU per job",
                f"{p['server_cpu_us_per_job']:,.0f} us = {cpu_ratio:.2f}x",
                f"bare HTTP {b['server_cpu_us_per_job']:,.0f} us",
                f"<= {TARGET_CPU_VS_BARE:g}x",
                cpu_ratio <= TARGET_CPU_VS_BARE and p["errors"] == 0,
            ),
        ]
    pipe = report.get("pipeline")
    if pipe:
        d = pipe["designs"]
        ok = all(x["errors"] == 0 for x in d.values())
        value = f"{d['pipeline']['jobs_per_s']:.1f} jobs/s"
        for key, label, speedup, target in (
            ("single_pool", "same slots", pipe["speedup_vs_single_pool"], None),
            ("single_pool_capped", "capped", pipe["speedup_vs_single_pool_capped"], TARGET_SPEEDUP),
        ):
            rows.append(
                check(
                    f"pipeline vs single pool ({label})",
                    f"{value} = {speedup:.2f}x",
                    f"{d[key]['jobs_per_s']:.1f} jobs/s",
                    "-" if target is None else f">= {target:g}x",
                    None if target is None else speedup >= target and ok,
                )
            )
    journal = report.get("journal")
    if journal:
        off, on = journal["off"], journal["on"]
        ok = off["errors"] == 0 and on["errors"] == 0
        c = journal["concurrency"]
        rows += [
            check(
                f"journal on: jobs/s, c={c} (cost)",
                f"{on['jobs_per_s']:,.0f}/s ({journal['throughput_cost_pct']:+.1f}%)",
                f"off {off['jobs_per_s']:,.0f}/s",
                f"cost <= {TARGET_JOURNAL_COST_PCT:g}%",
                journal["throughput_cost_pct"] <= TARGET_JOURNAL_COST_PCT and ok,
            ),
            check(
                "journal on: server CPU per job (cost)",
                f"{on['server_cpu_us_per_job']:,.0f} us ({journal['cpu_cost_pct']:+.1f}%)",
                f"off {off['server_cpu_us_per_job']:,.0f} us",
                f"cost <= {TARGET_JOURNAL_COST_PCT:g}%",
                journal["cpu_cost_pct"] <= TARGET_JOURNAL_COST_PCT and ok,
            ),
            check(
                "journal on: + writer process CPU per job",
                f"{on['writer_cpu_us_per_job']:,.0f} us (total {journal['total_cpu_cost_pct']:+.1f}%)",
                "-",
                "-",
                None,
            ),
            check(
                "journal on: latency p50, c=1 (added)",
                f"{on['latency_p50_ms']:.2f} ms ({journal['latency_p50_added_ms']:+.2f} ms)",
                f"off {off['latency_p50_ms']:.2f} ms",
                f"<= +{TARGET_JOURNAL_ADDED_P50_MS:g} ms",
                journal["latency_p50_added_ms"] <= TARGET_JOURNAL_ADDED_P50_MS and ok,
            ),
        ]
        pipe = journal["pipeline"]
        p_off, p_on = pipe["off"], pipe["on"]
        p_ok = p_off["errors"] == 0 and p_on["errors"] == 0
        rows += [
            check(
                "journal on, part 2's workload: jobs/s (cost)",
                f"{p_on['jobs_per_s']:.1f}/s ({pipe['throughput_cost_pct']:+.1f}%)",
                f"off {p_off['jobs_per_s']:.1f}/s",
                f"cost <= {TARGET_JOURNAL_COST_PCT:g}%",
                pipe["throughput_cost_pct"] <= TARGET_JOURNAL_COST_PCT and p_ok,
            ),
            check(
                "journal on, part 2's workload: server CPU per job (cost)",
                f"{p_on['server_cpu_us_per_job']:,.0f} us ({pipe['cpu_cost_pct']:+.1f}%)",
                f"off {p_off['server_cpu_us_per_job']:,.0f} us",
                "-",
                None,
            ),
        ]
    engine = report.get("engine")
    if engine:
        d, s = engine["direct"], engine["server"]
        ok = d["failed"] == 0 and s["failed"] == 0 and engine["same_prompt_ids"]
        rows += [
            check(
                f"real vLLM through the server: tokens/s, {engine['requests']} x {engine['max_tokens']} tokens, "
                f"c={engine['concurrency']} (cost)",
                f"{s['tokens_per_s']:.1f}/s ({engine['cost_pct']:+.1f}%)",
                f"straight to vLLM {d['tokens_per_s']:.1f}/s",
                f"cost <= {TARGET_ENGINE_COST_PCT:g}%",
                engine["cost_pct"] <= TARGET_ENGINE_COST_PCT and ok,
            ),
            check(
                "real vLLM through the server: server CPU per turn",
                f"{s['server_cpu_ms_per_turn']:.1f} ms",
                f"idle server, same time: {d['server_cpu_ms_per_turn']:.1f} ms",
                "-",
                None,
            ),
        ]
    return rows


def print_report(report: dict[str, Any]) -> None:
    """Human-readable tables."""
    over = report.get("overhead")
    if over:
        print("\nPart 1 - overhead (no-op handler, real uvicorn socket, client in its own process)")
        print(
            f"  {'server':<22}{'jobs':>7}{'conc':>6}{'jobs/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/job':>12}{'errors':>8}"
        )
        for label, key in (("prorl-server /process", "prorl"), ("bare FastAPI /echo", "bare_http")):
            f = over[key]
            print(
                f"  {label:<22}{f['jobs']:>7}{f['concurrency']:>6}{f['jobs_per_s']:>10,.0f}{f['latency_p50_ms']:>9.2f}"
                f"{f['latency_p99_ms']:>9.2f}{f['server_cpu_us_per_job']:>12,.0f}{f['errors']:>8}"
            )
        lat, blat = over["latency"], over["bare_latency"]
        print(f"  {'one job at a time (' + str(lat['jobs']) + ' jobs)':<37}{'p50 ms':>9}{'p99 ms':>9}")
        rows = [
            ("prorl-server client latency", lat["client_p50_ms"], lat["client_p99_ms"]),
            ("bare FastAPI client latency", blat["client_p50_ms"], blat["client_p99_ms"]),
            ("added (client - in stages)", lat["added_p50_ms"], lat["added_p99_ms"]),
            ("  in handler stages", lat["stage_p50_ms"], None),
            ("  submit -> result in server", lat["server_total_p50_ms"], None),
            ("  of which between stages", lat["server_queue_p50_ms"], None),
        ]
        for label, p50, p99 in rows:
            print(f"    {label:<33}{p50:>9.2f}" + (f"{p99:>9.2f}" if p99 is not None else ""))
        for key in ("prorl", "bare_http"):
            if over[key]["first_error"]:
                print(f"  first error ({key}): {over[key]['first_error']}")
    pipe = report.get("pipeline")
    if pipe:
        w = pipe["workload"]
        print(
            f"\nPart 2 - pipeline vs single pool ({pipe['jobs']} jobs, seed {pipe['seed']}, client concurrency "
            f"{pipe['client_concurrency']}; init U{tuple(w['init_ms'])} ms, 1-3 LLM turns of {w['llm_delay_ms']:g} ms, "
            f"eval lognormal clipped {tuple(w['eval_ms'])} ms, mean {w['eval_mean_ms']:.1f} ms)"
        )
        print(
            f"  {'design':<20}{'workers':>10}{'jobs/s':>8}{'p50 ms':>8}{'p99 ms':>8}   mean ms: {'queue':>6}{'init':>6}"
            f"{'run':>6}{'eval':>6}   peak: {'init':>5}{'run':>4}{'eval':>5}{'sbx':>5}{'errors':>8}"
        )
        for name, f in pipe["designs"].items():
            wk, st, pk = f["workers"], f["mean_stage_ms"], f["peak"]
            workers = f"{wk['init']}/{wk['run']}/{wk['eval']}"
            print(
                f"  {name:<20}{workers:>10}{f['jobs_per_s']:>8.1f}{f['latency_p50_ms']:>8.0f}{f['latency_p99_ms']:>8.0f}"
                f"{'':>12}{st['queue']:>6.0f}{st['init']:>6.1f}{st['run']:>6.1f}{st['eval']:>6.1f}"
                f"{'':>9}{pk['init']:>5}{pk['run']:>4}{pk['eval']:>5}{pk['sandboxes']:>5}{f['errors']:>8}"
            )
            if f["first_error"]:
                print(f"    first error: {f['first_error']}")
        print(
            "  workers are init/run/eval pool sizes; the single pools do all three stages inside RUN (their run\n"
            "  column is init+run+eval), INIT and EVAL are pass-throughs. peak = most stage work (and live\n"
            "  sandboxes, sbx) at once. Same slots: by Little's law a single pool of I+R+E workers under the same\n"
            "  stage limits can match the pipeline; capped: min(I, E) workers, so no stage can exceed its limit."
        )
    journal = report.get("journal")
    if journal:
        print(
            f"\nPart 3 - results journal on vs off (no-op jobs with a {journal['payload_bytes']} B artifact, POST "
            f"/process; {journal['rounds']} interleaved rounds, medians; sync {journal['sync']})"
        )
        print(
            f"  {'journal':<10}{'jobs/s':>10}{'cpu us/job':>12}{'+writer':>9}{'c=1 p50 ms':>12}{'c=1 p99 ms':>12}"
            f"{'errors':>8}"
        )
        for mode in ("off", "on"):
            f = journal[mode]
            print(
                f"  {mode:<10}{f['jobs_per_s']:>10,.0f}{f['server_cpu_us_per_job']:>12,.0f}"
                f"{f['writer_cpu_us_per_job']:>9,.0f}{f['latency_p50_ms']:>12.2f}{f['latency_p99_ms']:>12.2f}"
                f"{f['errors']:>8}"
            )
        print(
            f"  hot-path cost: {journal['throughput_cost_pct']:+.1f}% jobs/s, {journal['cpu_cost_pct']:+.1f}% server CPU "
            f"per job ({journal['total_cpu_cost_pct']:+.1f}% with the writer process), "
            f"{journal['latency_p50_added_ms']:+.2f} ms p50 one at a time; the last journal held "
            f"{journal['journal_results']} results in {journal['journal_bytes'] / 1e6:.1f} MB"
        )
        pipe = journal["pipeline"]
        print(f"  part 2's workload ({pipe['jobs']} jobs, pipeline design, client concurrency {pipe['concurrency']}):")
        for mode in ("off", "on"):
            f = pipe[mode]
            print(
                f"  {mode:<10}{f['jobs_per_s']:>10,.1f}{f['server_cpu_us_per_job']:>12,.0f}  p50 {f['latency_p50_ms']:.0f} ms"
                f"{'':>8}{f['errors']:>8}"
            )
        print(f"  cost: {pipe['throughput_cost_pct']:+.1f}% jobs/s, {pipe['cpu_cost_pct']:+.1f}% CPU per job")
        for mode in ("off", "on"):
            for run in journal[mode]["runs"] + pipe[mode]["runs"]:
                if run["first_error"]:
                    print(f"  first error (journal {mode}): {run['first_error']}")
    engine = report.get("engine")
    if engine:
        print(
            f"\nPart 4 - the real vLLM alone and through the server ({engine['requests']} one-turn requests of "
            f"{engine['max_tokens']} tokens, {engine['concurrency']} at a time, {engine['rounds']} alternated rounds; "
            f"vLLM started in {engine['vllm_start_s']:.0f} s)"
        )
        print(f"  {'arm':<26}{'tokens/s':>10}{'tokens':>8}{'wall s':>8}{'server ms/turn':>16}{'vLLM cpu s':>12}")
        for label, key in (("straight to vLLM", "direct"), ("through POST /process", "server")):
            f = engine[key]
            print(
                f"  {label:<26}{f['tokens_per_s']:>10.1f}{f['tokens']:>8}{f['wall_s']:>8.1f}"
                f"{f['server_cpu_ms_per_turn']:>16.1f}{f['vllm_cpu_s_per_round']:>12.1f}"
            )
        print(
            f"  cost {engine['cost_pct']:+.1f}% (median of the rounds' pairs {engine['cost_pct_median_of_rounds']:+.1f}%); "
            f"the server's prompt ids equal the direct ones: "
            f"{engine['same_prompt_ids']}; the server tokenizes locally (no /tokenize): "
            f"{engine['server_tokenizes_locally']}; load average at the end {engine['load_avg_1m_at_end']:.1f}\n"
            "  server ms/turn: the server process's CPU over the round / requests (straight to vLLM: the idle\n"
            "  server's own background work over the same time); vLLM cpu s: vLLM's processes' CPU per round"
        )
    rows = report["checks"]
    print_checks(rows)


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""

    def ms_range(text: str) -> tuple[float, float]:
        lo, _, hi = text.partition(",")
        return float(lo), float(hi or lo)

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--jobs", type=positive_int, default=5000, help="part 1: no-op jobs for the throughput run")
    parser.add_argument("--concurrency", type=positive_int, default=64, help="part 1: requests in flight")
    parser.add_argument("--latency-jobs", type=positive_int, default=500, help="part 1: jobs sent one at a time")
    parser.add_argument("--warmup", type=int, default=300, help="part 1: unmeasured requests first")
    parser.add_argument("--pipeline-jobs", type=positive_int, default=600, help="part 2: jobs per design")
    parser.add_argument("--pipeline-warmup", type=int, default=16, help="part 2: unmeasured jobs first")
    parser.add_argument("--pipeline-concurrency", type=positive_int, default=128, help="part 2: requests in flight")
    parser.add_argument("--init-workers", type=positive_int, default=4, help="part 2: I, also the sandbox-start slots")
    parser.add_argument("--run-workers", type=positive_int, default=8, help="part 2: R")
    parser.add_argument("--eval-workers", type=positive_int, default=4, help="part 2: E, also the scoring CPU slots")
    parser.add_argument("--init-ms", type=ms_range, default=(20.0, 60.0), help="part 2: INIT uniform range LO,HI")
    parser.add_argument("--eval-ms", type=ms_range, default=(1.0, 80.0), help="part 2: EVAL clip range LO,HI")
    parser.add_argument("--llm-delay-ms", type=float, default=15.0, help="part 2: time per LLM completion")
    parser.add_argument("--seed", type=int, default=1234, help="part 2: workload seed")
    parser.add_argument("--timeout", type=float, default=240.0, help="give up on one load run after this (s)")
    parser.add_argument("--skip-overhead", action="store_true", help="skip part 1")
    parser.add_argument("--skip-pipeline", action="store_true", help="skip part 2")
    parser.add_argument("--journal-jobs", type=positive_int, default=3000, help="part 3: jobs per throughput run")
    parser.add_argument("--journal-rounds", type=positive_int, default=3, help="part 3: rounds of off and on")
    parser.add_argument(
        "--journal-payload-bytes", type=int, default=4096, help="part 3: size of each result's artifact"
    )
    parser.add_argument("--skip-journal", action="store_true", help="skip part 3")
    parser.add_argument(
        "--engine",
        choices=["scripted", "vllm"],
        default="scripted",
        help="vllm: also part 4, the real vLLM (CPU build, scripts/setup-vllm.sh) alone and through the server",
    )
    parser.add_argument("--engine-requests", type=positive_int, default=32, help="part 4: one-turn requests per round")
    parser.add_argument("--engine-max-tokens", type=positive_int, default=64, help="part 4: tokens per request")
    parser.add_argument("--engine-concurrency", type=positive_int, default=4, help="part 4: requests in flight")
    parser.add_argument("--engine-rounds", type=positive_int, default=4, help="part 4: rounds of each arm")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin the client and backend processes to the last CPU and this (server) process to the others",
    )
    return parser.parse_args(argv)


def pin_processes(*helper_pids: int) -> dict[str, list[int]]:
    """Pin helper processes to the last CPU and every thread of this process to the other CPUs.

    Threads started later inherit the mask of the thread that starts them (the main thread).
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"server": cpus, "helpers": cpus}
    helpers, server = {cpus[-1]}, set(cpus[:-1])
    for pid in helper_pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), helpers)
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        os.sched_setaffinity(int(tid), server)
    return {"server": sorted(server), "helpers": sorted(helpers)}


def _uvicorn_stack() -> tuple[str, str]:
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return http, loop


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 whatever the figures, 1 only when a part could not run at all."""
    args = parse_args(argv)
    http, loop = _uvicorn_stack()
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "uvicorn_http": http,
            "uvicorn_loop": loop,
            "load_avg_1m_at_start": os.getloadavg()[0],
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    print(
        f"prorl-server overhead benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, uvicorn "
        f"{http}/{loop}, load average {os.getloadavg()[0]:.2f} (other work on the machine skews the figures)"
    )
    started = time.monotonic()
    tune_gc_for_serving()  # as `prorl-server serve` does once started; both arms share this process
    threads_before = {t.ident for t in threading.enumerate()}
    ctx = multiprocessing.get_context("spawn")
    client = LoadClient(ctx)
    backend: BackendProcess | None = None
    failures: dict[str, str] = {}
    try:
        backend = BackendProcess(ctx, args.llm_delay_ms / 1000)
        if args.pin:
            report["machine"]["pinning"] = pin_processes(client.pid, backend.pid)
        parts = [
            ("overhead", part_overhead, args.skip_overhead),
            ("pipeline", part_pipeline, args.skip_pipeline),
            ("journal", part_journal, args.skip_journal),
            ("engine", part_engine, args.engine != "vllm"),
        ]
        for key, part, skip in parts:
            if skip:
                continue
            try:
                report[key] = part(args, client, backend)
            except Exception as exc:  # report it, go on with the other part
                failures[key] = f"{type(exc).__name__}: {exc}"
                print(f"  {key}: could not run: {failures[key]}", flush=True)
    except Exception as exc:
        failures["setup"] = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
        if backend is not None:
            backend.close()
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    report["failures"] = failures
    print_report(report)
    leaked = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()]
    children = multiprocessing.active_children()
    leftovers = f"threads {leaked}, processes {[p.name for p in children]}" if leaked or children else None
    return finish(report, failures, args.json, leftovers)


if __name__ == "__main__":
    sys.exit(main())
