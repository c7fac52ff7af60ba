"""Benchmark: the server's own time per turn of the built-in agent loop, at 256 trajectories on the simulator.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_agent_loop.py [--json out.json] [--trajectories 256] [--turns 6]
        [--tokens 32] [--tool-s 2.0] [--observation-chars 200] [--time-scale 20] [--rounds 2] [--seed 0]
        [--arms baseline,server,server_local]

About 3 minutes on 2 cores with the defaults. Every server is a child process (LocalStack, stopped by PID;
they import the prorl_server of this checkout: its `src` is put first on their PYTHONPATH).

The workload: `--trajectories` trajectories at once, each `--turns` turns of exactly `--tokens` output
tokens (`ignore_eos`) on a simulated vLLM backend (`prorl_server.simllm`, the default latency profile at
`--time-scale`, `max_num_seqs` = trajectories: no engine queue), each turn followed by a tool that sleeps a
seeded lognormal time (median `--tool-s` wall seconds, sigma 0.5) and returns an observation of about
`--observation-chars` characters (lognormal) that the next turn reads; each trajectory starts after a
seeded delay uniform in [0, `--tool-s`] so that the trajectories do not move in lockstep. The plans (delays,
tool times, observation lengths) are drawn from `--seed` and are the same in both arms.

Arms, run `--rounds` times each in the order baseline, server, server, baseline, ... (so that drift in the
machine's load hits both alike); each arm gets a fresh simulator:

- **server**: prorl-server (`serve`, `--run-workers` = trajectories) running the built-in `AgentLoop`
  (agent_loop_handler.py: one `work` tool call per turn, see there), the jobs sent at once through
  `POST /process`. Per turn the loop does what it does for a real model: `LLMSession.generate` (one
  `POST /v1/completions` with the context's ids), parse the text, run the tool, `add_messages` (one
  `POST /tokenize` of the observation as the template delta); the first turn's `start` tokenizes the
  system prompt (the tool schemas) and the task.
- **server_local**: the same, with the simulator writing its tokenizer as Hugging Face files
  (`sim-llm --tokenizer-dir`) and reporting them as its model's root, so the server tokenizes the chats
  itself (README, "token in and token out"): per turn, `add_messages` sends no request. The simulator still
  answers the server's probes of its `/tokenize` once, at registration.
- **baseline**: the same trajectories driven straight against the simulator by a minimal client loop in
  this process (asyncio, one aiohttp session): the same requests (the same system prompt, bodies and
  sampling fields), the same tool sleeps, nothing else (no checks, no recording, no job around it).

The figure: each turn's wall time less the backend's time and the tool's time. The turn is the time from
the trajectory's start (turn 1) or the end of the previous tool call to the start of this turn's tool call,
measured where the loop runs (the handler's tool in the server, the client loop in the baseline). The
backend's time is measured inside the simulator (an ASGI middleware: from the moment the app gets the
request to the last byte of its answer), for the turn's completion (its `X-Prorl-Job-Id` header names the
trajectory) and the `/tokenize` it needed (the observation, or turn 1's prompt, carries the trajectory's
mark); what remains is the loop's own time: its work, its HTTP client, the two loopback hops, and the wait
for its event loop among the other trajectories. "added" = the server's p50 (p99) minus the baseline's:
what running the turn inside prorl-server's agent loop costs beyond the minimal client. Requests the
simulator cannot attribute (the session's one-off template probe) are counted, not subtracted. Also the
CPU time per turn of the process running the loop (the server's, from /proc; the baseline's: this
process's) and of the simulator, and, for the server, the part of its overhead inside the completion call
(`TurnRecord.llm_s` minus the simulator's time: its HTTP client and the hop) and outside it.
Target (issue 23): added <= 1 ms p50.

JSON output (`--json PATH`); times in milliseconds unless a key says otherwise::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "plan": {"trajectories", "turns", "tokens_per_turn", "tool_s_mean"},
      "arms": {
        "baseline" | "server" | "server_local": {
          "turns": turns measured (all rounds),
          "overhead_ms": {"p50", "p99", "mean"},         # wall - backend - tool, per turn
          "overhead_after_first_ms": {"p50", "p99", "mean"},   # turns 2.. only
          "backend_ms": {"p50", "p99"},                  # simulator time of the turn's requests
          "loop_cpu_ms_per_turn", "sim_cpu_ms_per_turn", # the loop's process, the simulator's
          "wall_s" (per round), "unattributed_requests", "failed", "first_error",
          "in_completion_ms": {"p50", "p99"},            # server arms only: llm_s - simulator completion time
          "outside_completion_ms": {"p50", "p99"}        # server arms only: overhead - in_completion
        }
      },
      "added_p50_ms", "added_p99_ms",                    # server - baseline overhead
      "added_local_p50_ms", "added_local_p99_ms",        # server_local - baseline overhead
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if an arm could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

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

HERE = Path(__file__).resolve().parent
HANDLER = f"agent_loop_bench={HERE / 'agent_loop_handler.py'}:AgentLoopBenchHandler"
MARK = re.compile(rb"@@(\d+)@@")
JOB_HEADER = "X-Prorl-Job-Id"
TIMINGS_PATH = "/bench/timings"


# the simulator's child process ------------------------------------------------------------------------------


class RequestTimer:
    """ASGI middleware: each `/tokenize` and `/v1/completions` request's time in the app, and whose it is
    (the job-id header, else the `@@i@@` mark in the body); `GET /bench/timings` answers them as JSON."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.records: list[tuple[str, str | None, float]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == TIMINGS_PATH:
            body = json.dumps(self.records).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        started = time.perf_counter()
        key = next((unquote(v.decode()) for k, v in scope["headers"] if k == b"x-prorl-job-id"), None)
        chunks: list[bytes] = []

        async def receive_body() -> dict[str, Any]:
            message = await receive()
            if key is None and message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        await self.app(scope, receive_body, send)
        if path in ("/tokenize", "/v1/completions"):
            if key is None:
                mark = MARK.search(b"".join(chunks))
                key = f"traj-{int(mark.group(1))}" if mark else None
            self.records.append((path, key, time.perf_counter() - started))


def simulator_child(args: argparse.Namespace) -> int:
    """`--sim-child`: serve one simulator with the RequestTimer on `--sim-port` until killed."""
    import uvicorn

    from prorl_server.simllm.app import create_app
    from prorl_server.simllm.config import SimLLMSettings
    from prorl_server.simllm.engine import SimEngine

    settings = SimLLMSettings(
        port=args.sim_port,
        time_scale=args.time_scale,
        max_num_seqs=max(args.trajectories, 1),
        seed=args.seed,
        tokenizer_dir=args.sim_tokenizer_dir,
    )
    app = RequestTimer(create_app(SimEngine(settings)))
    uvicorn.run(app, host="127.0.0.1", port=args.sim_port, log_level="warning", access_log=False)
    return 0


# the plan ----------------------------------------------------------------------------------------------------


def draw_plans(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The seeded trajectories: start delay, tool time and observation length per turn."""
    plans = []
    for i in range(args.trajectories):
        rng = random.Random(f"{args.seed}:{i}")
        plans.append(
            {
                "data_source": "agent_loop_bench",
                "index": i,
                "prompt": f"Task {i}: make the failing test pass. " + "x" * rng.randint(100, 300),
                "delay_s": rng.uniform(0, args.tool_s),
                "tool_s": [rng.lognormvariate(math.log(args.tool_s), 0.5) for _ in range(args.turns)],
                "observations": [
                    max(1, round(rng.lognormvariate(math.log(args.observation_chars), 0.5))) for _ in range(args.turns)
                ],
                "turns": args.turns,
            }
        )
    return plans


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"temperature": 1.0, "max_tokens": args.tokens, "ignore_eos": True}


# the arms ----------------------------------------------------------------------------------------------------


def run_server_arm(stack: Any, sim: str, plans: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The trajectories through prorl-server's agent loop; per-turn figures from the results."""
    import httpx

    workers = str(len(plans) + 8)
    options = ["--llm-server", f"{sim}/v1", "--no-entry-points", "--runtime", "local", "--log-level", "warning"]
    server = stack.server(*options, "--handlers", HANDLER, "--run-workers", workers, "--init-workers", workers)
    server_pid = stack.procs[-1].pid
    params = {**sampling(args), "max_turns": args.turns}

    async def drive() -> list[Any]:
        from prorl_server.launch import auth_headers

        limits = httpx.Limits(max_connections=len(plans) + 16, max_keepalive_connections=len(plans) + 16)
        async with httpx.AsyncClient(timeout=900, trust_env=False, headers=auth_headers(), limits=limits) as http:

            async def one(plan: dict[str, Any]) -> dict[str, Any]:
                body = {"instance": plan, "sampling_params": params, "job_id": f"traj-{plan['index']}"}
                return (await http.post(f"{server}/process", json=body)).raise_for_status().json()

            return await asyncio.gather(*(one(p) for p in plans), return_exceptions=True)

    cpu0, started = cpu_s(server_pid), time.monotonic()
    results = asyncio.run(drive())
    wall, loop_cpu = time.monotonic() - started, cpu_s(server_pid) - cpu0
    turns: dict[str, list[dict[str, Any]]] = {}
    failures = []
    for plan, result in zip(plans, results, strict=True):
        if isinstance(result, BaseException) or result["status"] != "completed":
            failures.append(result if isinstance(result, BaseException) else RuntimeError(str(result.get("error"))))
            continue
        bench = result["artifacts"]["bench"]
        records = result["trajectory"]["turns"]
        turns[f"traj-{plan['index']}"] = [
            {"wall": entry - (bench["start"] if k == 0 else bench["tools"][k - 1][1]), "llm_s": records[k]["llm_s"]}
            for k, (entry, _) in enumerate(bench["tools"])
        ]
    return {"turns": turns, "wall_s": wall, "loop_cpu_s": loop_cpu, "failures": failures}


def run_baseline_arm(sim: str, plans: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The same trajectories by a minimal client loop: the same requests, the same tool sleeps."""
    import aiohttp

    sys.path.insert(0, str(HERE))
    from agent_loop_handler import FORMAT_NAME, LOOP

    from prorl_server.agent import tools_prompt
    from prorl_server.tool_call_formats import FORMATS

    system = {"role": "system", "content": tools_prompt(LOOP.instructions, LOOP.tools, FORMATS[FORMAT_NAME])}
    base = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "A"}]
    params = sampling(args)

    async def drive() -> dict[str, list[dict[str, Any]]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def post(path: str, body: dict[str, Any], key: str | None = None) -> Any:
                headers = {JOB_HEADER: key} if key else None
                async with http.post(f"{sim}{path}", json=body, headers=headers) as response:
                    response.raise_for_status()
                    return await response.json()

            model = (await (await http.get(f"{sim}/v1/models")).json())["data"][0]["id"]
            shape = await post("/tokenize", {"model": model, "messages": base, "add_special_tokens": False})
            base_len = len(shape["tokens"])

            async def one(plan: dict[str, Any]) -> list[dict[str, Any]]:
                key = f"traj-{plan['index']}"
                await asyncio.sleep(plan["delay_s"])
                mark = time.monotonic()
                user = {"role": "user", "content": f"@@{plan['index']}@@ {plan['prompt']}"}
                body = {"model": model, "messages": [system, user], "add_generation_prompt": True}
                ids = (await post("/tokenize", body))["tokens"]
                out = []
                for turn in range(plan["turns"]):
                    body = {**params, "model": model, "prompt": ids, "return_token_ids": True, "logprobs": 0}
                    body.update(stream=False, n=1)
                    choice = (await post("/v1/completions", body, key))["choices"][0]
                    entered = time.monotonic()
                    out.append({"wall": entered - mark})
                    await asyncio.sleep(plan["tool_s"][turn])
                    observation = f"@@{plan['index']}@@ " + "o" * plan["observations"][turn]
                    mark = time.monotonic()
                    if turn + 1 < plan["turns"]:
                        messages = [*base, {"role": "tool", "content": observation}]
                        body = {"model": model, "messages": messages, "add_generation_prompt": True}
                        body["add_special_tokens"] = False
                        full = (await post("/tokenize", body))["tokens"]
                        ids = ids + choice["token_ids"] + full[base_len:]
                return out

            results = await asyncio.gather(*(one(p) for p in plans), return_exceptions=True)
            return {f"traj-{p['index']}": r for p, r in zip(plans, results, strict=True)}

    cpu0, started = time.process_time(), time.monotonic()
    turns = asyncio.run(drive())
    wall, loop_cpu = time.monotonic() - started, time.process_time() - cpu0
    failures = [r for r in turns.values() if isinstance(r, BaseException)]
    ok = {k: v for k, v in turns.items() if not isinstance(v, BaseException)}
    return {"turns": ok, "wall_s": wall, "loop_cpu_s": loop_cpu, "failures": failures}


def run_baseline_arm_in(stack: Any, sim: str, plans: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return run_baseline_arm(sim, plans, args)


def run_arm(name: str, plans: list[dict[str, Any]], args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One arm on a fresh simulator: its turns with the simulator's time of each attributed."""
    import httpx

    from prorl_server.launch import LocalStack
    from prorl_server.launch.local_stack import free_port

    with LocalStack(logs) as stack:
        port = free_port()
        argv = [sys.executable, str(Path(__file__).resolve()), "--sim-child", "--sim-port", str(port)]
        argv += ["--time-scale", str(args.time_scale), "--trajectories", str(args.trajectories)]
        argv += ["--seed", str(args.seed)]
        if name == "server_local":  # the simulator writes its tokenizer's files and reports them as its root
            argv += ["--sim-tokenizer-dir", str(logs / "tokenizer")]
        sim = f"http://127.0.0.1:{port}"
        stack.launch("simulator", argv, f"{sim}/health")
        sim_pid = stack.procs[-1].pid
        sim_cpu0 = cpu_s(sim_pid)
        run = run_baseline_arm_in if name == "baseline" else run_server_arm
        outcome = run(stack, sim, plans, args)
        sim_cpu = cpu_s(sim_pid) - sim_cpu0
        records = httpx.get(f"{sim}{TIMINGS_PATH}", timeout=60, trust_env=False).json()
    by_key: dict[str, dict[str, list[float]]] = {}
    unattributed = 0
    for path, key, seconds in records:
        if key is None:
            unattributed += 1
            continue
        by_key.setdefault(key, {"/tokenize": [], "/v1/completions": []})[path].append(seconds)
    rows = []
    for key, turns in outcome["turns"].items():
        sims = by_key.get(key, {"/tokenize": [], "/v1/completions": []})
        for k, turn in enumerate(turns):
            completion = sims["/v1/completions"][k] if k < len(sims["/v1/completions"]) else 0.0
            tokenize = sims["/tokenize"][k] if k < len(sims["/tokenize"]) else 0.0
            row = {"turn": k, "wall": turn["wall"], "backend": completion + tokenize}
            row["overhead"] = turn["wall"] - row["backend"]
            if "llm_s" in turn:
                row["in_completion"] = turn["llm_s"] - completion
            rows.append(row)
    failures = outcome["failures"]
    return {
        "rows": rows,
        "wall_s": outcome["wall_s"],
        "loop_cpu_s": outcome["loop_cpu_s"],
        "sim_cpu_s": sim_cpu,
        "unattributed": unattributed,
        "failed": len(failures),
        "first_error": f"{type(failures[0]).__name__}: {failures[0]}"[:500] if failures else None,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool an arm's rounds."""
    rows = [row for run in runs for row in run["rows"]]
    turns = len(rows)

    def stats(values: list[float]) -> dict[str, float]:
        mean = 1000 * statistics.fmean(values) if values else float("nan")
        return {"p50": percentile_ms(values, 50), "p99": percentile_ms(values, 99), "mean": mean}

    summary: dict[str, Any] = {
        "turns": turns,
        "overhead_ms": stats([r["overhead"] for r in rows]),
        "overhead_after_first_ms": stats([r["overhead"] for r in rows if r["turn"] > 0]),
        "backend_ms": stats([r["backend"] for r in rows]),
        "loop_cpu_ms_per_turn": 1000 * sum(run["loop_cpu_s"] for run in runs) / max(turns, 1),
        "sim_cpu_ms_per_turn": 1000 * sum(run["sim_cpu_s"] for run in runs) / max(turns, 1),
        "wall_s": [round(run["wall_s"], 1) for run in runs],
        "unattributed_requests": sum(run["unattributed"] for run in runs),
        "failed": sum(run["failed"] for run in runs),
        "first_error": next((run["first_error"] for run in runs if run["first_error"]), None),
    }
    if rows and "in_completion" in rows[0]:
        summary["in_completion_ms"] = stats([r["in_completion"] for r in rows])
        summary["outside_completion_ms"] = stats([r["overhead"] - r["in_completion"] for r in rows])
    return summary


# report ------------------------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    plan = report["plan"]
    print(
        f"\nAgent loop, {plan['trajectories']} trajectories x {plan['turns']} turns of {plan['tokens_per_turn']} "
        f"tokens, tool {plan['tool_s_mean']:.2f} s mean (simulator at time scale {report['config']['time_scale']})"
    )
    header = f"  {'arm':<12} {'turns':>6} {'overhead p50':>13} {'p99':>8} {'mean':>8} {'turns 2.. p50':>14}"
    print(header + f" {'backend p50':>12} {'loop CPU/turn':>14} {'sim CPU/turn':>13}  wall s")
    for name, a in report["arms"].items():
        o, o2 = a["overhead_ms"], a["overhead_after_first_ms"]
        print(
            f"  {name:<12} {a['turns']:>6} {o['p50']:>10.2f} ms {o['p99']:>8.2f} {o['mean']:>8.2f} {o2['p50']:>11.2f} ms"
            f" {a['backend_ms']['p50']:>9.2f} ms {a['loop_cpu_ms_per_turn']:>11.2f} ms {a['sim_cpu_ms_per_turn']:>10.2f} ms"
            f"  {a['wall_s']}"
        )
        if "in_completion_ms" in a:
            i, out = a["in_completion_ms"], a["outside_completion_ms"]
            print(
                f"  {'':<10} of which inside the completion call (llm_s - simulator): p50 {i['p50']:.2f} ms, "
                f"p99 {i['p99']:.2f} ms; outside it: p50 {out['p50']:.2f} ms, p99 {out['p99']:.2f} ms"
            )
        if a["failed"] or a["unattributed_requests"]:
            print(f"  {'':<10} failed {a['failed']}, unattributed requests {a['unattributed_requests']}")
        if a["first_error"]:
            print(f"  {'':<10} first error: {a['first_error']}")


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    arms = report["arms"]
    base = arms.get("baseline")
    rows = []
    for arm, suffix, how in (
        ("server", "", "/tokenize per turn"),
        ("server_local", "_local", "tokenized in the server"),
    ):
        if arm not in arms:
            continue
        s = arms[arm]
        if base is not None:
            rows.append(
                check(
                    f"agent loop ({how}) overhead per turn added over a minimal client, "
                    f"{report['plan']['trajectories']} trajectories, p50 (p99)",
                    f"{report[f'added{suffix}_p50_ms']:.2f} ms ({report[f'added{suffix}_p99_ms']:.2f} ms)",
                    f"minimal client {base['overhead_ms']['p50']:.2f} ms p50",
                    "<= 1 ms p50",
                    report[f"added{suffix}_p50_ms"] <= 1.0,
                )
            )
        rows.append(
            check(
                f"server's own time per turn ({how}: wall - backend - tool), p50 (p99)",
                f"{s['overhead_ms']['p50']:.2f} ms ({s['overhead_ms']['p99']:.2f} ms)",
                f"backend {s['backend_ms']['p50']:.2f} ms p50",
                "-",
                None,
            )
        )
        rows.append(
            check(
                f"server CPU per turn ({how})",
                f"{s['loop_cpu_ms_per_turn']:.2f} ms",
                f"minimal client {base['loop_cpu_ms_per_turn']:.2f} ms" if base else "-",
                "-",
                None,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--trajectories", type=positive_int, default=256, help="trajectories at once")
    parser.add_argument("--turns", type=positive_int, default=6, help="turns per trajectory")
    parser.add_argument("--tokens", type=positive_int, default=32, help="output tokens per turn")
    parser.add_argument("--tool-s", type=float, default=2.0, help="median tool time per turn, wall seconds")
    parser.add_argument("--observation-chars", type=positive_int, default=200, help="median observation length")
    parser.add_argument("--time-scale", type=float, default=20.0, help="the simulator's simulated s per wall s")
    parser.add_argument("--rounds", type=positive_int, default=2, help="runs of each arm (ABBA order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--arms", default="baseline,server,server_local", help="arms to run (baseline, server, server_local)"
    )
    parser.add_argument("--sim-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sim-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sim-tokenizer-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sim_child:
        return simulator_child(args)
    children_run_this_checkout()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    plans = draw_plans(args)
    tool = [t for p in plans for t in p["tool_s"]]
    report["plan"] = {
        "trajectories": len(plans),
        "turns": args.turns,
        "tokens_per_turn": args.tokens,
        "tool_s_mean": statistics.fmean(tool),
    }
    order = []
    for r in range(args.rounds):
        order += arms if r % 2 == 0 else arms[::-1]
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-agent-loop-") as tmp:
        for i, name in enumerate(order):
            logs = Path(tmp) / f"{i}-{name}"
            logs.mkdir()
            print(f"round {i // len(arms) + 1}: {name} ...", flush=True)
            try:
                runs[name].append(run_arm(name, plans, args, logs))
            except Exception as exc:  # an arm that cannot run at all
                failures[name] = f"{type(exc).__name__}: {exc}"
    report["arms"] = {name: summarize(r) for name, r in runs.items() if r}
    for arm, suffix in (("server", ""), ("server_local", "_local")):
        if arm in report["arms"] and "baseline" in report["arms"]:
            s, b = report["arms"][arm]["overhead_ms"], report["arms"]["baseline"]["overhead_ms"]
            report[f"added{suffix}_p50_ms"] = s["p50"] - b["p50"]
            report[f"added{suffix}_p99_ms"] = s["p99"] - b["p99"]
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    print_report(report)
    print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
