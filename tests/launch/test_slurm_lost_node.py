"""A node lost mid-step, on a real multi-node cluster (nodes as network namespaces, `LocalSlurm`): rollout
servers on two nodes and `sim-llm` backends on two others, the trainer's client on the host reaching them by
hostname. Killing every process of a server node (its slurmd too), or cutting its network, loses no finished
result: its unfinished jobs and groups finish on the live server under the same ids, each handed out once; a
replacement started on another node on the lost server's journal (a shared path) serves the results it had
finished; a lost backend node's calls fail over; a partitioned node that comes back is used again."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from repo_paths import TESTS

from prorl_server.client import FailoverPolicy, RetryPolicy, SyncOutcome, SyncRolloutClient
from prorl_server.testing.slurm import LocalSlurm

SLOW = f"{TESTS / 'handlers_for_tests.py'}:SlowStageHandler"
PORT = 8000
FAST = FailoverPolicy(heartbeat_s=0.5, probe_timeout_s=1.0, lost_after_s=3.0)
RECOVERY_BOUND_S = FAST.heartbeat_s + FAST.probe_timeout_s + FAST.lost_after_s


def job(run_s: float, **instance) -> dict:
    return {"instance": {"data_source": "slow", "run_s": run_s, **instance}, "sampling_params": {"max_tokens": 8}}


class Nodes:
    """Processes this test started on the cluster's nodes (outside Slurm, as a job step would run them),
    stopped by PID at the end."""

    def __init__(self, cluster: LocalSlurm, log_dir: Path) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.prorl_server = str(Path(sys.executable).parent / "prorl-server")

    def start(self, node: str, port: int, *argv: str) -> str:
        """`prorl-server ARGV --host 0.0.0.0 --port PORT` on `node`; its URL once `GET /health` answers."""
        log = (self.log_dir / f"{node}-{port}.log").open("w")
        proc = self.cluster.run_on(
            node, [self.prorl_server, *argv, "--host", "0.0.0.0", "--port", str(port)], stdout=log, stderr=log
        )
        self.procs.append(proc)
        url = f"http://{node}:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (self.log_dir / f"{node}-{port}.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code in (200, 503):
                    return url
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{url} not healthy in 120 s"
            time.sleep(0.2)

    def backend(self, node: str) -> str:
        """A simulated vLLM on `node` (each call some hundred ms); its /v1 address."""
        return self.start(node, 8100, "sim-llm", "--time-scale", "20") + "/v1"

    def server(self, node: str, backends: list[str], *options: str) -> str:
        """A rollout server on `node` with the slow test handler, registered with `backends`."""
        flags = [flag for address in backends for flag in ("--llm-server", address)]
        return self.start(
            node, PORT, "serve", "--no-entry-points", "--runtime", "local", "--handler", SLOW, *flags, *options
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def four_nodes(slurm_multinode_factory: Callable[[int], LocalSlurm], tmp_path: Path) -> Iterator[Nodes]:
    cluster = slurm_multinode_factory(4)
    nodes = Nodes(cluster, tmp_path)
    try:
        yield nodes
    finally:
        nodes.stop()


def test_a_server_node_killed_mid_step_loses_nothing_and_a_lost_backend_node_fails_over(four_nodes: Nodes):
    n1, n2, n3, n4 = four_nodes.cluster.node_names
    backends = [four_nodes.backend(n3), four_nodes.backend(n4)]
    servers = [four_nodes.server(n1, backends), four_nodes.server(n2, backends)]
    with SyncRolloutClient(servers, failover=FAST, trust_env=False) as client:
        job_ids = [client.jobs.submit(job(4.0, turns=2), server=url) for url in servers for _ in range(4)]
        group_ids = [client.groups.submit({**job(4.0), "n": 2}, server=url) for url in servers]
        wait_for(lambda: all(client.jobs.get(j).status.value == "run" for j in job_ids), 60, "every job in RUN")

        killed_at = time.monotonic()
        killed = four_nodes.cluster.kill_node(n2)  # the server node: slurmd, the server, its journal writer
        assert killed
        four_nodes.cluster.kill_node(n4)  # and a backend node: the calls in flight there fail over to n3
        results = client.jobs.collect(job_ids, timeout=120)
        groups = [client.groups.wait(g, timeout=120) for g in group_ids]
        recovered_s = time.monotonic() - killed_at

        assert Counter(r.job_id for r in results) == Counter(job_ids)  # every id exactly once
        assert all(r.status.value == "completed" for r in results), [r.error for r in results]
        assert all(g.status.value == "completed" and len(g.results) == 2 for g in groups), groups
        assert {client.jobs.server_of(j) for j in job_ids} == {servers[0]}
        rerun = [r for r in results if r.job_id in job_ids[4:]]  # n2's jobs, run again on n1 after the kills
        assert {turn.backend for r in rerun for turn in r.trajectory.turns} == {backends[0]}
        assert client.server_states() == {servers[0]: "live", servers[1]: "lost"}
        (recovery,) = client.recoveries
        assert recovery["jobs"] == 4 and recovery["groups"] == 1 and recovery["moved"] == 5
        assert recovery["seconds"] < RECOVERY_BOUND_S + 5.0, recovery
        print(
            f"lost node: its work moved {recovery['seconds']:.1f} s after its first failed probe; all done {recovered_s:.1f} s after the kill"
        )


def test_a_replacement_on_another_node_serves_the_lost_server_s_finished_results(four_nodes: Nodes, tmp_path: Path):
    n1, n2, n3, n4 = four_nodes.cluster.node_names
    journal = tmp_path / "shared" / "journal-n2.sqlite3"  # a path every node sees
    journal.parent.mkdir()
    backends = [four_nodes.backend(n4)]
    servers = [four_nodes.server(n1, backends), four_nodes.server(n2, backends, "--journal", str(journal))]
    patient = FailoverPolicy(heartbeat_s=0.5, probe_timeout_s=1.0, lost_after_s=300)  # the replacement comes first
    with SyncRolloutClient(servers, failover=patient, trust_env=False) as client:
        done = [client.jobs.submit(job(0.0), server=servers[1]) for _ in range(4)]
        running = [client.jobs.submit(job(60.0), server=servers[1]) for _ in range(2)]
        wait_for(lambda: all(client.jobs.get(j).result is not None for j in done), 60, "4 results on n2")
        four_nodes.cluster.kill_node(n2)
        replacement = four_nodes.server(n3, backends, "--journal", str(journal))
        client.replace_server(servers[1], replacement)
        results = client.jobs.collect(done, timeout=60)
        assert sorted(r.job_id for r in results) == sorted(done)
        assert all(r.status.value == "completed" for r in results)
        assert {client.jobs.server_of(j) for j in done} == {replacement}  # finished results lost: 0
        assert {client.jobs.server_of(j) for j in running} == {servers[0]}  # moved, not run on the replacement
        for job_id in running:
            client.jobs.cancel(job_id)


def test_a_partitioned_server_node_comes_back_and_is_used_again(four_nodes: Nodes):
    n1, n2, n3, _ = four_nodes.cluster.node_names
    backends = [four_nodes.backend(n3)]
    servers = [four_nodes.server(n1, backends), four_nodes.server(n2, backends)]
    with SyncRolloutClient(servers, failover=FAST, trust_env=False) as client:
        moved = [client.jobs.submit(job(5.0), server=servers[1]) for _ in range(3)]
        wait_for(lambda: all(client.jobs.get(j).status.value == "run" for j in moved), 60, "n2's jobs in RUN")
        four_nodes.cluster.cut_node(n2)
        try:
            wait_for(lambda: client.server_states()[servers[1]] == "lost", 30, "n2 lost")
            wait_for(lambda: all(client.jobs.server_of(j) == servers[0] for j in moved), 30, "n2's jobs moved")
        finally:
            four_nodes.cluster.restore_node(n2)
        wait_for(lambda: client.server_states()[servers[1]] == "live", 30, "n2 back in placement")
        results = client.jobs.collect(moved, timeout=60)
        assert [r.status.value for r in results] == ["completed"] * 3
        assert {client.jobs.server_of(j) for j in moved} == {servers[0]}
        again = client.jobs.submit_many([job(0.0) for _ in range(8)])
        assert servers[1] in {client.jobs.server_of(j) for j in again}
        assert len(client.jobs.collect(again, timeout=60)) == 8


def test_one_weight_update_over_every_node_fences_a_cut_off_node_until_it_catches_up(four_nodes: Nodes):
    n1, n2, n3, _ = four_nodes.cluster.node_names
    backends = [four_nodes.backend(n3)]
    servers = [four_nodes.server(n1, backends), four_nodes.server(n2, backends)]
    patient = FailoverPolicy(heartbeat_s=0.5, probe_timeout_s=1.0, lost_after_s=300)
    quick = RetryPolicy(attempts=2, budget_s=3.0)
    with SyncRolloutClient(servers, failover=patient, retry=quick, trust_env=False) as client:
        first = client.weights.update_all(1)
        assert first.with_outcome(SyncOutcome.REACHED) == servers, first.summary()
        four_nodes.cluster.cut_node(n2)
        try:
            second = client.weights.update_all(2, lease_s=30)
            assert second.with_outcome(SyncOutcome.REACHED) == [servers[0]], second.summary()
            assert second.fenced == {servers[1]: 2}
            job_ids = client.jobs.submit_many([job(0.0) for _ in range(4)])  # none to the fenced node
            assert {client.jobs.server_of(j) for j in job_ids} == {servers[0]}
            assert len(client.jobs.collect(job_ids, timeout=60)) == 4
        finally:
            four_nodes.cluster.restore_node(n2)
        wait_for(lambda: client.server_states()[servers[1]] == "live", 60, "n2 caught up and unfenced")
        versions = {server: status.version for server, status in client.weights.status().items()}
        assert versions == {servers[0]: 2, servers[1]: 2}
        assert not any(status.paused for status in client.weights.status().values())
