"""A trainer's side of prorl-server: submit groups of rollouts, stream the results back, compute group stats.

What an RL trainer (GRPO, DAPO, ...) does each step, over plain HTTP with httpx:

1. `POST /add_llm_server` for each vLLM backend (optional when the server was started with --llm-server);
2. `POST /jobs` for N samples of every prompt, each with its own `job_id` (a *group* per prompt);
3. `GET /jobs?after=CURSOR&limit=...&wait=...`: long-poll finished results in completion order, and
   `POST /jobs/ack {"through": CURSOR}` once they are safely received (the server keeps them until then,
   so a trainer that reconnects resumes from its last cursor without losing any);
4. per-job reward, turns and token counts, and per-group reward mean and variance (the GRPO signal).

Example, against a server running the example Countdown handler:

    python examples/trainer_client.py --server http://127.0.0.1:8000 \\
        --llm-server http://127.0.0.1:8100/v1 --data-source countdown --samples 4

`--instances FILE.jsonl` reads one instance (a JSON object) per line; without it a built-in sample of
Countdown puzzles is used. Acknowledging `through` a cursor drops every stored result up to it, so this
script assumes it is the only consumer of the server's results (other jobs' results are skipped and dropped).

With `$PRORL_API_KEY` set, every request carries `Authorization: Bearer <key>` (for a server started with
that key).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TERMINAL = frozenset({"completed", "failed", "timeout", "cancelled"})
API_KEY_ENV = "PRORL_API_KEY"

SAMPLE_INSTANCES: list[dict[str, Any]] = [
    {"numbers": [3, 5, 4, 2], "target": 24},
    {"numbers": [6, 7, 9], "target": 51},
    {"numbers": [2, 8, 10, 25], "target": 52},
    {"numbers": [1, 3, 7, 11], "target": 100},
]


class ServerError(RuntimeError):
    """prorl-server could not be reached or refused a request; the message says what to do."""


class RolloutClient:
    """Thin, explicit wrapper of the prorl-server HTTP API."""

    def __init__(self, server: str, request_timeout_s: float = 30.0, api_key: str | None = None) -> None:
        self.server = server.rstrip("/")
        self.request_timeout_s = request_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=self.server, timeout=httpx.Timeout(request_timeout_s, connect=5.0), headers=headers
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def request(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> Any:
        """Send a request and return its JSON body; raise ServerError with the server's own explanation."""
        try:
            response = self.http.request(method, path, timeout=timeout or self.request_timeout_s, **kwargs)
        except httpx.TimeoutException as exc:
            raise ServerError(f"{method} {self.server}{path} timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ServerError(
                f"cannot reach prorl-server at {self.server} ({type(exc).__name__}: {exc}); is it running? "
                "start it with `prorl-server serve --port PORT ...`"
            ) from exc
        if response.status_code < 400:
            return response.json()
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        if isinstance(detail, list):  # FastAPI validation errors
            detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
        hint = {
            400: "the request or instance is invalid",
            401: f"the server requires an API key: set ${API_KEY_ENV} to the server's key",
            404: "unknown job (never submitted, already acknowledged, or past retention)",
            409: "a job with this id is still running",
            422: "the request body does not match the schema",
            503: "the server cannot take jobs now (stopped, no healthy LLM backend, or handler failed to load)",
        }.get(response.status_code, "")
        hint = f" ({hint})" if hint else ""
        raise ServerError(f"{method} {path} -> HTTP {response.status_code}{hint}: {detail}")

    def health(self) -> dict[str, Any]:
        """`GET /health`."""
        return self.request("GET", "/health")

    def handlers(self) -> list[dict[str, Any]]:
        """`GET /handlers`: data sources and whether their handler loaded."""
        return self.request("GET", "/handlers")

    def add_llm_server(self, address: str, weight_version: str | None = None) -> dict[str, Any]:
        """`POST /add_llm_server`: register (or update) a vLLM backend."""
        return self.request("POST", "/add_llm_server", json={"address": address, "weight_version": weight_version})

    def submit(self, body: dict[str, Any]) -> str:
        """`POST /jobs`: queue a job, return its id."""
        return self.request("POST", "/jobs", json=body)["job_id"]

    def results(self, after: int, limit: int, wait: float) -> tuple[list[dict[str, Any]], int]:
        """`GET /jobs` long-poll: up to `limit` results stored after cursor `after`, and the next cursor."""
        page = self.request(
            "GET", "/jobs", params={"after": after, "limit": limit, "wait": wait}, timeout=wait + self.request_timeout_s
        )
        return page["results"], page["next_cursor"]

    def ack(self, through: int | None = None, job_ids: list[str] | None = None) -> int:
        """`POST /jobs/ack`: drop stored results up to cursor `through` and/or by job id."""
        body: dict[str, Any] = {"job_ids": job_ids or []}
        if through is not None:
            body["through"] = through
        return self.request("POST", "/jobs/ack", json=body)["acknowledged"]

    def cancel(self, job_id: str) -> str:
        """`POST /cancel`: cancel a job (idempotent); returns its status afterwards."""
        return self.request("POST", "/cancel", json={"job_id": job_id})["status"]


@dataclass
class Group:
    """The N samples of one prompt."""

    index: int
    job_ids: list[str]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True once every sample has a terminal result."""
        return len(self.results) == len(self.job_ids)

    def rewards(self) -> list[float]:
        """Rewards of finished samples; a job without a reward (failed, timeout, cancelled) counts as 0."""
        return [r["reward"] if r["reward"] is not None else 0.0 for r in self.results.values()]


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


def describe(result: dict[str, Any]) -> str:
    """One line per job: status, reward, turns, token counts, time."""
    traj = result["trajectory"]
    model_tokens = sum(traj["response_mask"])
    line = (
        f"{result['job_id']:<28} {result['status']:<9} reward={result['reward']!s:<5} turns={len(traj['turns'])} "
        f"tokens: prompt={len(traj['prompt_ids'])} response={len(traj['response_ids'])} (model {model_tokens}) "
        f"time={result['timing']['total_s']:.2f}s"
    )
    if result.get("error"):
        err = result["error"]
        line += f"\n    error in {err['stage']}: {err['type']}: {err['message']}"
    return line


def submit_groups(
    client: RolloutClient,
    instances: list[dict[str, Any]],
    samples: int,
    sampling_params: dict[str, Any],
    agent_config: dict[str, Any],
    job_timeout: float | None,
) -> list[Group]:
    """Submit `samples` jobs per instance with distinct ids; on a refusal, cancel what was submitted."""
    run_id = uuid.uuid4().hex[:8]
    groups: list[Group] = []
    try:
        for g, instance in enumerate(instances):
            group = Group(g, [])
            groups.append(group)
            for s in range(samples):
                body: dict[str, Any] = {
                    "job_id": f"{run_id}-g{g}-s{s}",
                    "instance": instance,
                    "sampling_params": sampling_params,
                    "agent_config": agent_config,
                }
                if job_timeout is not None:
                    body["timeout"] = job_timeout
                group.job_ids.append(client.submit(body))
    except ServerError:
        cancel_all(client, (j for grp in groups for j in grp.job_ids))
        raise
    return groups


def cancel_all(client: RolloutClient, job_ids: Iterable[str]) -> None:
    """Best-effort: cancel jobs we gave up on and drop their results, so nothing runs or waits for nobody."""
    job_ids = list(job_ids)
    for job_id in job_ids:
        try:
            client.cancel(job_id)
        except ServerError as exc:
            print(f"  could not cancel {job_id}: {exc}", file=sys.stderr)
    try:
        client.ack(job_ids=job_ids)
    except ServerError as exc:
        print(f"  could not acknowledge the cancelled jobs: {exc}", file=sys.stderr)


def collect(client: RolloutClient, groups: list[Group], deadline_s: float, poll_wait: float, limit: int) -> None:
    """Stream results until every job is terminal or the deadline passes; print as they arrive."""
    by_job = {job_id: group for group in groups for job_id in group.job_ids}
    total, received, cursor, failures = len(by_job), 0, 0, 0
    deadline = time.monotonic() + deadline_s
    while received < total:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            page, next_cursor = client.results(cursor, limit, min(poll_wait, max(remaining, 0.0)))
        except ServerError as exc:
            failures += 1  # the server may be restarting; results wait for us until acknowledged
            if failures > 5:
                raise
            print(f"  poll failed ({exc}); retrying in {failures}s", file=sys.stderr)
            time.sleep(failures)
            continue
        failures = 0
        for result in page:
            group = by_job.get(result["job_id"])
            if group is None or result["job_id"] in group.results:
                continue  # another client's job, or a duplicate after a reconnect
            group.results[result["job_id"]] = result
            received += 1
            print(f"[{received:3d}/{total}] {describe(result)}")
            if group.done:
                print_group(group)
        if next_cursor > cursor:
            client.ack(next_cursor)
            cursor = next_cursor


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
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="prorl-server base URL")
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

    instances = load_instances(args.instances, args.data_source)
    client = RolloutClient(args.server, api_key=os.environ.get(API_KEY_ENV))
    groups: list[Group] = []
    try:
        client.health()
        handlers = {h["data_source"]: h for h in client.handlers()}
        for name in sorted({inst["data_source"] for inst in instances}):
            info = handlers.get(name)
            if info is None or not info["loaded"]:
                why = info["error"] if info else f"not registered (known: {', '.join(sorted(handlers)) or 'none'})"
                raise ServerError(f"handler {name!r} is unavailable on {args.server}: {why}")
        for address in args.llm_server:
            info = client.add_llm_server(address, args.weight_version)
            print(f"registered LLM backend {info['address']} (healthy={info['healthy']})")
        groups = submit_groups(
            client, instances, args.samples, args.sampling_params, args.agent_config, args.job_timeout
        )
        total = sum(len(g.job_ids) for g in groups)
        print(f"submitted {total} jobs: {len(groups)} instances x {args.samples} samples")
        collect(client, groups, args.deadline, args.poll_wait, args.limit)
        pending = [j for g in groups for j in g.job_ids if j not in g.results]
        finished = [r for g in groups for r in g.results.values()]
        counts = {s: sum(r["status"] == s for r in finished) for s in sorted(TERMINAL)}
        print("statuses: " + ", ".join([f"{s}={n}" for s, n in counts.items() if n] + [f"unfinished={len(pending)}"]))
        if pending:
            print(f"deadline passed with {len(pending)} unfinished jobs; cancelling them", file=sys.stderr)
            cancel_all(client, pending)
            return 1
        return 0
    except ServerError as exc:
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
