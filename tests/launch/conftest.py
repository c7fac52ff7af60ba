"""Real Slurm clusters (scripts/setup-slurm.sh) and the rollout service deploy/slurm/launch.sh starts on them
(harness: prorl_server.testing.slurm): `slurm_cluster`, one node, with `slurm_service` (the dev engine as the
LLM backend), and `slurm_multinode`, three nodes in network namespaces (`slurm_multinode_factory` for a
cluster of a test's own, of any size).

The fixtures of the tests in this folder. The session's clusters start once and are stopped at the
end by the PIDs their start recorded. The tests skip where Slurm is not installed or they do not run as
root (slurmd needs root), and the multi-node ones where namespaces cannot be made; with
`PRORL_REQUIRE_SLURM=1` (set by scripts/test.sh, which installs Slurm as root) or `CI=true` they fail instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from repo_paths import REPO

from prorl_server.testing.slurm import (
    HOLD_HANDLER,
    LocalSlurm,
    Service,
    dev_engine_knobs,
    launch_service,
    missing_namespaces,
    missing_slurm,
)

ROOT = REPO
REQUIRE_SLURM_ENV = "PRORL_REQUIRE_SLURM"


MULTINODE_NODES = 3


def skip_or_fail(problem: str | None) -> None:
    """Skip the test for `problem` (nothing when None); fail instead under PRORL_REQUIRE_SLURM=1 or CI=true."""
    if problem:
        if os.environ.get(REQUIRE_SLURM_ENV) == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{REQUIRE_SLURM_ENV}=1 or CI=true, but: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    """munged, slurmctld and slurmd under a temporary directory, one idle node; stopped at the end."""
    skip_or_fail(missing_slurm())
    with LocalSlurm(ROOT / "scripts" / "setup-slurm.sh") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_multinode() -> Iterator[LocalSlurm]:
    """Three idle nodes (`node_names`, e.g. n1 n2 n3), each its own network namespace, address and hostname;
    stopped at the end of the session, which fails if anything (a process, namespace, link or /etc/hosts
    line) was left behind. Shared by the session's tests: one that kills or cuts off a node takes
    `slurm_multinode_factory` instead."""
    skip_or_fail(missing_slurm() or missing_namespaces())
    with LocalSlurm(ROOT / "scripts" / "setup-slurm.sh", nodes=MULTINODE_NODES) as cluster:
        yield cluster


@pytest.fixture
def slurm_multinode_factory() -> Iterator[Callable[..., LocalSlurm]]:
    """`make(nodes, slurmd_timeout_s=30)`: a started multi-node cluster of the test's own (nodes >= 2), stopped
    when the test ends; several can run at once (each gets its own namespace ids, subnet and node names)."""
    skip_or_fail(missing_slurm() or missing_namespaces())
    script = ROOT / "scripts" / "setup-slurm.sh"
    with ExitStack() as clusters:
        yield lambda nodes, slurmd_timeout_s=30: clusters.enter_context(
            LocalSlurm(script, nodes=nodes, slurmd_timeout_s=slurmd_timeout_s)
        )


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
