"""The Slurm deployment (deploy/slurm/) on a real single-node Slurm cluster: launch.sh starts two rollout
servers and two dev-engine backends, registers them, writes the endpoints file; trainers' rollouts go through
it; `scancel` of the servers job stops everything gracefully and leaves no process, sandbox directory or
cgroup behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
from polling import wait_for
from slurm_leaks import alive, all_running, job_processes, sandbox_cgroups, sandbox_directories, sandbox_owners

from prorl_server.auth_key import read_api_key
from prorl_server.client import SyncRolloutClient
from prorl_server.testing.slurm import Service

QUESTION = {"data_source": "short_answer", "question": "What is 2 + 2?", "answer": "4"}


def test_launch_registers_each_servers_backends_and_serves_rollouts_from_the_endpoints_file(slurm_service: Service):
    endpoints = slurm_service.endpoints()
    key_file = Path(slurm_service.knobs["PRORL_API_KEY_FILE"])
    api_key = read_api_key(key_file)  # made by the first server to start, used by both and by registration
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(endpoints.servers) == 2 and len(endpoints.backends) == 2
    assert endpoints.job_ids == {"servers": slurm_service.servers_job, "backends": slurm_service.backends_job}
    assert endpoints.api_key_required
    # two-phase registration: both backends are on the servers' node, so each server gets one of them
    assert sorted(b for assigned in endpoints.assignment.values() for b in assigned) == sorted(endpoints.backends)
    headers = {"Authorization": f"Bearer {api_key}"}
    for server, assigned in endpoints.assignment.items():
        assert len(assigned) == 1
        listed = httpx.get(f"{server}/llm_servers", headers=headers, timeout=30, trust_env=False).json()
        assert [s["address"] for s in listed["servers"]] == assigned
        assert httpx.get(f"{server}/status", timeout=30, trust_env=False).status_code == 401  # the key is enforced

    with SyncRolloutClient.from_endpoints(slurm_service.endpoints_file, api_key=api_key, trust_env=False) as client:
        request = {"instance": QUESTION, "sampling_params": {"max_tokens": 8, "temperature": 0.7}}
        job_ids = client.jobs.submit_many(request for _ in range(4))
        results = client.jobs.collect(job_ids)
        used = {client.jobs.server_of(job_id) for job_id in job_ids}
    for result in results:
        assert result.status.value == "completed", result.error
        trajectory = result.trajectory
        assert trajectory.response_ids and len(trajectory.response_logprobs) == len(trajectory.response_ids)
        assert trajectory.turns[0].backend in endpoints.backends
    assert used == set(endpoints.servers)  # the client spread the jobs over both servers


def test_scancel_of_the_servers_job_stops_everything_gracefully_and_leaves_nothing(slurm_service: Service):
    endpoints = slurm_service.endpoints()
    api_key = read_api_key(Path(slurm_service.knobs["PRORL_API_KEY_FILE"]))
    server_pids = [a.pid for a in slurm_service.announcements("server")]
    backend_pids = [a.pid for a in slurm_service.announcements("backend")]
    owner_prefixes = tuple(f"prorl-{pid}-" for pid in server_pids)
    with SyncRolloutClient.from_endpoints(slurm_service.endpoints_file, api_key=api_key, trust_env=False) as client:
        holding = [
            # each takes 3 s to unwind once cancelled: the servers' graceful stop must be waited for
            client.jobs.submit({"instance": {"data_source": "sandbox_hold", "unwind_s": 3}}, server=server)
            for server in endpoints.servers
            for _ in range(2)
        ]
        wait_for(lambda: all_running(client, holding), 120, "every job in RUN")
    wait_for(lambda: len(sandbox_owners(owner_prefixes)) == 2, 60, "both servers' sandboxes running")
    scratch = Path(slurm_service.knobs["SANDBOX_DIR"]) / f"prorl-sandboxes-{os.geteuid()}"  # --sandbox-dir
    assert len(sandbox_directories(scratch, owner_prefixes)) == 2

    slurm_service.cancel(slurm_service.servers_job)  # the service's main job only
    wait_for(slurm_service.gone, 120, "both jobs gone after scancel", interval=0.2)

    assert not [pid for pid in server_pids + backend_pids if alive(pid)]
    assert not job_processes(slurm_service), "processes of the jobs survived"
    assert not sandbox_owners(owner_prefixes), "sandbox processes survived"
    assert not sandbox_directories(scratch, owner_prefixes), "sandbox directories survived"
    assert not sandbox_cgroups(owner_prefixes), "sandbox cgroups survived"
    for name in ("server-*-0.log", "server-*-1.log"):
        (log,) = (slurm_service.run_dir / "logs").glob(name)
        text = log.read_text(errors="replace")
        assert "pipeline stopped; 2 live jobs cancelled" in text, text  # graceful: its jobs were cancelled ...
        assert "Finished server process" in text  # ... and it exited by itself, before any SIGKILL
    assert "stopping the backends" in slurm_service.log(f"prorl-backends-{slurm_service.backends_job}.out")
