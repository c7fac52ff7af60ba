"""The Slurm deployment (deploy/slurm/) across the nodes of a real 3-node Slurm cluster on this machine (each
node a network + UTS namespace with its own address and hostname; `slurm_multinode`): rollout servers on two
nodes, LLM backends on the third, registered across nodes and reached from the host by hostname; rollouts
whose bubblewrap sandboxes run on the server nodes; `scancel` leaving nothing on any node; a lost server node
and a lost backend node costing only their own part of the service."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from polling import wait_for
from repo_paths import REPO, TESTS
from slurm_leaks import (
    alive,
    all_running,
    job_processes,
    sandbox_cgroups,
    sandbox_directories,
    sandbox_owners,
)

from prorl_server.auth_key import read_api_key
from prorl_server.client import FailoverPolicy, SyncRolloutClient
from prorl_server.protocol.endpoints import Announcement
from prorl_server.testing.slurm import HOLD_HANDLER, LocalSlurm, Service, launch_service, multinode_knobs

ROOT = REPO
COMMAND_HANDLER = "prorl_server.testing.hold_handler:SandboxCommandHandler"
COMMAND_JOB = {"instance": {"data_source": "sandbox_command", "a": 6, "b": 7}, "sampling_params": {"max_tokens": 8}}
SLOW_HANDLER = f"{TESTS / 'handlers_for_tests.py'}:SlowStageHandler"
SLOW_JOB = {"instance": {"data_source": "slow", "run_s": 3.0, "turns": 2}, "sampling_params": {"max_tokens": 8}}
FAST_FAILOVER = FailoverPolicy(heartbeat_s=0.5, probe_timeout_s=1.0, lost_after_s=3.0)
SLURMD_TIMEOUT_S = 5


@pytest.fixture
def scratch() -> Iterator[str]:
    """A short sandbox directory (a sandbox's socket path must fit in 107 bytes; tmp_path is long)."""
    path = tempfile.mkdtemp(prefix="scr-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def launch(cluster: LocalSlurm, run_dir: Path, scratch: str, **overrides: str) -> Service:
    """launch.sh across the cluster's nodes with the test handlers, real bubblewrap sandboxes in `scratch` and
    the API key from a key file of the test's (made by the first server); `overrides` win."""
    knobs = multinode_knobs(
        **{
            "PRORL_API_KEY": "",
            "PRORL_API_KEY_FILE": str(run_dir.parent / "config" / "api_key"),
            "SANDBOX_RUNTIME": "bwrap",
            "SANDBOX_DIR": scratch,
            "SERVER_ARGS": f"--handler {HOLD_HANDLER} --handler {COMMAND_HANDLER}",
            **overrides,
        }
    )
    return launch_service(cluster, ROOT / "deploy" / "slurm" / "launch.sh", run_dir, knobs)


def host_of(url: str) -> str:
    """The host name of a URL."""
    return urlsplit(url).hostname or ""


def stray_processes(cluster: LocalSlurm) -> dict[str, list[str]]:
    """Per node, the processes in its namespace other than its slurmd (pid and command)."""
    stray = {}
    for node in cluster.node_names:
        found = []
        for pid in cluster.node_pids(node):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm != "slurmd" and alive(pid):
                found.append(f"{pid} {comm}")
        if found:
            stray[node] = found
    return stray


def test_servers_on_two_nodes_get_backends_of_the_third_serve_sandboxed_rollouts_and_scancel_leaves_nothing(
    slurm_multinode: LocalSlurm, tmp_path: Path, scratch: str
):
    service = launch(slurm_multinode, tmp_path / "run", scratch)
    try:
        endpoints = service.endpoints()
        server_nodes = [host_of(url) for url in endpoints.servers]
        (backend_node,) = {host_of(url) for url in endpoints.backends}
        # named by hostname, on two distinct nodes; the backends on the third
        assert sorted([*server_nodes, backend_node]) == sorted(slurm_multinode.node_names)
        assert sorted(a.host for a in service.announcements("server")) == sorted(server_nodes)
        assert [a.host for a in service.announcements("backend")] == [backend_node] * 2
        # cross-node registration: each server got one backend, from the other node
        for server, assigned in endpoints.assignment.items():
            assert len(assigned) == 1 and host_of(assigned[0]) == backend_node != host_of(server)
        assert sorted(b for assigned in endpoints.assignment.values() for b in assigned) == sorted(endpoints.backends)

        key_file = Path(service.knobs["PRORL_API_KEY_FILE"])
        api_key = read_api_key(key_file)  # one key, made by the first server, used by both
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and endpoints.api_key_required
        for server in endpoints.servers:
            assert httpx.get(f"{server}/status", timeout=30, trust_env=False).status_code == 401
            listed = httpx.get(
                f"{server}/llm_servers", headers={"Authorization": f"Bearer {api_key}"}, timeout=30, trust_env=False
            )
            assert [s["address"] for s in listed.json()["servers"]] == endpoints.assignment[server]

        with SyncRolloutClient.from_endpoints(service.endpoints_file, api_key=api_key, trust_env=False) as client:
            job_ids = client.jobs.submit_many(COMMAND_JOB for _ in range(4))
            results = client.jobs.collect(job_ids)
            servers_of = [client.jobs.server_of(job_id) for job_id in job_ids]
        assert set(servers_of) == set(endpoints.servers)  # spread over both nodes
        for result in results:  # in completion order
            server = servers_of[job_ids.index(result.job_id)]
            assert result.status.value == "completed", result.error
            assert result.reward == 1.0 and result.artifacts["output"] == "42"  # computed in its sandbox ...
            assert result.artifacts["server_host"] == host_of(server)  # ... on its server's node
            trajectory = result.trajectory
            assert trajectory.response_ids and len(trajectory.response_logprobs) == len(trajectory.response_ids)
            assert [t.backend for t in trajectory.turns] == endpoints.assignment[server]

        # scancel with a sandbox held on each server node: nothing may be left on any node
        server_pids = [a.pid for a in service.announcements("server")]
        backend_pids = [a.pid for a in service.announcements("backend")]
        owners = tuple(f"prorl-{pid}-" for pid in server_pids)
        with SyncRolloutClient.from_endpoints(service.endpoints_file, api_key=api_key, trust_env=False) as client:
            holding = [
                client.jobs.submit({"instance": {"data_source": "sandbox_hold"}}, server=server)
                for server in endpoints.servers
            ]
            wait_for(lambda: all_running(client, holding), 120, "the holding jobs in RUN")
        wait_for(lambda: len(sandbox_owners(owners)) == 2, 60, "a sandbox on each server node")
        sandboxes = Path(scratch) / f"prorl-sandboxes-{os.geteuid()}"
        assert len(sandbox_directories(sandboxes, owners)) == 2

        service.cancel(service.servers_job)
        wait_for(service.gone, 120, "both jobs gone after scancel", interval=0.2)
        wait_for(lambda: not stray_processes(slurm_multinode), 30, "no process but slurmd on any node")
        assert not [pid for pid in server_pids + backend_pids if alive(pid)]
        assert not job_processes(service), "processes of the jobs survived"
        assert not sandbox_owners(owners), "sandbox processes survived"
        assert not sandbox_directories(sandboxes, owners), "sandbox directories survived"
        assert not sandbox_cgroups(owners), "sandbox cgroups survived"
        for node in server_nodes:
            assert "pipeline stopped; 1 live jobs cancelled" in service.log(f"server-{node}-0.log")
    finally:
        service.stop()


def test_a_dev_engine_backend_node_serves_rollouts_with_its_token_ids_and_logprobs(
    slurm_multinode: LocalSlurm, tmp_path: Path, scratch: str
):
    prorl_server = multinode_knobs()["PRORL_SERVER"]
    service = launch(
        slurm_multinode,
        tmp_path / "run",
        scratch,
        SERVER_NODES="1",
        BACKENDS_PER_NODE="1",
        BACKEND_COMMAND=f'{prorl_server} dev-llm --host 0.0.0.0 --port "$PORT" --slots 1 --n-ctx 2048',
        READY_TIMEOUT="240",
    )
    try:
        endpoints = service.endpoints()
        ((server, (backend,)),) = endpoints.assignment.items()
        assert host_of(server) != host_of(backend)
        models = httpx.get(f"{backend}/models", timeout=30, trust_env=False).json()["data"]
        assert "smollm2" in models[0]["id"].lower()  # the dev engine, by hostname from the host
        api_key = read_api_key(Path(service.knobs["PRORL_API_KEY_FILE"]))
        with SyncRolloutClient.from_endpoints(service.endpoints_file, api_key=api_key, trust_env=False) as client:
            results = client.jobs.collect(client.jobs.submit_many(COMMAND_JOB for _ in range(2)))
        for result in results:
            assert result.status.value == "completed", result.error
            assert result.reward == 1.0 and result.artifacts["server_host"] == host_of(server)
            trajectory = result.trajectory
            assert [t.backend for t in trajectory.turns] == [backend]
            assert 0 < len(trajectory.response_ids) <= 8
            assert len(trajectory.response_logprobs) == len(trajectory.response_ids)
            assert all(lp <= 0.0 for lp in trajectory.response_logprobs) and any(
                lp < 0 for lp in trajectory.response_logprobs
            )
    finally:
        service.stop()


def test_two_nodes_announcing_one_address_fail_the_launch_with_a_message_naming_both(
    slurm_multinode: LocalSlurm, tmp_path: Path, scratch: str
):
    # NODE_ADDRESS=127.0.0.1 on two server nodes: each node's own server answers its health check there
    with pytest.raises(RuntimeError) as raised:
        launch(slurm_multinode, tmp_path / "run", scratch, NODE_ADDRESS="127.0.0.1")
    (first, second) = sorted(a.host for a in announcements(tmp_path / "run", "servers"))
    assert f"servers {first}-0 (pid " in str(raised.value) and f"and {second}-0 (pid " in str(raised.value)
    assert "both announced http://127.0.0.1:8000" in str(raised.value)
    assert not (tmp_path / "run" / "endpoints.json").exists()
    wait_for(lambda: not stray_processes(slurm_multinode), 30, "no process but slurmd on any node")


def announcements(run_dir: Path, directory: str) -> list[Announcement]:
    """The announcements in `run_dir/directory`."""
    return [Announcement.model_validate_json(f.read_bytes()) for f in sorted((run_dir / directory).glob("*.json"))]


def test_node_helpers_run_on_cut_restore_and_kill_a_node_and_stop_leaves_nothing(slurm_multinode_factory):
    cluster = slurm_multinode_factory(2)
    first, second = cluster.node_names
    assert (
        cluster.run_on(first, ["hostname"], stdout=subprocess.PIPE, text=True).communicate(timeout=30)[0]
        == f"{first}\n"
    )
    server = cluster.run_on(
        second, [sys.executable, "-m", "http.server", "8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://{second}:8000/"
    try:
        wait_for(lambda: reachable(url), 30, f"{url} from the host")
        assert server.pid in cluster.node_pids(second) and server.pid not in cluster.node_pids(first)
        cluster.cut_node(second)
        assert not reachable(url)
        cluster.restore_node(second)
        wait_for(lambda: reachable(url), 30, f"{url} again")
        killed = cluster.kill_node(second)  # slurmd and the server
        assert server.pid in killed and not cluster.node_pids(second)
        assert server.wait(timeout=10) == -signal.SIGKILL
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    namespaces = [cluster.node(name).netns for name in cluster.node_names]
    cluster.stop()  # fails if anything was left
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [ns for ns in namespaces if ns in listed.split()]
    hosts = Path("/etc/hosts").read_text().split()
    assert first not in hosts and second not in hosts


def reachable(url: str) -> bool:
    """Whether `url` answers within a second."""
    try:
        return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_lost_server_node_and_a_lost_backend_node_cost_only_their_own_part_of_the_service(
    slurm_multinode_factory: Callable[..., LocalSlurm], tmp_path: Path, scratch: str
):
    cluster = slurm_multinode_factory(4, slurmd_timeout_s=SLURMD_TIMEOUT_S)
    service = launch(
        cluster,
        tmp_path / "run",
        scratch,
        BACKEND_NODES="2",
        BACKENDS_PER_NODE="2",
        SERVER_ARGS=f"--handler {SLOW_HANDLER}",
    )
    try:
        endpoints = service.endpoints()
        # the node running a job's batch script (its first) is the exception: kill each job's other node
        servers_batch, backends_batch = (
            batch_host(cluster, job) for job in (service.servers_job, service.backends_job)
        )
        (survivor,) = [url for url in endpoints.servers if host_of(url) == servers_batch]
        (lost_server,) = set(endpoints.servers) - {survivor}
        lost_backend_node = next(host_of(b) for b in endpoints.backends if host_of(b) != backends_batch)
        assert {host_of(b) for b in endpoints.assignment[survivor]} == {backends_batch, lost_backend_node}
        api_key = read_api_key(Path(service.knobs["PRORL_API_KEY_FILE"]))
        options = {"api_key": api_key, "trust_env": False, "failover": FAST_FAILOVER}

        with SyncRolloutClient.from_endpoints(service.endpoints_file, **options) as client:
            job_ids = [client.jobs.submit(SLOW_JOB, server=server) for server in endpoints.servers for _ in range(3)]
            wait_for(lambda: all_running(client, job_ids), 60, "every job in RUN")
            cluster.kill_node(host_of(lost_server))
            cluster.kill_node(lost_backend_node)  # both at once: Slurm's two DOWN waits overlap
            results = client.jobs.collect(job_ids, timeout=60)
            assert sorted(r.job_id for r in results) == sorted(job_ids)
            assert all(r.status.value == "completed" for r in results), [r.error for r in results]
            assert {client.jobs.server_of(j) for j in job_ids} == {survivor}  # the lost server's 3 moved
            assert client.server_states() == {survivor: "live", lost_server: "lost"}

        # Slurm marks both nodes DOWN after SlurmdTimeout and takes them out of their jobs, which go on
        wait_for(lambda: down_nodes(cluster) == {host_of(lost_server), lost_backend_node}, 60, "both nodes DOWN")
        time.sleep(3 * float(service.knobs["WATCH_INTERVAL"]))  # time for either job's watch to end it
        assert job_nodes(cluster) == {service.servers_job: servers_batch, service.backends_job: backends_batch}
        assert httpx.get(f"{survivor}/health", timeout=5, trust_env=False).status_code == 200
        assert "the servers on " + host_of(lost_server) + " exited" in service.log(
            f"prorl-servers-{service.servers_job}.out"
        )

        # a new client of the endpoints file, which still names the lost server: it finds that one lost
        with SyncRolloutClient.from_endpoints(service.endpoints_file, **options) as client:
            results = client.jobs.collect(client.jobs.submit_many(SLOW_JOB for _ in range(4)), timeout=60)
            assert all(r.status.value == "completed" for r in results), [r.error for r in results]
            backends = {turn.backend for r in results for turn in r.trajectory.turns}
        assert {host_of(b) for b in backends} == {backends_batch}  # the survivor's backend on the lost node failed over

        server_pid = next(a.pid for a in service.announcements("server") if a.host == servers_batch)
        service.cancel(service.servers_job)
        wait_for(service.gone, 60, "both jobs gone after scancel", interval=0.2)
        wait_for(lambda: not stray_processes(cluster), 30, "no process but slurmd on any node")
        assert not alive(server_pid) and not job_processes(service), "processes of the jobs survived"
        assert "pipeline stopped" in service.log(f"server-{servers_batch}-0.log")
    finally:
        service.stop()


def batch_host(cluster: LocalSlurm, job: str) -> str:
    """The node that runs the job's batch script."""
    fields = dict(field.split("=", 1) for field in cluster.run("scontrol", "show", "job", job).split() if "=" in field)
    return fields["BatchHost"]


def down_nodes(cluster: LocalSlurm) -> set[str]:
    """The nodes Slurm has marked DOWN."""
    return set(cluster.run("sinfo", "-h", "-N", "-t", "down", "-o", "%N").split())


def job_nodes(cluster: LocalSlurm) -> dict[str, str]:
    """Each running job's node list."""
    return dict(line.split() for line in cluster.run("squeue", "-h", "-t", "running", "-o", "%i %N").splitlines())
