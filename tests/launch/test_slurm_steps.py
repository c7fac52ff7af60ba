"""The Python steps of the Slurm deployment without Slurm: `prorl-server slurm announce` and `register` against
real servers and scripted backends on this machine, and the endpoints file the client reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_server.auth_key import API_KEY_FILE_ENV, load_or_create_api_key
from prorl_server.client import SyncRolloutClient
from prorl_server.launch.slurm import DeploymentError, announce, read_announcements, register
from prorl_server.protocol.endpoints import read_endpoints
from prorl_server.protocol.server import API_KEY_ENV


def announce_all(run_dir: Path, servers: list, backends: list) -> None:
    """Announce in-thread servers and backends (all of this process) as the node scripts would."""
    for i, server in enumerate(servers):
        announce(run_dir, "server", f"node-{i}", server.url, f"{server.url}/health", os.getpid(), 30)
    for i, backend in enumerate(backends):
        url = backend.server.url
        announce(run_dir, "backend", f"node-{i}", backend.address, f"{url}/health", os.getpid(), 30)


def test_register_gives_each_server_its_backends_and_writes_the_endpoints_file(
    tmp_path, start_server, start_backend, monkeypatch
):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    servers = [start_server(), start_server()]
    backends = [start_backend(), start_backend()]
    announce_all(tmp_path, servers, backends)
    assert [a.address for a in read_announcements(tmp_path, "server")] == [s.url for s in servers]

    endpoints = register(tmp_path, n_servers=2, n_backends=2, timeout_s=30)

    assert read_endpoints(tmp_path / "endpoints.json") == endpoints
    assert endpoints.servers == [s.url for s in servers]
    assert endpoints.job_ids == {"servers": "42", "backends": "42"}
    assert not endpoints.api_key_required
    for server in servers:  # all on one host: one backend each, registered with that server
        (assigned,) = endpoints.assignment[server.url]
        assert [b["address"] for b in server.http.get("/llm_servers").json()["servers"]] == [assigned]
    with SyncRolloutClient.from_endpoints(tmp_path / "endpoints.json", trust_env=False) as client:
        assert client.servers == endpoints.servers


def test_register_sends_the_users_key_and_the_endpoints_file_says_one_is_required(
    tmp_path, start_server, start_backend, monkeypatch
):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setenv(API_KEY_FILE_ENV, str(tmp_path / "config" / "api_key"))
    key, _ = load_or_create_api_key(tmp_path / "config" / "api_key")  # what `serve` given no key uses
    server, backend = start_server(api_key=key), start_backend()
    announce_all(tmp_path / "run", [server], [backend])

    endpoints = register(tmp_path / "run", n_servers=1, n_backends=1, timeout_s=30)

    assert endpoints.api_key_required
    listed = server.http.get("/llm_servers", headers={"Authorization": f"Bearer {key}"}).json()["servers"]
    assert [b["address"] for b in listed] == [backend.address]

    monkeypatch.setenv(API_KEY_ENV, "not-the-servers-key")  # wins over the key file, and is refused
    with pytest.raises(DeploymentError, match=r"registering the backends failed: .*HTTP 401"):
        register(tmp_path / "run", n_servers=1, n_backends=1, timeout_s=30)


def test_register_refuses_to_leave_a_server_without_a_backend(tmp_path, start_server, start_backend):
    announce_all(tmp_path, [start_server(), start_server()], [start_backend()])
    with pytest.raises(DeploymentError, match="2 rollout servers but only 1 backends"):
        register(tmp_path, n_servers=2, n_backends=1, timeout_s=30)
    assert not (tmp_path / "endpoints.json").exists()


def test_register_refuses_two_servers_announcing_one_address_and_names_both(tmp_path, start_server, start_backend):
    server = start_server()
    announce(tmp_path, "server", "n1-0", server.url, f"{server.url}/health", os.getpid(), 30)
    announce(tmp_path, "server", "n2-0", server.url, f"{server.url}/health", os.getpid(), 30)  # NODE_ADDRESS alike
    announce_all(tmp_path, [], [start_backend(), start_backend()])
    with pytest.raises(DeploymentError) as raised:
        register(tmp_path, n_servers=2, n_backends=2, timeout_s=30)
    message = str(raised.value)
    assert f"servers n1-0 (pid {os.getpid()} on {os.uname().nodename}) and n2-0" in message
    assert f"both announced {server.url}" in message and "NODE_ADDRESS" in message
    assert not (tmp_path / "endpoints.json").exists()
    assert not server.http.get("/llm_servers").json()["servers"]  # nothing was registered


def test_register_names_what_did_not_announce_itself(tmp_path, start_server):
    announce_all(tmp_path, [start_server()], [])
    with pytest.raises(DeploymentError, match=r"0 of 1 backends announced themselves"):
        register(tmp_path, n_servers=1, n_backends=1, timeout_s=1)


def test_announce_fails_when_the_process_exits_before_it_is_healthy(tmp_path):
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(exited.stdout)
    with pytest.raises(DeploymentError, match=f"process {dead_pid} exited before"):
        announce(tmp_path, "server", "n-0", "http://127.0.0.1:9", "http://127.0.0.1:9/health", dead_pid, 30)
    assert not read_announcements(tmp_path, "server")
