"""A real single-node Slurm cluster and the rollout service deploy/slurm/ launches on it, for the deployment
tests and the Slurm benchmark (they pass the repository's scripts in).

    with LocalSlurm(repo / "scripts/setup-slurm.sh") as cluster:       # munged, slurmctld, slurmd
        service = launch_service(cluster, repo / "deploy/slurm/launch.sh", run_dir, dev_engine_knobs())
        ... SyncRolloutClient.from_endpoints(service.endpoints_file) ...
        service.stop()                                                 # scancel, wait until both jobs are gone

The cluster lives under a temporary base directory and is stopped (by the PIDs its start recorded) when the
block ends. Knobs are deploy/slurm/config.sh's; `dev_engine_knobs` runs two rollout servers and two dev-engine
backends on the one node, one core per job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from prorl_server.protocol.endpoints import Announcement, Endpoints, read_endpoints

HOLD_HANDLER = "prorl_server.testing.hold_handler:SandboxHoldHandler"
"""`--handler` of the jobs that hold a sandbox until cancelled (`data_source` "sandbox_hold")."""
SLURM_TOOLS = ("sbatch", "squeue", "scancel", "slurmctld", "slurmd", "munged")
LAUNCH_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0


def missing_slurm() -> str | None:
    """Why a local Slurm cluster cannot run on this machine, or None."""
    absent = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing; `bash scripts/setup-slurm.sh install` as root)"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts job steps as their owner)"
    return None


class LocalSlurm:
    """`scripts/setup-slurm.sh start` under a fresh base directory; `stop()` (or leaving the block) stops it."""

    def __init__(self, setup_script: Path) -> None:
        self.setup_script = setup_script
        self.base = Path(tempfile.mkdtemp(prefix="prorl-slurm-"))
        self.base.chmod(0o755)  # munged wants every directory above its socket open to all
        self.env = {**os.environ, "PRORL_SLURM_BASE": str(self.base), "SLURM_CONF": str(self.base / "etc/slurm.conf")}

    def __enter__(self) -> LocalSlurm:
        self._setup("start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Cancel every job, stop the daemons by their recorded PIDs, remove the base directory."""
        try:
            self._setup("stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def _setup(self, action: str) -> None:
        done = subprocess.run(
            ["bash", str(self.setup_script), action], env=self.env, capture_output=True, text=True, timeout=180
        )
        if done.returncode != 0:
            raise RuntimeError(f"setup-slurm.sh {action} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

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
