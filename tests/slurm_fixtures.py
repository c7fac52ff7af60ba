"""A real single-node Slurm cluster (scripts/setup-slurm.sh) and the rollout service launched on it by
deploy/slurm/launch.sh, with the dev engine as the LLM backend.

Load with `pytest_plugins = ("slurm_fixtures",)`. The cluster starts once per test session under a
temporary base directory and is stopped at the end by the PIDs its start recorded. The tests skip where
Slurm is not installed or the tests do not run as root (slurmd needs root); with `PRORL_REQUIRE_SLURM=1` or
`CI=true` (scripts/test.sh installs Slurm) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from polling import wait_for

from prorl_server.protocol.endpoints import Announcement, Endpoints, read_endpoints

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup-slurm.sh"
LAUNCH = ROOT / "deploy" / "slurm" / "launch.sh"
REQUIRE_SLURM_ENV = "PRORL_REQUIRE_SLURM"
API_KEY = "slurm-test-key"
LAUNCH_TIMEOUT_S = 300.0


def slurm_required() -> bool:
    """Whether a missing Slurm is a failure here (CI, or scripts/test.sh after installing it)."""
    return os.environ.get(REQUIRE_SLURM_ENV) == "1" or os.environ.get("CI") == "true"


def missing_slurm() -> str | None:
    """Why a local Slurm cluster cannot run on this machine, or None."""
    absent = [tool for tool in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(tool) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; `bash scripts/setup-slurm.sh install` as root)"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd runs job steps as their owner)"
    return None


@dataclass
class SlurmCluster:
    """The running test cluster: the environment its clients need."""

    base: Path
    env: dict[str, str]

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command (squeue, scancel, ...) against this cluster; its stdout."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm still lists (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd under a temporary directory, one idle node; stopped at the end."""
    problem = missing_slurm()
    if problem:
        if slurm_required():
            pytest.fail(f"{REQUIRE_SLURM_ENV}=1 or CI=true, but: {problem}")
        pytest.skip(problem)
    base = Path(tempfile.mkdtemp(prefix="prorl-slurm-test-"))
    base.chmod(0o755)  # munged wants every directory above its socket open to all
    env = {**os.environ, "PRORL_SLURM_BASE": str(base), "SLURM_CONF": str(base / "etc" / "slurm.conf")}
    started = subprocess.run(["bash", str(SETUP), "start"], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, f"setup-slurm.sh start failed:\n{started.stdout}\n{started.stderr}"
        yield SlurmCluster(base, env)
    finally:
        stopped = subprocess.run(["bash", str(SETUP), "stop"], env=env, capture_output=True, text=True, timeout=180)
        assert stopped.returncode == 0, f"setup-slurm.sh stop failed:\n{stopped.stdout}\n{stopped.stderr}"
        shutil.rmtree(base, ignore_errors=True)


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


@dataclass
class Service:
    """A rollout service launched by deploy/slurm/launch.sh."""

    cluster: SlurmCluster
    run_dir: Path
    servers_job: str
    backends_job: str
    launch_output: str
    api_key: str = API_KEY

    @property
    def endpoints_file(self) -> Path:
        return self.run_dir / "endpoints.json"

    def endpoints(self) -> Endpoints:
        return read_endpoints(self.endpoints_file)

    def announcements(self, role: str) -> list[Announcement]:
        directory = self.run_dir / ("servers" if role == "server" else "backends")
        return [Announcement.model_validate_json(f.read_bytes()) for f in sorted(directory.glob("*.json"))]

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / name).read_text(errors="replace")

    def gone(self) -> bool:
        """Neither job is listed by Slurm any more."""
        return not {self.servers_job, self.backends_job} & set(self.cluster.jobs())

    def stop(self) -> None:
        """scancel both jobs (if still there) and wait until Slurm lists neither."""
        jobs = [job for job in (self.servers_job, self.backends_job) if job]
        if jobs:
            self.cluster.run("scancel", *jobs, check=False)
            wait_for(self.gone, 120, f"jobs {jobs} gone", interval=0.2)


def launch_service(cluster: SlurmCluster, run_dir: Path, **knobs: str) -> Service:
    """Run deploy/slurm/launch.sh with the dev engine as the backend: 2 rollout servers and 2 backends on the
    one node, 1 core for each job (the machine has 2), an API key, the test's sandbox-holding handler."""
    server_port, backend_port = two_free_ports(), two_free_ports()
    bin_dir = Path(sys.executable).parent
    env = {
        **cluster.env,
        "PATH": f"{bin_dir}{os.pathsep}{cluster.env.get('PATH', '')}",
        "PRORL_API_KEY": API_KEY,
        "RUN_DIR": str(run_dir),
        "PRORL_SERVER": str(bin_dir / "prorl-server"),
        "SERVER_NODES": "1",
        "SERVERS_PER_NODE": "2",
        "SERVER_CPUS_PER_NODE": "1",
        "SERVER_PORT": str(server_port),
        "SERVER_BIND": "127.0.0.1",
        "SERVER_ARGS": f"--handler {Path(__file__).parent / 'slurm_handler.py'}:SandboxHoldHandler",
        "BACKEND_NODES": "1",
        "GPUS_PER_NODE": "0",
        "BACKENDS_PER_NODE": "2",
        "BACKEND_CPUS_PER_NODE": "1",
        "BACKEND_PORT": str(backend_port),
        "BACKEND_COMMAND": f'{bin_dir / "prorl-server"} dev-llm --host 127.0.0.1 --port "$PORT" --slots 1 --n-ctx 2048',
        "TIME_LIMIT": "15",
        "WATCH_INTERVAL": "1",
        "READY_TIMEOUT": "240",
        **knobs,
    }
    done = subprocess.run(["bash", str(LAUNCH)], env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    servers_job = (run_dir / "servers.jobid").read_text().strip() if (run_dir / "servers.jobid").exists() else ""
    backends_job = (run_dir / "backends.jobid").read_text().strip() if (run_dir / "backends.jobid").exists() else ""
    service = Service(cluster, run_dir, servers_job, backends_job, done.stdout + done.stderr)
    if done.returncode != 0:
        service.stop()
        raise AssertionError(f"launch.sh failed ({done.returncode}):\n{service.launch_output}")
    return service


@pytest.fixture
def slurm_service(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Service]:
    """A freshly launched rollout service; cancelled (if still running) when the test ends."""
    service = launch_service(slurm_cluster, tmp_path / "run")
    try:
        yield service
    finally:
        service.stop()
