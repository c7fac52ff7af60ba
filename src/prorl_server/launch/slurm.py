"""The two steps of a Slurm deployment (deploy/slurm/) that are easier in Python than in bash.

- `announce`: wait until a process just started on a node (a rollout server or an LLM backend) answers its
  health check, then write its Announcement into the run directory (a shared filesystem).
- `register`: wait for every expected announcement, refuse two processes announcing one address, register
  the backends with the servers by ProRL's two-phase rule (each server first gets the backends on its own node, the rest are spread evenly), then
  write the endpoints file trainers read (protocol/endpoints.py).

Both are `prorl-server slurm announce|register`; the sbatch scripts call them.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from prorl_server.auth_key import ApiKeyFileError
from prorl_server.client import RolloutClient, RolloutServerError
from prorl_server.errors import LaunchError
from prorl_server.protocol import Announcement, Endpoints, write_atomically

POLL_S = 0.5
ROLE_DIRS = {"server": "servers", "backend": "backends"}
ENDPOINTS_FILE = "endpoints.json"


class DeploymentError(LaunchError, RuntimeError):
    """A deployment step failed; the message says which process or file and what to look at."""


def announcement_path(run_dir: Path, role: str, name: str) -> Path:
    """Where the announcement of process `name` (unique in the run) of `role` goes."""
    return run_dir / ROLE_DIRS[role] / f"{name}.json"


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def wait_healthy(health_url: str, pid: int, timeout_s: float) -> None:
    """Poll `health_url` until it answers 200; DeploymentError if process `pid` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        while True:
            try:
                if http.get(health_url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not process_alive(pid):
                raise DeploymentError(f"process {pid} exited before {health_url} answered (see its log)")
            if time.monotonic() > deadline:
                raise DeploymentError(f"{health_url} did not answer 200 within {timeout_s:.0f} s")
            time.sleep(POLL_S)


def announce(run_dir: Path, role: str, name: str, address: str, health_url: str, pid: int, timeout_s: float) -> Path:
    """Wait until the process is healthy, then write its announcement; returns the file."""
    wait_healthy(health_url, pid, timeout_s)
    path = announcement_path(run_dir, role, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = Announcement(
        role=role, address=address, host=os.uname().nodename, pid=pid, job_id=os.environ.get("SLURM_JOB_ID")
    )
    write_atomically(path, entry.model_dump_json())
    return path


def read_announcements(run_dir: Path, role: str) -> list[Announcement]:
    """Every announcement of `role` in the run directory so far, in file-name order."""
    directory = run_dir / ROLE_DIRS[role]
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [Announcement.model_validate_json(f.read_bytes()) for f in files]


def wait_announcements(run_dir: Path, role: str, expected: int, deadline: float) -> list[Announcement]:
    """Block until `expected` processes of `role` have announced themselves; DeploymentError at the deadline."""
    while True:
        found = read_announcements(run_dir, role)
        if len(found) >= expected:
            return found
        if time.monotonic() > deadline:
            raise DeploymentError(
                f"{len(found)} of {expected} {ROLE_DIRS[role]} announced themselves in {run_dir / ROLE_DIRS[role]}; "
                f"see the logs in {run_dir / 'logs'}"
            )
        time.sleep(POLL_S)


def check_distinct(run_dir: Path, role: str) -> None:
    """DeploymentError naming both when two processes of `role` announced the same address (NODE_ADDRESS set
    to one name on several nodes, say): one of them would get the other's backends, or be lost."""
    seen: dict[str, tuple[str, Announcement]] = {}
    for path in sorted((run_dir / ROLE_DIRS[role]).glob("*.json")):
        entry = Announcement.model_validate_json(path.read_bytes())
        if entry.address in seen:
            name, first = seen[entry.address]
            raise DeploymentError(
                f"{role}s {name} (pid {first.pid} on {first.host}) and {path.stem} (pid {entry.pid} on {entry.host}) "
                f"both announced {entry.address}: every process needs an address of its own. Is NODE_ADDRESS set "
                "to one name on several nodes? Leave it empty to announce each node by its hostname."
            )
        seen[entry.address] = (path.stem, entry)


def key_required(server: str) -> bool:
    """Whether `server` wants an API key: it answers `GET /status` without one with 401."""
    try:
        with httpx.Client(timeout=30.0, trust_env=False) as http:
            return http.get(f"{server}/status").status_code == 401
    except httpx.HTTPError as exc:
        raise DeploymentError(f"{server} did not answer GET /status: {exc}") from exc


async def register_backends(servers: list[str], backends: list[str]) -> dict[str, list[str]]:
    """Register the backends with the servers (two-phase rule); every server must get at least one. The
    client sends `$PRORL_API_KEY`, else the key in the user's key file (the one the servers use by default)."""
    try:
        async with RolloutClient(servers, trust_env=False) as client:
            assignment = await client.backends.register(backends)
    except (ApiKeyFileError, RolloutServerError) as exc:
        raise DeploymentError(f"registering the backends failed: {exc}") from exc
    idle = [server for server, assigned in assignment.items() if not assigned]
    if idle:
        raise DeploymentError(
            f"{len(servers)} rollout servers but only {len(backends)} backends: {', '.join(idle)} got none. "
            "Start at least as many backends as rollout servers."
        )
    return assignment


def register(run_dir: Path, n_servers: int, n_backends: int, timeout_s: float) -> Endpoints:
    """Wait for `n_servers` servers and `n_backends` backends, register, write `<run_dir>/endpoints.json`."""
    deadline = time.monotonic() + timeout_s
    servers = wait_announcements(run_dir, "server", n_servers, deadline)
    check_distinct(run_dir, "server")
    backends = wait_announcements(run_dir, "backend", n_backends, deadline)
    check_distinct(run_dir, "backend")
    server_urls = [s.address for s in servers]
    backend_urls = [b.address for b in backends]
    assignment = asyncio.run(register_backends(server_urls, backend_urls))
    job_ids = {ROLE_DIRS[a.role]: a.job_id for a in (*servers, *backends) if a.job_id}
    endpoints = Endpoints(
        servers=server_urls,
        backends=backend_urls,
        assignment=assignment,
        job_ids=job_ids,
        api_key_required=any(key_required(url) for url in server_urls),
        written_at=datetime.now(UTC),
    )
    write_atomically(run_dir / ENDPOINTS_FILE, endpoints.model_dump_json(indent=2))
    return endpoints
