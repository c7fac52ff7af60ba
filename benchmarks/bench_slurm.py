"""Benchmark: start-up and teardown of the Slurm deployment (deploy/slurm/) on a real single-node Slurm cluster,
next to the same processes started directly on the machine.

Run it from the repository root, as root, with Slurm installed (`bash scripts/setup-slurm.sh install`)::

    .venv/bin/python benchmarks/bench_slurm.py [--json out.json] [--repeats 3]

About 1.5 minutes on a 2-core machine with the defaults. Other work on the machine skews the figures: the
1-minute load average at start is kept.

What runs, `--repeats` times each, taking turns:
    slurm     `deploy/slurm/launch.sh` (WAIT=0) with two rollout servers and two dev-engine backends on the one
              node (prorl_server.testing.slurm.dev_engine_knobs: one core per job). Start-up: submission ->
              the endpoints file exists (every server healthy with its backend registered) -> the first
              rollout (one `short_answer` job, 8 tokens, through `SyncRolloutClient.from_endpoints`) is back.
              Then two jobs per server that hold a bubblewrap sandbox until cancelled (`sandbox_hold`,
              prorl_server.testing.hold_handler) are started. Teardown: `scancel` of the servers job -> Slurm
              lists neither job, no announced process lives and no sandbox process of the servers is left.
    direct    the baseline: the same two dev engines and two servers (same flags) started with `LocalStack`,
              one after another, each waited for, then the backends registered with the same client call.
              Start-up: first start -> registered -> first rollout back. The same sandbox-holding jobs. Teardown:
              `LocalStack.stop()` (SIGTERM to each, newest first, waiting for each to exit) -> no sandbox
              process of the servers is left.
The cluster itself starts once (`scripts/setup-slurm.sh start`), timed apart.

JSON output (`--json PATH`); times in seconds::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "cluster_start_s",
      "runs": {"slurm" | "direct": [{"ready_s", "first_rollout_s", "teardown_s"}]},
      "median": {"slurm" | "direct": {"ready_s", "first_rollout_s", "teardown_s"}},
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 if Slurm cannot run here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _report import positive_int, report_header

from prorl_server.client import SyncRolloutClient
from prorl_server.launch import LocalStack
from prorl_server.sandbox.reaper import tagged_processes
from prorl_server.testing.slurm import HOLD_HANDLER, LocalSlurm, dev_engine_knobs, launch_service, missing_slurm

ROOT = Path(__file__).resolve().parents[1]
QUESTION = {"data_source": "short_answer", "question": "What is 2 + 2?", "answer": "4"}
REQUEST = {"instance": QUESTION, "sampling_params": {"max_tokens": 8, "temperature": 0.7}}
SERVER_FLAGS = ("--init-workers", "1", "--run-workers", "8", "--eval-workers", "1", "--handler", HOLD_HANDLER)
HOLDING_PER_SERVER = 2
KEYS = ("ready_s", "first_rollout_s", "teardown_s")


def first_rollout(client: SyncRolloutClient) -> None:
    """One rollout through the client; it must complete."""
    result = client.jobs.process(REQUEST)
    if result.status.value != "completed":
        raise RuntimeError(f"the first rollout ended {result.status.value}: {result.error}")


def hold_sandboxes(client: SyncRolloutClient, timeout_s: float = 120.0) -> None:
    """Start HOLDING_PER_SERVER sandbox-holding jobs on each server; return once all of them are in RUN."""
    holding = [
        client.jobs.submit({"instance": {"data_source": "sandbox_hold"}}, server=server)
        for server in client.servers
        for _ in range(HOLDING_PER_SERVER)
    ]
    deadline = time.monotonic() + timeout_s
    while not all(client.jobs.get(job_id).status.value == "run" for job_id in holding):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandbox-holding jobs not all in RUN within {timeout_s} s")
        time.sleep(0.1)


def sandbox_processes(server_pids: list[int]) -> list[int]:
    """Live sandbox processes of the servers with these PIDs (by the owner tag)."""
    prefixes = tuple(f"prorl-{pid}-" for pid in server_pids)
    return [t.pid for t in tagged_processes() if t.owner.startswith(prefixes)]


def run_slurm(cluster: LocalSlurm, run_dir: Path) -> dict[str, float]:
    """launch.sh without waiting; poll for the endpoints file; one rollout; scancel; poll until all is gone."""
    started = time.monotonic()
    knobs = dev_engine_knobs(WAIT="0", SERVER_ARGS=f"--handler {HOLD_HANDLER}")
    service = launch_service(cluster, ROOT / "deploy/slurm/launch.sh", run_dir, knobs)
    try:
        while not service.endpoints_file.exists():
            if service.gone():
                raise RuntimeError(f"the service ended before it was ready:\n{service.launch_output}")
            time.sleep(0.05)
        ready = time.monotonic() - started
        with SyncRolloutClient.from_endpoints(service.endpoints_file, trust_env=False) as client:
            first_rollout(client)
            rollout = time.monotonic() - started
            hold_sandboxes(client)
        server_pids = [a.pid for a in service.announcements("server")]
        pids = server_pids + [a.pid for a in service.announcements("backend")]
        stopping = time.monotonic()
        service.cancel(service.servers_job)
        service.wait_gone()
        while any(Path(f"/proc/{pid}").exists() for pid in pids) or sandbox_processes(server_pids):
            time.sleep(0.05)
        return {"ready_s": ready, "first_rollout_s": rollout, "teardown_s": time.monotonic() - stopping}
    finally:
        service.stop()


def run_direct(log_dir: Path) -> dict[str, float]:
    """The same processes through LocalStack; register; one rollout; stop."""
    started = time.monotonic()
    with LocalStack(log_dir) as stack:
        backends = [stack.dev_llm("--slots", "1", "--n-ctx", "2048") for _ in range(2)]
        servers = [stack.server(*SERVER_FLAGS) for _ in range(2)]
        with SyncRolloutClient(servers, trust_env=False) as client:
            client.backends.register(backends)
            ready = time.monotonic() - started
            first_rollout(client)
            rollout = time.monotonic() - started
            hold_sandboxes(client)
        server_pids = [proc.pid for proc in stack.procs[len(backends) :]]
        stopping = time.monotonic()
        stack.stop()
        while sandbox_processes(server_pids):
            time.sleep(0.05)
        teardown = time.monotonic() - stopping
    return {"ready_s": ready, "first_rollout_s": rollout, "teardown_s": teardown}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3, help="launches of each kind")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    problem = missing_slurm()
    if problem:
        print(f"bench_slurm: {problem}")
        return 1
    report = report_header(args)
    begun = time.monotonic()
    runs: dict[str, list[dict[str, float]]] = {"slurm": [], "direct": []}
    started = time.monotonic()
    with LocalSlurm(ROOT / "scripts/setup-slurm.sh") as cluster, tempfile.TemporaryDirectory() as tmp:
        report["cluster_start_s"] = time.monotonic() - started
        print(f"single-node Slurm cluster started in {report['cluster_start_s']:.2f} s")
        for i in range(args.repeats):
            runs["slurm"].append(run_slurm(cluster, Path(tmp) / f"run-{i}"))
            print(f"slurm  #{i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs["slurm"][-1].items()))
            (Path(tmp) / f"direct-{i}").mkdir()
            runs["direct"].append(run_direct(Path(tmp) / f"direct-{i}"))
            print(f"direct #{i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs["direct"][-1].items()))
    report["runs"] = runs
    report["median"] = {kind: {k: statistics.median(r[k] for r in rs) for k in KEYS} for kind, rs in runs.items()}
    report["elapsed_s"] = time.monotonic() - begun
    print(f"\nmedians of {args.repeats} (seconds)")
    print(f"  {'':8}{'ready (endpoints)':>20}{'first rollout':>16}{'teardown':>12}")
    for kind, figures in report["median"].items():
        print(f"  {kind:8}" + "".join(f"{figures[k]:>{w}.2f}" for k, w in zip(KEYS, (20, 16, 12), strict=True)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
