"""A real Slurm cluster on this machine (one node, or N nodes in network namespaces) and the rollout service
deploy/slurm/ launches on it, for the deployment tests and the Slurm benchmark (they pass the repository's
scripts in).

    with LocalSlurm(repo / "scripts/setup-slurm.sh") as cluster:       # munged, slurmctld, slurmd
        service = launch_service(cluster, repo / "deploy/slurm/launch.sh", run_dir, dev_engine_knobs())
        ... SyncRolloutClient.from_endpoints(service.endpoints_file) ...
        service.stop()                                                 # scancel, wait until both jobs are gone

The cluster lives under a temporary base directory and is stopped (by the PIDs its start recorded) when the
block ends. Knobs are deploy/slurm/config.sh's; `dev_engine_knobs` runs two rollout servers and two dev-engine
backends on the one node, one core per job. `LocalSlurm(script, nodes=3)` starts `start --nodes 3`: nodes
with their own network namespace, address and hostname (`node_names`, `node(name)`), which a test can kill
(`kill_node`), cut off the network (`cut_node`, `restore_node`) or run a command on (`run_on`);
`multinode_knobs` spreads the service over them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from prorl_server.protocol import Announcement, Endpoints, read_endpoints

HOLD_HANDLER = "prorl_server.testing.hold_handler:SandboxHoldHandler"
"""`--handler` of the jobs that hold a sandbox until cancelled (`data_source` "sandbox_hold")."""
SLURM_TOOLS = ("sbatch", "squeue", "scancel", "slurmctld", "slurmd", "munged")
NAMESPACE_TOOLS = ("ip", "nsenter", "unshare")
CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}  # bit numbers in /proc/self/status CapEff
LAUNCH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
IN_USE_EXIT = 4
"""`setup-slurm.sh start --nodes N` exit status: the namespace id, subnet or a node name is taken."""
SLOTS = 16
"""Distinct (id, subnet, node prefix) sets LocalSlurm tries, so that concurrent clusters do not collide."""


def missing_slurm() -> str | None:
    """Why a local Slurm cluster cannot run on this machine, or None."""
    absent = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; `bash scripts/setup-slurm.sh install` as root)"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts job steps as their owner)"
    return None


def missing_namespaces() -> str | None:
    """Why this machine cannot make the network and UTS namespaces of a multi-node cluster, or None."""
    absent = [tool for tool in NAMESPACE_TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} missing (iproute2, util-linux; `bash scripts/setup-slurm.sh install` as root)"
    if os.geteuid() != 0:
        return "a multi-node Slurm cluster needs root (network namespaces, slurmd)"
    status = Path("/proc/self/status").read_text()
    effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    lacking = [name for name, bit in CAPABILITIES.items() if not effective >> bit & 1]
    if lacking:
        return f"no {' and no '.join(lacking)} here (network and UTS namespaces need both)"
    done = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"`unshare --net --uts` fails here: {done.stderr.strip()}"
    return None


@dataclass(frozen=True)
class SlurmNode:
    """One node of a multi-node LocalSlurm: its name (its hostname too), address on the cluster's /24, network
    namespace, and the namespace and name of its link on the switch's bridge."""

    name: str
    address: str
    netns: str
    switch_netns: str
    bridge_port: str


class LocalSlurm:
    """`scripts/setup-slurm.sh start [--nodes N]` under a fresh base directory; `stop()` (or leaving the block)
    stops it. With `nodes` > 1 each node is a network + UTS namespace of its own (root only). `slurmd_timeout_s`
    is Slurm's SlurmdTimeout (its default, 30 s); a lost-node test takes less, so that a killed node is marked
    DOWN soon."""

    def __init__(self, setup_script: Path, nodes: int = 1, slurmd_timeout_s: int = 30) -> None:
        self.setup_script = setup_script
        self.node_count = nodes
        self.slurmd_timeout_s = slurmd_timeout_s
        """Slurm's SlurmdTimeout: how long a node may not answer before slurmctld marks it DOWN."""
        self.base = Path(tempfile.mkdtemp(prefix="prorl-slurm-"))
        self.base.chmod(0o755)  # munged wants every directory above its socket open to all
        self.env = {
            **os.environ,
            "PRORL_SLURM_BASE": str(self.base),
            "SLURM_CONF": str(self.base / "etc/slurm.conf"),
            "PRORL_SLURM_SLURMD_TIMEOUT": str(slurmd_timeout_s),
        }
        self._nodes: dict[str, SlurmNode] = {}
        self.setup_log = ""
        """The output of the last setup-script run (its timings, what it stopped)."""

    def __enter__(self) -> LocalSlurm:
        try:
            self.start()
        except BaseException:
            self.stop()  # whatever a failed start left (a multi-node start has rolled back already)
            raise
        return self

    def start(self) -> None:
        """Start the cluster; with several nodes, under the first namespace id, subnet and node-name prefix
        (`SLOTS` of them) that no other cluster on this machine uses."""
        if self.node_count == 1:
            self._setup("start")
        else:
            for slot in range(SLOTS):
                self.env.update(
                    PRORL_SLURM_ID=f"prs{slot}",
                    PRORL_SLURM_SUBNET=f"10.217.{slot + 1}",
                    PRORL_SLURM_PREFIX="n" if slot == 0 else f"c{slot}n",
                )
                if self._setup("start", "--nodes", str(self.node_count), in_use_ok=True):
                    break
            else:
                raise RuntimeError(f"all {SLOTS} namespace ids / subnets / node prefixes are in use")
        for line in (self.base / "run" / "nodes").read_text().splitlines():
            name, address, netns, switch_netns, port = line.split()
            self._nodes[name] = SlurmNode(name, address, netns, switch_netns, port)

    @property
    def node_names(self) -> list[str]:
        """The nodes' names, in order (n1, n2, ... with several nodes; this host's name with one)."""
        return list(self._nodes)

    def node(self, name: str) -> SlurmNode:
        """A node by name; ValueError for the one-node mode's node, which has no namespace of its own."""
        node = self._nodes[name]
        if node.netns == "-":
            raise ValueError(f"node {name} is this host (the one-node cluster has no namespaces)")
        return node

    def node_pids(self, name: str) -> list[int]:
        """The live processes in the node's network namespace (slurmd, job steps, what they started)."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.node(name).netns], capture_output=True, text=True, timeout=30
        )
        return [int(pid) for pid in done.stdout.split()]

    def kill_node(self, name: str, timeout_s: float = 10.0) -> list[int]:
        """SIGKILL every process in the node's namespace, by PID, until none is left (a lost node: its
        slurmd and everything its jobs ran); the PIDs killed."""
        killed: list[int] = []
        deadline = time.monotonic() + timeout_s
        while pids := self.node_pids(name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes {pids} still in {self.node(name).netns} after {timeout_s} s")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.append(pid)
            time.sleep(0.05)
        return killed

    def cut_node(self, name: str) -> None:
        """Take the node's link on the bridge down: a network partition (its processes keep running)."""
        self._link(name, "down")

    def restore_node(self, name: str) -> None:
        """Bring the node's link on the bridge back up."""
        self._link(name, "up")

    def _link(self, name: str, state: str) -> None:
        node = self.node(name)
        argv = ["ip", "-n", node.switch_netns, "link", "set", node.bridge_port, state]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)

    def run_on(self, name: str, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside the node's network namespace under its hostname, as slurmd's children see it,
        without Slurm (the cluster's environment unless `env=` is given); the caller waits for or kills it."""
        node = self.node(name)
        prefix = ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "sh", "-c"]
        script = 'hostname "$1" && shift && exec "$@"'
        return subprocess.Popen([*prefix, script, "sh", node.name, *argv], **{"env": self.env, **popen})

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Cancel every job, stop the daemons by their recorded PIDs, remove the base directory."""
        try:
            self._setup("stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def _setup(self, *args: str, in_use_ok: bool = False) -> bool:
        """Run the setup script; False when it said that the names or subnet are in use and `in_use_ok`."""
        done = subprocess.run(
            ["bash", str(self.setup_script), *args], env=self.env, capture_output=True, text=True, timeout=180
        )
        self.setup_log = done.stdout + done.stderr
        if in_use_ok and done.returncode == IN_USE_EXIT:
            return False
        if done.returncode != 0:
            raise RuntimeError(f"setup-slurm.sh {' '.join(args)} failed ({done.returncode}):\n{self.setup_log}")
        return True

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command (squeue, scancel, ...) against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm still lists (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()


def two_free_ports() -> int:
    """A port P such that P and P + 1 were both free a moment ago."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port


def dev_engine_knobs(**overrides: str) -> dict[str, str]:
    """deploy/slurm/ knobs for one node with 2 cores: 2 rollout servers (1 core) and 2 dev-engine backends
    (1 core), on loopback and announced as 127.0.0.1 (the hostname may resolve to another address), with this
    Python's prorl-server; `overrides` win."""
    prorl_server = Path(sys.executable).parent / "prorl-server"
    return {
        "PRORL_SERVER": str(prorl_server),
        "SERVER_NODES": "1",
        "SERVERS_PER_NODE": "2",
        "SERVER_CPUS_PER_NODE": "1",
        "SERVER_PORT": str(two_free_ports()),
        "SERVER_BIND": "127.0.0.1",
        "NODE_ADDRESS": "127.0.0.1",
        "BACKEND_NODES": "1",
        "GPUS_PER_NODE": "0",
        "BACKENDS_PER_NODE": "2",
        "BACKEND_CPUS_PER_NODE": "1",
        "BACKEND_PORT": str(two_free_ports()),
        "BACKEND_COMMAND": f'{prorl_server} dev-llm --host 127.0.0.1 --port "$PORT" --slots 1 --n-ctx 2048',
        "TIME_LIMIT": "15",
        "WATCH_INTERVAL": "1",
        "READY_TIMEOUT": "240",
        **overrides,
    }


def multinode_knobs(**overrides: str) -> dict[str, str]:
    """deploy/slurm/ knobs for a multi-node LocalSlurm: 2 server nodes (1 server each) and 1 backend node (2
    `prorl-server sim-llm` backends, 50 times faster than real time), whole nodes (`--exclusive`) so that the
    jobs land on different nodes, everything bound to 0.0.0.0 on fixed ports (each node has its own port space)
    and announced by hostname; `overrides` win."""
    prorl_server = Path(sys.executable).parent / "prorl-server"
    return {
        "PRORL_SERVER": str(prorl_server),
        "SERVER_NODES": "2",
        "SERVERS_PER_NODE": "1",
        "SERVER_CPUS_PER_NODE": "",
        "SERVER_PORT": "8000",
        "SERVER_BIND": "0.0.0.0",
        "NODE_ADDRESS": "",
        "BACKEND_NODES": "1",
        "GPUS_PER_NODE": "0",
        "BACKENDS_PER_NODE": "2",
        "BACKEND_CPUS_PER_NODE": "",
        "BACKEND_PORT": "8100",
        "BACKEND_COMMAND": f'{prorl_server} sim-llm --host 0.0.0.0 --port "$PORT" --time-scale 50',
        "TIME_LIMIT": "15",
        "WATCH_INTERVAL": "1",
        "READY_TIMEOUT": "120",
        **overrides,
    }


@dataclass
class Service:
    """A rollout service launched by deploy/slurm/launch.sh: its run directory and its two jobs."""

    cluster: LocalSlurm
    run_dir: Path
    servers_job: str
    backends_job: str
    knobs: dict[str, str]
    launch_output: str

    @property
    def endpoints_file(self) -> Path:
        """The endpoints file trainers read."""
        return self.run_dir / "endpoints.json"

    def endpoints(self) -> Endpoints:
        """The endpoints file, loaded."""
        return read_endpoints(self.endpoints_file)

    def announcements(self, role: str) -> list[Announcement]:
        """What each server (`role="server"`) or backend announced: address, host, PID."""
        directory = self.run_dir / ("servers" if role == "server" else "backends")
        return [Announcement.model_validate_json(f.read_bytes()) for f in sorted(directory.glob("*.json"))]

    def log(self, name: str) -> str:
        """A log file of the run (`<run_dir>/logs/<name>`)."""
        return (self.run_dir / "logs" / name).read_text(errors="replace")

    def gone(self) -> bool:
        """Slurm lists neither job any more."""
        return not {self.servers_job, self.backends_job} & set(self.cluster.jobs())

    def cancel(self, *jobs: str) -> None:
        """scancel the given jobs (default: both)."""
        self.cluster.run("scancel", *(jobs or [j for j in (self.servers_job, self.backends_job) if j]), check=False)

    def wait_gone(self, timeout_s: float = STOP_TIMEOUT_S) -> float:
        """Wait until Slurm lists neither job; returns the seconds it took. TimeoutError after `timeout_s`."""
        started = time.monotonic()
        while not self.gone():
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"jobs {self.servers_job}, {self.backends_job} still listed after {timeout_s} s")
            time.sleep(0.1)
        return time.monotonic() - started

    def stop(self) -> None:
        """scancel both jobs (if still there) and wait until they are gone."""
        if not self.gone():
            self.cancel()
            self.wait_gone()


def launch_service(cluster: LocalSlurm, launch_script: Path, run_dir: Path, knobs: dict[str, str]) -> Service:
    """Run launch.sh (which returns once the endpoints file is written) with these knobs and RUN_DIR."""
    env = {
        **cluster.env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cluster.env.get('PATH', '')}",
        "RUN_DIR": str(run_dir),
        **knobs,
    }
    done = subprocess.run(
        ["bash", str(launch_script)], env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    job_ids = [(run_dir / f"{name}.jobid") for name in ("servers", "backends")]
    servers_job, backends_job = (path.read_text().strip() if path.exists() else "" for path in job_ids)
    service = Service(cluster, run_dir, servers_job, backends_job, knobs, done.stdout + done.stderr)
    if done.returncode != 0:
        service.stop()
        raise RuntimeError(f"launch.sh failed ({done.returncode}):\n{service.launch_output}")
    return service
