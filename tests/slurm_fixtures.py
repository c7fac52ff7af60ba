"""A real single-node Slurm cluster (scripts/setup-slurm.sh) and the rollout service deploy/slurm/launch.sh
starts on it, with the dev engine as the LLM backend (harness: prorl_server.testing.slurm).

Load with `pytest_plugins = ("slurm_fixtures",)`. The cluster starts once per test session and is stopped at
the end by the PIDs its start recorded. The tests skip where Slurm is not installed or they do not run as
root (slurmd needs root); with `PRORL_REQUIRE_SLURM=1` (set by scripts/test.sh, which installs Slurm as root)
or `CI=true` they fail instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorl_server.testing.slurm import (
    HOLD_HANDLER,
    LocalSlurm,
    Service,
    dev_engine_knobs,
    launch_service,
    missing_slurm,
)

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_SLURM_ENV = "PRORL_REQUIRE_SLURM"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    """munged, slurmctld and slurmd under a temporary directory, one idle node; stopped at the end."""
    problem = missing_slurm()
    if problem:
        if os.environ.get(REQUIRE_SLURM_ENV) == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{REQUIRE_SLURM_ENV}=1 or CI=true, but: {problem}")
        pytest.skip(problem)
    with LocalSlurm(ROOT / "scripts" / "setup-slurm.sh") as cluster:
        yield cluster


@pytest.fixture
def slurm_service(slurm_cluster: LocalSlurm, tmp_path: Path) -> Iterator[Service]:
    """A freshly launched service: 2 rollout servers (with the default API key, from a key file of the test's
    that the first server to start makes, the sandbox-holding test handler and a sandbox directory of the
    test's, as a node's local scratch) and 2 dev-engine backends on the one node; cancelled, if still running,
    when the test ends."""
    # short: a sandbox's Unix socket path must fit in 107 bytes, and pytest's tmp_path is long
    scratch = tempfile.mkdtemp(prefix="scr-")
    knobs = dev_engine_knobs(
        PRORL_API_KEY="",  # none: the servers use the key file
        PRORL_API_KEY_FILE=str(tmp_path / "config" / "api_key"),
        SANDBOX_DIR=scratch,
        SERVER_ARGS=f"--handler {HOLD_HANDLER}",
    )
    service = launch_service(slurm_cluster, ROOT / "deploy" / "slurm" / "launch.sh", tmp_path / "run", knobs)
    try:
        yield service
    finally:
        service.stop()
        shutil.rmtree(scratch, ignore_errors=True)
