"""What a stopped Slurm deployment must not leave behind, and how the tests look for it (tests/launch/test_slurm*.py)."""

from __future__ import annotations

import os
from pathlib import Path

from prorl_server.client import SyncRolloutClient
from prorl_server.sandbox import cgroups
from prorl_server.sandbox.reaper import tagged_processes
from prorl_server.testing.slurm import Service


def all_running(client: SyncRolloutClient, job_ids: list[str]) -> bool:
    """Whether every job is in RUN; fails at once, with its error, on one that has ended."""
    for job_id in job_ids:
        answer = client.jobs.get(job_id)
        assert answer.result is None, f"job {job_id} ended {answer.status.value}: {answer.result.error}"
        if answer.status.value != "run":
            return False
    return True


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is no zombie."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3]
    except OSError:
        return False


def job_processes(service: Service) -> list[int]:
    """Processes started under either job of the service on this cluster (by SLURM_JOB_ID and SLURM_CONF)."""
    conf = f"SLURM_CONF={service.cluster.env['SLURM_CONF']}".encode()
    ids = {f"SLURM_JOB_ID={job}".encode() for job in (service.servers_job, service.backends_job)}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if conf in environ and ids & environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def sandbox_owners(prefixes: tuple[str, ...]) -> set[str]:
    """Owner ids (server instances) of the live sandbox processes of the given servers."""
    return {t.owner for t in tagged_processes() if t.owner.startswith(prefixes) and alive(t.pid)}


def sandbox_directories(base_dir: Path, prefixes: tuple[str, ...]) -> list[Path]:
    """The given servers' private sandbox directories (one per server, holding one per sandbox)."""
    return [d for d in base_dir.glob("prorl-*") if d.name.startswith(prefixes)]


def sandbox_cgroups(prefixes: tuple[str, ...]) -> list[Path]:
    """The given servers' sandbox cgroup directories, in every hierarchy this process can see."""
    owners = cgroups.owner_directories(cgroups.detect(warn=False))
    return [d for owner, dirs in owners.items() if owner.startswith(prefixes) for d in dirs]
