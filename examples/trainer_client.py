"""A trainer's side of prorl-server: submit groups of rollouts, stream the results back, compute group stats.

What an RL trainer (GRPO, DAPO, ...) does each step, with `prorl_server.client.SyncRolloutClient`:

1. `client.backends.register` for the vLLM backends (optional when the server was started with --llm-server);
2. `client.jobs.submit_many`: N samples of every prompt, each with its own `job_id` (a *group* per prompt); a
   submit the client retries (connection error, timeout, 502/503/504) carries the same id, so no job runs twice;
3. `client.jobs.as_completed(job_ids, ack=True)`: finished results as they arrive (`GET /jobs` long polls),
   each acknowledged once received (the server keeps results until then, so a trainer that reconnects loses
   none);
4. per-job reward, turns and token counts, and per-group reward mean and variance (the GRPO signal).

Example, against a server running the example Countdown handler:

    python examples/trainer_client.py --server http://127.0.0.1:8000 \\
        --llm-server http://127.0.0.1:8100/v1 --data-source countdown --samples 4

`--instances FILE.jsonl` reads one instance (a JSON object) per line; without it a built-in sample of
Countdown puzzles is used. Results are acknowledged by job id, so other clients' results on the same server
are left alone. `--server` may be repeated: jobs then go to the least loaded server.

Every request carries `Authorization: Bearer <key>` with `$PRORL_API_KEY` when it is set, else with the key in
this user's key file, the key a `prorl-server serve` of the same user uses when given none
(`prorl_server.auth_key`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorl_server.client import RolloutServerError, SyncRolloutClient
from prorl_server.protocol import TERMINAL_STATUSES, JobResult

SAMPLE_INSTANCES: list[dict[str, Any]] = [
    {"numbers": [3, 5, 4, 2], "target": 24},
    {"numbers": [6, 7, 9], "target": 51},
    {"numbers": [2, 8, 10, 25], "target": 52},
    {"numbers": [1, 3, 7, 11], "target": 100},
]


@dataclass
class Group:
    """The N samples of one prompt."""

    index: int
    job_ids: list[str]
    results: dict[str, JobResult] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True once every sample has a terminal result."""
        return len(self.results) == len(self.job_ids)

    def rewards(self) -> list[float]:
        """Rewards of finished samples; a job without a reward (failed, timeout, cancelled) counts as 0."""
        return [r.reward if r.reward is not None else 0.0 for r in self.results.values()]


def load_instances(path: Path | None, data_source: str) -> list[dict[str, Any]]:
    """Instances from a JSONL file (one JSON object per line), or the built-in Countdown sample.

    `data_source` is filled in where an instance has none.
    """
    if path is None:
        return [{"data_source": data_source, **inst} for inst in SAMPLE_INSTANCES]
    instances: list[dict[str, Any]] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            inst = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{lineno}: not valid JSON: {exc}") from exc
        if not isinstance(inst, dict):
            raise SystemExit(f"{path}:{lineno}: an instance must be a JSON object, got {type(inst).__name__}")
        inst.setdefault("data_source", data_source)
        instances.append(inst)
    if not instances:
        raise SystemExit(f"{path}: no instances")
    return instances


def describe(result: JobResult) -> str:
    """One line per job: status, reward, turns, token counts, time."""
    traj = result.trajectory
    model_tokens = sum(traj.response_mask)
    line = (
        f"{result.job_id:<28} {result.status.value:<9} reward={result.reward!s:<5} turns={len(traj.turns)} "
        f"tokens: prompt={len(traj.prompt_ids)} response={len(traj.response_ids)} (model {model_tokens}) "
        f"time={result.timing.total_s:.2f}s"
    )
    if result.error is not None:
        err = result.error
        line += f"\n    error in {err.stage}: {err.type}: {err.message}"
    return line


def submit_groups(
    client: SyncRolloutClient,
    instances: list[dict[str, Any]],
    samples: int,
    sampling_params: dict[str, Any],
    agent_config: dict[str, Any],
    job_timeout: float | None,
) -> list[Group]:
    """Submit `samples` jobs per instance with distinct ids (on a refusal the client cancels what it submitted)."""
    run_id = uuid.uuid4().hex[:8]
    requests: list[dict[str, Any]] = []
    groups: list[Group] = []
    for g, instance in enumerate(instances):
        group = Group(g, [f"{run_id}-g{g}-s{s}" for s in range(samples)])
        groups.append(group)
        for job_id in group.job_ids:
            body: dict[str, Any] = {
                "job_id": job_id,
                "instance": instance,
                "sampling_params": sampling_params,
                "agent_config": agent_config,
            }
            if job_timeout is not None:
                body["timeout"] = job_timeout
            requests.append(body)
    client.jobs.submit_many(requests)
    return groups


def cancel_all(client: SyncRolloutClient, job_ids: Iterable[str]) -> None:
    """Best-effort: cancel jobs we gave up on and drop their results, so nothing runs or waits for nobody."""
    job_ids = list(job_ids)
    for job_id in job_ids:
        try:
            client.jobs.cancel(job_id)
        except RolloutServerError as exc:
            print(f"  could not cancel {job_id}: {exc}", file=sys.stderr)
    try:
        client.jobs.ack(job_ids=job_ids)
    except RolloutServerError as exc:
        print(f"  could not acknowledge the cancelled jobs: {exc}", file=sys.stderr)


def collect(client: SyncRolloutClient, groups: list[Group], deadline_s: float, poll_wait: float, limit: int) -> None:
    """Stream results until every job is terminal or the deadline passes; print as they arrive."""
    by_job = {job_id: group for group in groups for job_id in group.job_ids}
    total = len(by_job)
    results = client.jobs.as_completed(by_job, ack=True, timeout=deadline_s, wait=poll_wait, limit=limit)
    for received, result in enumerate(results, start=1):
        group = by_job[result.job_id]
        group.results[result.job_id] = result
        print(f"[{received:3d}/{total}] {describe(result)}")
        if group.done:
            print_group(group)


def print_group(group: Group) -> None:
    """Reward mean and (population) variance of one group: zero variance means no GRPO signal."""
    rewards = group.rewards()
    mean, var = statistics.fmean(rewards), statistics.pvariance(rewards)
    print(f"  group {group.index}: rewards={rewards} mean={mean:.3f} variance={var:.4f}")


def json_arg(text: str) -> dict[str, Any]:
    """argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run one rollout step, print results; exit 0 when every job reached a terminal status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server", action="append", default=[], metavar="URL", help="prorl-server base URL (repeatable)"
    )
    parser.add_argument("--llm-server", action="append", default=[], metavar="URL", help="vLLM base URL (.../v1)")
    parser.add_argument("--weight-version", default=None, help="weight version to register the backends with")
    parser.add_argument("--data-source", default="countdown", help="handler name, filled into instances lacking one")
    parser.add_argument("--instances", type=Path, default=None, help="JSONL file; default: built-in Countdown sample")
    parser.add_argument("--samples", type=int, default=4, help="samples (jobs) per instance: the group size")
    parser.add_argument("--sampling-params", type=json_arg, default={"temperature": 1.0, "max_tokens": 512})
    parser.add_argument("--agent-config", type=json_arg, default={"max_turns": 4})
    parser.add_argument("--job-timeout", type=float, default=None, help="per-job stage-time budget (s)")
    parser.add_argument("--deadline", type=float, default=600.0, help="give up (and cancel) after this many s")
    parser.add_argument("--poll-wait", type=float, default=10.0, help="long-poll wait per GET /jobs (s)")
    parser.add_argument("--limit", type=int, default=256, help="results per page")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    servers = args.server or ["http://127.0.0.1:8000"]

    instances = load_instances(args.instances, args.data_source)
    client = SyncRolloutClient(servers)  # sends $PRORL_API_KEY, else the key file's key
    groups: list[Group] = []
    try:
        for server in servers:
            client.health(server=server)
            handlers = {h.data_source: h for h in client.handlers(server=server)}
            for name in sorted({inst["data_source"] for inst in instances}):
                info = handlers.get(name)
                if info is None or not info.loaded:
                    why = info.error if info else f"not registered (known: {', '.join(sorted(handlers)) or 'none'})"
                    raise RolloutServerError(f"handler {name!r} is unavailable on {server}: {why}")
        if args.llm_server:
            assignment = client.backends.register(args.llm_server, args.weight_version)
            for server, addresses in assignment.items():
                for info in client.backends.list(server=server).servers:
                    if info.address in addresses:
                        print(f"registered LLM backend {info.address} (healthy={info.healthy})")
        groups = submit_groups(
            client, instances, args.samples, args.sampling_params, args.agent_config, args.job_timeout
        )
        total = sum(len(g.job_ids) for g in groups)
        print(f"submitted {total} jobs: {len(groups)} instances x {args.samples} samples")
        collect(client, groups, args.deadline, args.poll_wait, args.limit)
        pending = [j for g in groups for j in g.job_ids if j not in g.results]
        finished = [r for g in groups for r in g.results.values()]
        statuses = sorted(s.value for s in TERMINAL_STATUSES)
        counts = {s: sum(r.status == s for r in finished) for s in statuses}
        print("statuses: " + ", ".join([f"{s}={n}" for s, n in counts.items() if n] + [f"unfinished={len(pending)}"]))
        if pending:
            print(f"deadline passed with {len(pending)} unfinished jobs; cancelling them", file=sys.stderr)
            cancel_all(client, pending)
            return 1
        return 0
    except RolloutServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: cancelling unfinished jobs", file=sys.stderr)
        cancel_all(client, (j for g in groups for j in g.job_ids if j not in g.results))
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
