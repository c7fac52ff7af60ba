"""The flags of `prorl-server eval` and what it runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

from prorl_server.evaluation.errors import EvalError
from prorl_server.evaluation.report import Report, aggregate, table
from prorl_server.protocol import API_KEY_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `prorl-server eval`."""
    parser.add_argument("tasks", type=Path, help="JSONL file, one task instance (with its data_source) a line")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="URL of a running prorl-server")
    where.add_argument(
        "--local", action="store_true", help="start a prorl-server on this machine for the run (no API key)"
    )
    parser.add_argument(
        "--llm-server",
        action="append",
        default=[],
        metavar="URL",
        help="with --local: an LLM backend's /v1 address, repeatable (none: a dev engine, the devllm extra)",
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --local: one more `prorl-server serve` argument, e.g. --serve-arg=--handler=my.py:MyHandler",
    )
    parser.add_argument(
        "--api-key", default=None, help=f"the server's API key (none: ${API_KEY_ENV}, else this user's key file)"
    )
    parser.add_argument("--k", type=int, default=1, help="samples per instance")
    parser.add_argument("--pass-threshold", type=float, default=1.0, help="a sample passes when reward >= this")
    parser.add_argument("--concurrency", type=int, default=32, help="jobs running at once")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds of stage time per job (none: the server's)"
    )
    parser.add_argument("--sampling-params", type=json.loads, default=None, help="JSON object sent with every job")
    parser.add_argument(
        "--agent-config", type=json.loads, default=None, help='JSON object sent with every job, e.g. {"max_turns": 2}'
    )
    parser.add_argument("--json", type=Path, default=None, dest="json_path", help="also write the figures here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--mlflow-uri", default=None, help="log the run to this MLflow tracking URI")
    parser.add_argument("--wandb-offline", type=Path, default=None, metavar="DIR", help="log an offline W&B run here")
    parser.add_argument("--experiment", default="prorl-eval", help="MLflow experiment / W&B project")
    parser.add_argument("--run-name", default=None, help="MLflow / W&B run name")


def run_from_args(args: argparse.Namespace) -> None:
    """Run `prorl-server eval`; bad input is one line on stderr and exit code 2."""
    try:
        report = run(args)
        print(table(report), flush=True)
        track(report, args)
    except EvalError as exc:
        print(f"prorl-server eval: {exc}", file=sys.stderr)
        sys.exit(2)


def run(args: argparse.Namespace) -> Report:
    """Check the flags, run the evaluation, write the report (--json)."""
    from prorl_server.evaluation import tracking
    from prorl_server.evaluation.local import start_local_server
    from prorl_server.evaluation.runner import evaluate, load_tasks

    if args.k < 1:
        raise EvalError(f"--k must be at least 1, got {args.k}")
    if args.concurrency < 1:
        raise EvalError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.sampling_params is not None and not isinstance(args.sampling_params, dict):
        raise EvalError("--sampling-params must be a JSON object")
    if args.agent_config is not None and not isinstance(args.agent_config, dict):
        raise EvalError("--agent-config must be a JSON object")
    if args.mlflow_uri is not None:
        tracking.require("mlflow")
    if args.wandb_offline is not None:
        tracking.require("wandb")
    if not args.local and (args.llm_server or args.serve_arg):
        raise EvalError("--llm-server and --serve-arg are for --local")
    tasks = load_tasks(args.tasks)
    with contextlib.ExitStack() as exits:
        server = start_local_server(exits, args.llm_server, args.serve_arg) if args.local else args.server
        start = time.monotonic()
        samples = asyncio.run(
            evaluate(
                server,
                tasks,
                k=args.k,
                pass_threshold=args.pass_threshold,
                concurrency=args.concurrency,
                api_key="" if args.local else args.api_key,
                sampling_params=args.sampling_params,
                agent_config=args.agent_config,
                timeout=args.timeout,
                progress=not args.no_progress,
            )
        )
        wall_s = time.monotonic() - start
    report = aggregate(
        samples,
        k=args.k,
        pass_threshold=args.pass_threshold,
        server="local" if args.local else server,
        tasks=str(args.tasks),
        wall_s=wall_s,
    )
    if args.json_path is not None:
        args.json_path.write_text(report.model_dump_json(indent=2) + "\n")
    return report


def track(report: Report, args: argparse.Namespace) -> None:
    """Log the report to MLflow and/or W&B offline, as the flags ask; EvalError when a tracker fails."""
    from prorl_server.evaluation import tracking

    if args.mlflow_uri is not None:
        with tracking.failing_as("MLflow"):
            run_id = tracking.log_mlflow(report, args.mlflow_uri, args.experiment, args.run_name)
        print(f"MLflow run {run_id} at {args.mlflow_uri}", file=sys.stderr)
    if args.wandb_offline is not None:
        with tracking.failing_as("W&B"):
            run_id = tracking.log_wandb(report, args.wandb_offline, args.experiment, args.run_name)
        print(f"W&B offline run {run_id} in {args.wandb_offline}", file=sys.stderr)
