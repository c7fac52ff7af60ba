"""Benchmark: the harness presets (docs/harnesses.md), each the real program run unmodified on one task.

Run it from the repository root, as a user bubblewrap runs for (root here)::

    .venv/bin/python benchmarks/bench_harnesses.py [--json out.json] [--tasks 3] [--harnesses a,b]

About 1.5 minutes on 2 cores with the defaults, once the presets are installed (`bash
scripts/setup-harnesses.sh`: a preset not installed yet is installed first, which takes 10 s to 2 minutes
and is part of its figures below). One prorl-server and one scripted test double (a scripted LLM that
answers at once; context 200,000 tokens of its one-character tokenizer) run in this process; each task is an
`external_agent` job with `"harness": NAME` under bubblewrap without network, whose gateway session the
double answers with the replies of benchmarks/harness_tasks.py: write 42 to answer.txt with the harness's
own tool, check it, finish the harness's way. `--tasks` jobs per harness, one at a time.

Per harness:
- `calls_per_task`: the gateway calls of a task (its session's `calls`, side calls included);
- `gateway_ms_per_call`: the mean of the server's `prorl_gateway_call_duration_seconds` for the harness's
  API (a call from its request read to its completion recorded); `backend_ms_per_call`: the mean of
  `prorl_llm_request_duration_seconds` (the double's answer to the completion request, the baseline: the
  backend alone); `added_ms_per_call` = the difference: what the gateway adds to a call (its tokenization
  at the backend's `/tokenize`, the chat template, tool-call parsing and the recording);
- `agreement`: the fraction of sampled tokens recorded exactly (each turn's `output_ids` the ids the double
  sent for its reply, and the segment's `response_ids` under mask 1 those ids in order); must be 1.0;
- `task_s`: a task's wall seconds (submit to result: sandbox, harness start, calls, EVAL);
- `install_mb`, `install_s`: the install's size on disk and the seconds it took, as its install recorded.

Keys of `--json`: `machine`, `config`, `harnesses` (per harness the figures above, with `tasks`, `rewards`),
`checks` (the summary rows), `elapsed_s`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from _report import check, finish, positive_int, print_checks, report_header
from harness_tasks import SCORE, TASK, TASKS
from prometheus_client.parser import text_string_to_metric_families
from prorl_handlers.external_agent import ExternalAgentHandler
from prorl_handlers.harnesses import HARNESSES, HarnessInstallError, install, install_record

from prorl_server.api import ServerState, create_app
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerRegistry
from prorl_server.protocol import TERMINAL_STATUSES
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedBackend, ToyChatTokenizer, UvicornThread, create_scripted_backend_app

CONTEXT = 200_000
RESULT_TIMEOUT_S = 180.0


def metric_sums(server_url: str) -> dict[tuple[str, str], float]:
    """(sample name, its api or backend label) -> value of the gateway and LLM duration histograms."""
    text = httpx.get(f"{server_url}/metrics", timeout=30, trust_env=False).text
    sums: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("prorl_gateway_call_duration_seconds", "prorl_llm_request_duration_seconds")):
                label = sample.labels.get("api") or sample.labels.get("backend") or ""
                sums[(sample.name, label)] = sums.get((sample.name, label), 0.0) + sample.value
    return sums


def run_task(http: httpx.Client, double: ScriptedBackend, name: str, job_id: str) -> tuple[dict[str, Any], float]:
    """One task of harness `name`: its replies queued (for the job, or with side calls, in order of arrival on
    the double's queue), the job run; (its result, wall seconds)."""
    task = TASKS[name]
    if task.side_replies:
        for prompt, reply in task.side_replies:
            double.push(reply, prompt=prompt)
        double.push(*task.replies)
    else:
        double.push(*task.replies, job=job_id)
    instance = {
        "data_source": "external_agent",
        "harness": name,
        "task": TASK,
        "max_turns": 10,
        "time_budget_s": 120,
        "collect": ["answer.txt"],
        "score": SCORE,
    }
    started = time.monotonic()
    answer = http.post("/jobs", json={"job_id": job_id, "instance": instance})
    answer.raise_for_status()
    deadline = started + RESULT_TIMEOUT_S
    while time.monotonic() < deadline:
        job = http.get(f"/jobs/{job_id}").json()
        if job["status"] in TERMINAL_STATUSES:
            return job["result"], time.monotonic() - started
        time.sleep(0.2)
    raise TimeoutError(f"{name}: no result within {RESULT_TIMEOUT_S:g}s")


def agreement(result: dict[str, Any], replies: tuple[str, ...]) -> tuple[int, int]:
    """(sampled tokens recorded exactly, sampled tokens) over the result's recorded chains."""
    toy = ToyChatTokenizer()
    sent = [[*toy.encode(reply), toy.eos_id] for reply in replies]
    exact = total = 0
    for recording in result["artifacts"].get("gateway", []):
        for segment in recording["segments"]:
            masked = [i for i, m in zip(segment["response_ids"], segment["response_mask"], strict=True) if m]
            turns = [turn["output_ids"] for turn in segment["turns"]]
            in_order = masked == [i for ids in turns for i in ids]
            for ids in turns:
                total += len(ids)
                exact += len(ids) if in_order and ids in sent else 0
    return exact, total


def bench_harness(server_url: str, http: httpx.Client, double: ScriptedBackend, name: str, tasks: int) -> dict:
    """`tasks` tasks of harness `name`, one at a time; its figures."""
    harness = HARNESSES[name]
    install(harness, log=lambda line: print(f"  {line}", flush=True))
    record = install_record(harness) or {}
    api = harness.dialect  # the gateway's label of the API it speaks
    before = metric_sums(server_url)
    walls, rewards, calls, exact, sampled = [], [], [], 0, 0
    for index in range(tasks):
        result, wall = run_task(http, double, name, f"{name}-{index}")
        walls.append(wall)
        rewards.append(result.get("reward"))
        calls.append(sum(r["calls"] for r in result["artifacts"].get("gateway", [])))
        good, total = agreement(result, (*TASKS[name].replies, *(r for _, r in TASKS[name].side_replies)))
        exact, sampled = exact + good, sampled + total
    after = metric_sums(server_url)

    def delta(sample: str, label: str | None = None) -> float:
        keys = {k for k in after if k[0] == sample and (label is None or k[1] == label)}
        return sum(after[k] - before.get(k, 0.0) for k in keys)

    gateway_n = delta("prorl_gateway_call_duration_seconds_count", api)
    backend_n = delta("prorl_llm_request_duration_seconds_count")
    gateway_ms = 1000 * delta("prorl_gateway_call_duration_seconds_sum", api) / gateway_n if gateway_n else None
    backend_ms = 1000 * delta("prorl_llm_request_duration_seconds_sum") / backend_n if backend_n else None
    return {
        "package": harness.package.spec,
        "dialect": harness.dialect,
        "tasks": tasks,
        "rewards": rewards,
        "calls_per_task": statistics.mean(calls),
        "gateway_ms_per_call": gateway_ms,
        "backend_ms_per_call": backend_ms,
        "added_ms_per_call": None if gateway_ms is None or backend_ms is None else gateway_ms - backend_ms,
        "agreement": exact / sampled if sampled else None,
        "task_s": statistics.median(walls),
        "install_mb": record.get("mb"),
        "install_s": record.get("seconds"),
    }


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    """One line per harness."""

    def cell(value: Any, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    print(
        f"\n{'harness':16}{'dialect':11}{'calls':>6}{'gw ms':>8}{'backend':>9}{'added':>8}{'agree':>7}"
        f"{'task s':>8}{'MB':>7}{'inst s':>8}  reward"
    )
    for name, row in rows.items():
        print(
            f"{name:16}{row['dialect']:11}{cell(row['calls_per_task']):>6}{cell(row['gateway_ms_per_call']):>8}"
            f"{cell(row['backend_ms_per_call']):>9}{cell(row['added_ms_per_call']):>8}"
            f"{cell(row['agreement'], 3):>7}{cell(row['task_s']):>8}{cell(row['install_mb'], 0):>7}"
            f"{cell(row['install_s'], 0):>8}  {row['rewards']}"
        )


def build_checks(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary rows: agreement 100% and the reward 1.0 per harness; the added milliseconds as figures."""
    checks = []
    for name, row in rows.items():
        agree = row["agreement"]
        checks.append(check(f"{name}: tokens recorded exactly", agree, "-", "1.0", agree == 1.0))
        checks.append(
            check(f"{name}: task solved", row["rewards"], "-", "all 1.0", all(r == 1.0 for r in row["rewards"]))
        )
        added = row["added_ms_per_call"]
        baseline = row["backend_ms_per_call"]
        checks.append(
            check(
                f"{name}: gateway ms added per call",
                None if added is None else round(added, 1),
                f"backend alone {baseline:.1f} ms" if baseline is not None else "-",
                "-",
                None,
            )
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--tasks", type=positive_int, default=3, help="tasks per harness")
    parser.add_argument("--harnesses", default=",".join(TASKS), help="comma-separated presets (default: all)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.harnesses.split(",") if n.strip()]
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        parser.error(f"--harnesses: no task for {', '.join(unknown)} (known: {', '.join(TASKS)})")
    problem = unavailable_reason("bwrap")
    if problem:
        print(f"bench_harnesses: bubblewrap: {problem}")
        return 1
    began = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    double = ScriptedBackend(default_reply=None, max_model_len=CONTEXT)
    registry = HandlerRegistry()
    registry.register("external_agent", ExternalAgentHandler())
    with UvicornThread(create_scripted_backend_app(double)) as backend:
        settings = ServerSettings(llm_servers=[f"{backend.url}/v1"], runtime="bwrap", health_check_interval_s=0.5)
        state = ServerState.build(settings, registry=registry)
        with UvicornThread(create_app(state=state)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            state.gateway.public_url = server.url  # the bridge's way to the gateway: this server's free port
            report["harnesses"] = {}
            for name in names:
                print(f"{name}: {args.tasks} task(s) ...", flush=True)
                try:
                    report["harnesses"][name] = bench_harness(server.url, http, double, name, args.tasks)
                except (HarnessInstallError, TimeoutError, httpx.HTTPError, KeyError) as exc:
                    failures[name] = f"{type(exc).__name__}: {exc}"
    print_table(report["harnesses"])
    report["checks"] = build_checks(report["harnesses"])
    print_checks(report["checks"])
    report["elapsed_s"] = time.monotonic() - began
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())
