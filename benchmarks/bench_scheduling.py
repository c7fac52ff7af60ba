"""Benchmark: trajectory-aware scheduling and placement against FCFS + min-heap, on simulated vLLM backends.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_scheduling.py [--json out.json] [--workloads coding,search,math]
        [--configs fcfs,progressive] [--backends 4] [--max-num-seqs 16] [--prompts 24] [--samples 4] [--seed 0]
        [--time-scale 10]

About 3.5 minutes on 2 cores with the defaults. Workloads shaped like Heddle's coding, search and math agents
(section 7): per trajectory, a number of turns and per-turn output tokens drawn lognormal with heavy tails
(a lasting per-prompt scale times a per-sample draw, so the samples of one prompt resemble each other and a
predictor can learn per prompt), tool time between turns of about 0.5 s (coding), 1.4 s (search) and
0.05 s (math) (Heddle's table 1), a tool result appended as observation tokens after each turn (so the
context grows: multi-turn prefix reuse). The plans are drawn from `--seed` and are the same for every
configuration. Times are simulated seconds: the simulators run `--time-scale` simulated seconds per wall
second, the handler (scheduling_handler.py) sleeps tool time / `--time-scale`, and every time below is
wall seconds x `--time-scale` (so the server's and the client's own overhead per turn, a few ms of wall
time, counts `--time-scale` times over: a lower scale is more faithful and slower). On 2 busy cores the
server's overhead dominated at 25 (the baseline's coding makespan read 208-231 s at 25 against 116-121 s at
5 for the same plans with 256 trajectories), hence the default 10; use 5 for figures to quote.

Each configuration gets a fresh prorl-server (in this process, as the handler file's three data sources)
over `--backends` fresh simulators (SimLLMServer, `--max-num-seqs` each, the default latency profile and
prefix cache, seeds 0..B-1), served by a child process (this script with `--simulators-child`) so that their
steps do not wait for the GIL of the server and the client. It runs the workload's
prompts twice in the same server: a warm-up epoch (so the length predictor learns each prompt) and the
measured epoch, every trajectory submitted at once. Configurations (`--dispatch-policy` + `--placement`):

- `fcfs+min_heap`: the baseline (ProRL's placement, no admission gate: the backends' own FCFS queues);
- `round_robin+least_loaded`: the step-centric least-load baseline, when the `least_loaded` placement exists;
- `progressive+presorted_dp` (trajectory-aware: Heddle's progressive priority and presorted-DP placement with
  migration) when the `presorted_dp` placement exists, else `progressive+sticky_least_loaded`, labelled so;
- `srpt+<the same placement>` for reference.
All but the baseline run with `--max-inflight-per-backend` = `--max-num-seqs` and `--vllm-priority`.
A placement the server does not offer (read from `ServerSettings.model_fields["placement"]` at run time) is
skipped, and the output says so. `--configs fcfs,progressive` (dispatch policies or labels) runs only those.

Figures per workload and configuration (measured epoch): makespan (from the first submit to the end of the
last trajectory, i.e. the latest acceptance + `timing.total_s`, which leaves out the result polling), output
tokens per simulated second, the longest trajectory's time (the one with the largest time alone), its
admission-gate queueing (sum of its turns' `queue_s`; the backends' own queues are not in the result, so
also its delay over running alone = its RUN time - its time alone: queueing plus interference), the
prefix-cache hit rate (`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` of all simulators'
/metrics over the epoch, in tokens; observation tokens and the last partial block of each turn are new by
construction), and a lower bound of the makespan from the plan and the profile::

    alone(t)   = sum over t's turns of tokens x I(1) + sum of its tool times (prefill left out, >= 0)
    capacity   = backends x max over n <= max_num_seqs of n / I(n)   (tokens per second at the best batch)
    lower bound = max(max over t of alone(t), total output tokens / capacity)

where I(n) is the profile's seconds per decode step at batch size n (a turn of k tokens takes k steps). No
policy can beat the baseline by more than its makespan / lower bound, which the summary prints beside it.
Targets (issue 12, checks, not assertions): trajectory-aware makespan >= 2x better than fcfs+min_heap on the
coding workload, within 1.15x of the lower bound, prefix-cache hit rate >= 95% on the multi-turn workloads.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "placements_available": [placement names the server offers],
      "skipped": {configuration: why},
      "workloads": {
        "coding" | "search" | "math": {
          "plan": {"trajectories", "turns_total", "output_tokens", "longest_alone_s", "capacity_tok_s",
                   "work_bound_s", "lower_bound_s"},
          "configs": {
            label: {"dispatch_policy", "placement", "max_inflight_per_backend", "vllm_priority",
                    "warmup_makespan_s", "makespan_s", "throughput_tok_s", "completed", "failed",
                    "longest_run_s", "longest_gate_queue_s", "longest_delay_s", "gate_queue_s_total",
                    "last_trajectory": {"sample", "turns", "alone_s", "total_s", "job_queue_s", "llm_s",
                                        "gate_queue_s", "tool_s"} (the one that ended last; its timing),
                    "cache_hit_rate", "preemptions", "migrations" (jobs moved between backends in the measured epoch),
                    "vs_lower_bound" (makespan / lower_bound_s)}
          },
          "baseline": label, "trajectory_aware": label, "speedup": baseline makespan / trajectory-aware makespan
        }
      },
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from _report import check, finish, positive_int, print_checks, report_header

from prorl_server.api import ServerState, create_app
from prorl_server.client import RolloutClient
from prorl_server.config import ServerSettings
from prorl_server.simllm import SimLLMServer
from prorl_server.simllm.config import SimLLMSettings
from prorl_server.testing import UvicornThread

HANDLER_FILE = Path(__file__).resolve().parent / "scheduling_handler.py"


@dataclass(frozen=True)
class Shape:
    """A workload's distributions (simulated seconds, tokens; the simulator: one token per character)."""

    turns_median: float
    turns_sigma: float
    turns_max: int
    tokens_median: float
    tokens_sigma: float
    tokens_max: int
    tool_s: float
    observation_chars: int
    prompt_chars: int


# medians and tails shaped after Heddle's coding, search and math agents; tool times from its table 1
WORKLOADS = {
    "coding": Shape(5, 0.6, 24, 60, 1.0, 1200, 0.5, 60, 300),
    "search": Shape(4, 0.5, 16, 40, 0.8, 600, 1.4, 200, 200),
    "math": Shape(3, 0.5, 12, 100, 1.0, 1600, 0.05, 20, 150),
}

CACHE_RE = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total|vllm:num_preemptions_total)\{[^}]*\}\s+(\S+)$")


def draw_plans(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The seeded plans of a workload: `--prompts` prompts x `--samples` samples, each an instance."""
    shape = WORKLOADS[name]
    plans = []
    for p in range(args.prompts):
        rng = random.Random(f"{args.seed}:{name}:{p}")
        turn_scale = rng.lognormvariate(0, shape.turns_sigma)  # lasting per prompt: the predictor's signal
        token_scale = rng.lognormvariate(0, shape.tokens_sigma)
        prompt = f"{name} task {p}: " + "p" * shape.prompt_chars
        for s in range(args.samples):
            turns = rng.lognormvariate(math.log(shape.turns_median * turn_scale), shape.turns_sigma / 2)
            turns = max(1, min(shape.turns_max, round(turns)))
            mu = math.log(shape.tokens_median * token_scale)
            tokens = [
                max(1, min(shape.tokens_max, round(rng.lognormvariate(mu, shape.tokens_sigma / 2))))
                for _ in range(turns)
            ]
            tool_s = [rng.lognormvariate(math.log(shape.tool_s), 0.5) for _ in range(turns - 1)]
            observations = [
                max(1, round(rng.lognormvariate(math.log(shape.observation_chars), 0.5))) for _ in range(turns - 1)
            ]
            plans.append(
                {
                    "data_source": name,
                    "prompt": prompt,
                    "tokens": tokens,
                    "tool_s": tool_s,
                    "observations": observations,
                    "time_scale": args.time_scale,
                    "sample": f"{p}:{s}",
                }
            )
    return plans


def profile_settings(args: argparse.Namespace) -> SimLLMSettings:
    return SimLLMSettings(port=0, time_scale=args.time_scale, max_num_seqs=args.max_num_seqs)


def plan_bounds(plans: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The lower bound of the makespan (module docstring) and the plan's totals."""
    profile = profile_settings(args).profile
    step1 = profile.seconds_per_token(1)
    alone = [sum(p["tokens"]) * step1 + sum(p["tool_s"]) for p in plans]
    best = max(n / profile.seconds_per_token(n) for n in range(1, args.max_num_seqs + 1))
    capacity = args.backends * best
    tokens = sum(sum(p["tokens"]) for p in plans)
    return {
        "trajectories": len(plans),
        "turns_total": sum(len(p["tokens"]) for p in plans),
        "output_tokens": tokens,
        "longest_alone_s": max(alone),
        "longest_index": alone.index(max(alone)),
        "capacity_tok_s": capacity,
        "work_bound_s": tokens / capacity,
        "lower_bound_s": max(max(alone), tokens / capacity),
        "alone_s": alone,
    }


def configurations(available: tuple[str, ...], args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The configurations to run and the ones skipped (with why)."""
    gate = {"max_inflight_per_backend": args.max_num_seqs, "vllm_priority": True}
    configs = [{"label": "fcfs+min_heap", "dispatch_policy": "fcfs", "placement": "min_heap"}]
    skipped = {}
    if "least_loaded" in available:
        configs.append(
            {"label": "round_robin+least_loaded", "dispatch_policy": "round_robin", "placement": "least_loaded", **gate}
        )
    else:
        skipped["round_robin+least_loaded"] = "the server has no `least_loaded` placement"
    aware = "presorted_dp" if "presorted_dp" in available else "sticky_least_loaded"
    if aware != "presorted_dp":
        skipped["progressive+presorted_dp"] = (
            "the server has no `presorted_dp` placement: progressive+sticky_least_loaded instead"
        )
    configs.append(
        {"label": f"progressive+{aware}", "dispatch_policy": "progressive", "placement": aware, "aware": True, **gate}
    )
    configs.append({"label": f"srpt+{aware}", "dispatch_policy": "srpt", "placement": aware, **gate})
    wanted = set(args.configs.split(",")) if args.configs else None
    if wanted is not None:
        for c in configs:
            if c["label"].split("+")[0] not in wanted and c["label"] not in wanted:
                skipped[c["label"]] = "left out by --configs"
        configs = [c for c in configs if c["label"].split("+")[0] in wanted or c["label"] in wanted]
    return configs, skipped


def scrape(sims: list[str]) -> dict[str, float]:
    """Sum of the simulators' prefix-cache hits, queries and preemptions (their /metrics)."""
    totals = {
        "vllm:prefix_cache_hits_total": 0.0,
        "vllm:prefix_cache_queries_total": 0.0,
        "vllm:num_preemptions_total": 0.0,
    }
    for url in sims:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            for line in answer.read().decode().splitlines():
                match = CACHE_RE.match(line)
                if match:
                    totals[match.group(1)] += float(match.group(2))
    return totals


async def migrations(client: RolloutClient) -> int:
    """Trajectories moved between backends so far (GET /llm_servers)."""
    return sum(server.migrations for server in (await client.backends.list()).servers)


async def run_epoch(client: RolloutClient, plans: list[dict[str, Any]], tag: str) -> tuple[float, list[Any]]:
    """Submit every trajectory at once; wall seconds from the first submit to the end of the last trajectory
    (its acceptance plus its `timing.total_s`: free of the result polling's lag), and the results in plan order."""
    requests = [{"instance": plan, "job_id": f"{tag}-{plan['sample'].replace(':', '-')}"} for plan in plans]
    accepted: dict[str, float] = {}

    async def submit(request: dict[str, Any]) -> str:
        job_id = await client.jobs.submit(request)
        accepted[job_id] = time.monotonic()
        return job_id

    started = time.monotonic()
    ids = await asyncio.gather(*(submit(request) for request in requests))
    by_id = {}
    async for result in client.jobs.as_completed(ids, ack=True, timeout=600, wait=1.0):
        by_id[result.job_id] = result
    if len(by_id) < len(ids):
        raise TimeoutError(f"{len(ids) - len(by_id)} of {len(ids)} trajectories had no result after 600 s")
    end = max(accepted[job_id] + by_id[job_id].timing.total_s for job_id in ids)
    return end - started, [by_id[job_id] for job_id in ids]


async def measure_config(
    url: str,
    sims: list[str],
    plans: list[dict[str, Any]],
    bounds: dict[str, Any],
    config: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    scale = args.time_scale
    async with RolloutClient(url, trust_env=False, timeout=60) as client:
        warm_wall, _ = await run_epoch(client, plans, f"{config['dispatch_policy']}-warm")
        before, moved_before = scrape(sims), await migrations(client)
        wall, results = await run_epoch(client, plans, f"{config['dispatch_policy']}-measured")
        after, moved_after = scrape(sims), await migrations(client)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    makespan = wall * scale
    completed = [r for r in results if r.status.value == "completed"]
    tokens = sum(len(t.output_ids) for r in completed for t in r.trajectory.turns)
    longest = results[bounds["longest_index"]]
    last = max(range(len(results)), key=lambda i: results[i].timing.total_s)
    t = results[last].timing
    return {
        "dispatch_policy": config["dispatch_policy"],
        "placement": config["placement"],
        "max_inflight_per_backend": config.get("max_inflight_per_backend"),
        "vllm_priority": config.get("vllm_priority", False),
        "warmup_makespan_s": warm_wall * scale,
        "makespan_s": makespan,
        "throughput_tok_s": tokens / makespan,
        "completed": len(completed),
        "failed": len(results) - len(completed),
        "longest_run_s": longest.timing.run_s * scale,
        "longest_gate_queue_s": sum(t.queue_s for t in longest.trajectory.turns) * scale,
        "longest_delay_s": longest.timing.run_s * scale - bounds["longest_alone_s"],
        "gate_queue_s_total": sum(r.timing.llm_queue_s for r in results) * scale,
        "last_trajectory": {
            "sample": plans[last]["sample"],
            "turns": t.turns,
            "alone_s": bounds["alone_s"][last],
            "total_s": t.total_s * scale,
            "job_queue_s": t.queue_s * scale,
            "llm_s": t.llm_s * scale,
            "gate_queue_s": t.llm_queue_s * scale,
            "tool_s": t.tool_s * scale,
        },
        "cache_hit_rate": hits / queries if queries else None,
        "preemptions": after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"],
        "migrations": moved_after - moved_before,
        "vs_lower_bound": makespan / bounds["lower_bound_s"],
    }


def serve_simulators(args: argparse.Namespace) -> int:
    """`--simulators-child`: serve `--backends` simulators (seeds 0..B-1), print their base URLs as one JSON
    line, and stop when standard input closes (the benchmark's end of the pipe)."""
    with ExitStack() as stack:
        sims = [
            stack.enter_context(SimLLMServer(time_scale=args.time_scale, max_num_seqs=args.max_num_seqs, seed=b))
            for b in range(args.backends)
        ]
        print(json.dumps([sim.url for sim in sims]), flush=True)
        sys.stdin.read()
    return 0


@contextmanager
def simulators(args: argparse.Namespace) -> Iterator[list[str]]:
    """Fresh simulators in a child process (their own interpreter, so their steps do not wait for the GIL of
    the server and the client); yields their base URLs."""
    command = [sys.executable, str(Path(__file__).resolve()), "--simulators-child"]
    command += ["--backends", str(args.backends), "--max-num-seqs", str(args.max_num_seqs)]
    command += ["--time-scale", str(args.time_scale)]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"the simulators did not start (exit code {child.wait()})")
        yield json.loads(line)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_config(
    workload: str, plans: list[dict[str, Any]], bounds: dict[str, Any], config: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """A fresh prorl-server (in this process) over fresh simulators for one configuration."""
    with simulators(args) as urls:
        settings = ServerSettings(
            llm_servers=[f"{url}/v1" for url in urls],
            handlers=[f"{name}={HANDLER_FILE}:SchedulingHandler" for name in WORKLOADS],
            entry_point_handlers=False,
            runtime="local",
            init_workers=16,
            run_workers=len(plans),
            eval_workers=16,
            health_check_interval_s=1.0,
            log_level="warning",
            placement=config["placement"],
            dispatch_policy=config["dispatch_policy"],
            max_inflight_per_backend=config.get("max_inflight_per_backend"),
            vllm_priority=config.get("vllm_priority", False),
        )
        server = UvicornThread(create_app(state=ServerState.build(settings))).start()
        try:
            return asyncio.run(measure_config(server.url, urls, plans, bounds, config, args))
        finally:
            server.stop()


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_workload(name: str, entry: dict[str, Any]) -> None:
    plan, configs = entry["plan"], entry["configs"]
    base = configs.get(entry["baseline"])
    print(
        f"\n{name}: {plan['trajectories']} trajectories, {plan['turns_total']} turns, {plan['output_tokens']} output tokens; "
        f"lower bound {plan['lower_bound_s']:.1f} s = max(longest alone {plan['longest_alone_s']:.1f} s, "
        f"work / capacity {plan['work_bound_s']:.1f} s)"
    )
    rows = [
        ("makespan (sim s)", "makespan_s", 1),
        ("  x baseline (lower is better)", None, 2),
        ("  x lower bound", "vs_lower_bound", 2),
        ("throughput (output tok / sim s)", "throughput_tok_s", 0),
        ("longest trajectory: run (sim s)", "longest_run_s", 1),
        ("  its gate queueing (sim s)", "longest_gate_queue_s", 1),
        ("  its delay over alone (sim s)", "longest_delay_s", 1),
        ("prefix-cache hit rate", "cache_hit_rate", 3),
        ("preemptions", "preemptions", 0),
        ("migrations", "migrations", 0),
        ("warm-up epoch makespan (sim s)", "warmup_makespan_s", 1),
        ("completed / failed", None, 0),
    ]
    labels = list(configs)
    width = max(len(r[0]) for r in rows)
    widths = [max(len(label), 12) for label in labels]
    print(
        "  " + "figure".ljust(width) + "  " + "  ".join(label.ljust(w) for label, w in zip(labels, widths, strict=True))
    )
    for title, key, digits in rows:
        cells = []
        for label in labels:
            c = configs[label]
            if title.startswith("  x baseline"):
                cells.append(f"{c['makespan_s'] / base['makespan_s']:.2f}" if base else "n/a")
            elif key is None:
                cells.append(f"{c['completed']} / {c['failed']}")
            else:
                cells.append(fmt(c[key], digits))
        print(
            "  " + title.ljust(width) + "  " + "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True))
        )


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, entry in report["workloads"].items():
        aware = entry["configs"].get(entry["trajectory_aware"])
        base = entry["configs"].get(entry["baseline"])
        if not aware:
            continue
        if base:
            speedup = base["makespan_s"] / aware["makespan_s"]
            entry["speedup"] = speedup
            rows.append(
                check(
                    f"{name}: makespan, {entry['trajectory_aware']}",
                    f"{aware['makespan_s']:.1f} s ({speedup:.2f}x)",
                    f"{entry['baseline']} {base['makespan_s']:.1f} s (at most {base['vs_lower_bound']:.2f}x possible)",
                    ">= 2x better" if name == "coding" else "",
                    speedup >= 2 if name == "coding" else None,
                )
            )
        rows.append(
            check(
                f"{name}: makespan / lower bound",
                f"{aware['vs_lower_bound']:.2f}",
                f"{entry['baseline']} {base['vs_lower_bound']:.2f}" if base else "",
                "<= 1.15",
                aware["vs_lower_bound"] <= 1.15,
            )
        )
        hit = aware["cache_hit_rate"]
        rows.append(
            check(
                f"{name}: prefix-cache hit rate",
                fmt(hit, 3),
                f"{entry['baseline']} {fmt(base['cache_hit_rate'], 3)}" if base else "",
                ">= 0.95",
                hit is not None and hit >= 0.95,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: coding,search,math")
    parser.add_argument("--configs", default="", help="only these dispatch policies or labels (comma-separated)")
    parser.add_argument("--backends", type=positive_int, default=4, help="simulated backends")
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=16,
        help="each simulator's batch limit (the default 4 x 16 slots < 96 trajectories: calls queue)",
    )
    parser.add_argument("--prompts", type=positive_int, default=24, help="prompts per workload")
    parser.add_argument("--samples", type=positive_int, default=4, help="trajectories (samples) per prompt")
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--simulators-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.simulators_child:
        return serve_simulators(args)
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        parser.error(f"--workloads: choose among {', '.join(WORKLOADS)}")
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    available = get_args(ServerSettings.model_fields["placement"].annotation)
    configs, skipped = configurations(available, args)
    report["placements_available"] = list(available)
    report["skipped"] = skipped
    for label, why in skipped.items():
        print(f"skipped {label}: {why}")
    failures: dict[str, str] = {}
    report["workloads"] = {}
    for name in workloads:
        plans = draw_plans(name, args)
        bounds = plan_bounds(plans, args)
        entry: dict[str, Any] = {
            "plan": {k: v for k, v in bounds.items() if k not in ("alone_s", "longest_index")},
            "configs": {},
            "baseline": "fcfs+min_heap",
            "trajectory_aware": next((c["label"] for c in configs if c.get("aware")), None),
        }
        report["workloads"][name] = entry
        for config in configs:
            t0 = time.monotonic()
            try:
                entry["configs"][config["label"]] = run_config(name, plans, bounds, config, args)
            except Exception as exc:  # a part that cannot run at all
                failures[f"{name}/{config['label']}"] = f"{type(exc).__name__}: {exc}"
                continue
            c = entry["configs"][config["label"]]
            print(
                f"  {name} {config['label']}: makespan {c['makespan_s']:.1f} sim s, hit rate {fmt(c['cache_hit_rate'], 3)} "
                f"({time.monotonic() - t0:.1f} s wall)",
                flush=True,
            )
    for name, entry in report["workloads"].items():
        if entry["configs"]:
            print_workload(name, entry)
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
