"""`prorl-server slurm announce|register|cpus`: the Python steps of the sbatch scripts in deploy/slurm/."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prorl_server.launch.slurm import ENDPOINTS_FILE, DeploymentError, announce, register
from prorl_server.sandbox import cpu_slice, format_cpus

READY_TIMEOUT_S = 1800.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`announce` (one process is healthy), `register` (every process is: register and write endpoints) and
    `cpus` (one server's share of the node's CPUs)."""
    actions = parser.add_subparsers(dest="slurm_action", required=True)
    one = actions.add_parser(
        "announce",
        help="wait until a started process answers its health check, then announce it in the run directory",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    one.add_argument("--run-dir", type=Path, required=True, help="the deployment's directory (shared filesystem)")
    one.add_argument("--role", choices=["server", "backend"], required=True)
    one.add_argument("--name", required=True, help="unique in the run, such as <node>-<index>")
    one.add_argument("--address", required=True, help="what clients use: server URL, or backend /v1 URL")
    one.add_argument("--health", required=True, help="the URL that answers 200 once the process is ready")
    one.add_argument("--pid", type=int, required=True, help="the process; it exiting first is a failure")
    one.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for health")
    every = actions.add_parser(
        "register",
        help=f"wait for every server and backend, register the backends, write <run-dir>/{ENDPOINTS_FILE}",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    every.add_argument("--run-dir", type=Path, required=True, help="the deployment's directory (shared filesystem)")
    every.add_argument("--servers", type=int, required=True, help="rollout servers to wait for")
    every.add_argument("--backends", type=int, required=True, help="LLM backends to wait for")
    every.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for all of them")
    share = actions.add_parser(
        "cpus",
        help="print server INDEX's slice of the CPUs this process may use, out of COUNT servers on the node "
        "(its --action-cpus)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    share.add_argument("--index", type=int, required=True, help="the server's index on the node, from 0")
    share.add_argument("--count", type=int, required=True, help="servers on the node")


def run_from_args(args: argparse.Namespace) -> None:
    """Run `announce`, `register` or `cpus`; a failure exits non-zero with its reason."""
    try:
        if args.slurm_action == "cpus":
            print(format_cpus(cpu_slice(tuple(sorted(os.sched_getaffinity(0))), args.index, args.count)))
        elif args.slurm_action == "announce":
            path = announce(args.run_dir, args.role, args.name, args.address, args.health, args.pid, args.timeout)
            print(f"prorl-server slurm: {args.role} {args.address} ready ({path})", flush=True)
        else:
            endpoints = register(args.run_dir, args.servers, args.backends, args.timeout)
            for server, backends in endpoints.assignment.items():
                print(f"prorl-server slurm: {server} <- {', '.join(backends)}", flush=True)
            print(f"prorl-server slurm: endpoints written to {args.run_dir / ENDPOINTS_FILE}", flush=True)
    except (DeploymentError, ValueError) as exc:
        sys.exit(f"prorl-server slurm {args.slurm_action}: {exc}")
