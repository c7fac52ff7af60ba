"""Shared sandbox fixtures: real runtimes, parametrized by name; every sandbox closed and checked at teardown.

Test modules load them with `pytest_plugins = ("sandbox_fixtures",)` and reach the helpers through the
harness, so this module is imported once, by pytest (which rewrites its asserts).

- `isolated`: a `Harness` per isolating runtime (the isolation, limit and reaper tests run against each).
- `any_runtime`: a `Harness` per runtime, local included (lifecycle tests).

Adding a runtime to every parametrized test is one line in CASES. A runtime that is not available on this
machine is skipped with its reason (for bwrap: not installed, or no unprivileged user namespaces); podman
is not skipped with `PRORL_REQUIRE_PODMAN=1` (scripts/test.sh sets it where scripts/setup-podman.sh succeeded).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from prorl_server.sandbox import DEFAULT_BASE_DIR, Runtime, Sandbox, SandboxSpec, make_runtime, new_owner_id
from prorl_server.sandbox.cgroups import detect, owner_directories
from prorl_server.sandbox.containers import find_podman, owner_containers, used
from prorl_server.sandbox.reaper import MEMORY_SNAPSHOT_DIR, reap, remove_owner_files, tagged_processes
from prorl_server.sandbox.registry import unavailable_reason


@dataclass(frozen=True)
class Case:
    """How the tests use one runtime."""

    image: str | None = None  # given to every test sandbox that does not name its own image
    isolating: bool = True  # also run the isolation, limit and reaper tests against it
    options: dict[str, Any] = field(default_factory=dict)  # make_runtime options


APPTAINER_IMAGE = os.environ.get("PRORL_APPTAINER_IMAGE", "/tmp/apptainer-test/images/py.sif")
PODMAN_IMAGE = os.environ.get("PRORL_PODMAN_IMAGE", "localhost/prorl-test:py")
REQUIRE_PODMAN_ENV = "PRORL_REQUIRE_PODMAN"  # set by scripts/test.sh where setup-podman.sh succeeded

CASES: dict[str, Case] = {
    "bwrap": Case(),
    "apptainer": Case(image=APPTAINER_IMAGE),
    "local": Case(isolating=False),
    "podman": Case(image=PODMAN_IMAGE),
}


def _image_missing(name: str, image: str) -> str | None:
    """Why the runtime's test image is not there (None: it is)."""
    if name == "podman":
        if subprocess.run([find_podman() or "podman", "image", "exists", image], capture_output=True).returncode == 0:
            return None
        return f"test image {image} missing (scripts/setup-podman.sh imports it; or set PRORL_PODMAN_IMAGE)"
    if os.path.exists(image):
        return None
    return f"test image {image} missing (scripts/setup-apptainer.sh builds it; or set PRORL_APPTAINER_IMAGE)"


def _param(name: str) -> Any:
    reason = unavailable_reason(name)
    image = CASES[name].image
    if reason is None and image is not None:
        reason = _image_missing(name, image)
    if name == "podman" and os.environ.get(REQUIRE_PODMAN_ENV) == "1":
        return pytest.param(name, id=name)  # must run: a missing podman or image fails the tests, saying why
    return pytest.param(name, id=name, marks=pytest.mark.skipif(reason is not None, reason=f"{name}: {reason}"))


ISOLATING = [_param(name) for name, case in CASES.items() if case.isolating]
ALL = [_param(name) for name in CASES]


def owner_leftovers(owner: str, ids: set[str] | None = None) -> dict[str, list[Any]]:
    """What an owner (or only its sandboxes `ids`) still has here: tagged processes, private directories (snapshots
    too), cgroups, podman containers."""
    mine = (lambda name: name.startswith(("sbx-", "snap-"))) if ids is None else ids.__contains__
    processes = [p for p in tagged_processes() if p.owner == owner and (ids is None or p.sandbox_id in ids)]
    directories = [
        p
        for root in (DEFAULT_BASE_DIR, MEMORY_SNAPSHOT_DIR)
        if (root / owner).exists()
        for p in (root / owner).iterdir()
    ]
    directories = [p for p in directories if mine(p.name)]
    roots = owner_directories(detect(warn=False, cpuset=True)).get(owner, [])
    cgroups = [d for root in roots for d in root.iterdir() if d.is_dir() and mine(d.name)]
    podman = owner_containers(owner) if used(DEFAULT_BASE_DIR / owner) else []
    containers = [n for n in podman if ids is None or n.removeprefix("prorl-") in ids]
    found = {"processes": processes, "directories": directories, "cgroups": cgroups, "containers": containers}
    return {k: v for k, v in found.items() if v}


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `predicate` until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return bool(ok)


class Harness:
    """One runtime for one test: starts sandboxes with the runtime's defaults, closes them at teardown."""

    def __init__(self, name: str, case: Case) -> None:
        self.name = name
        self.case = case
        self.owner = new_owner_id()
        self.runtime: Runtime = make_runtime(name, self.owner, **case.options)
        self.sandboxes: list[Sandbox] = []

    def remake(self, **options: Any) -> Runtime:
        """Replace the runtime, before it started any sandbox, by one with these options too (e.g. `cpu_pool`)."""
        assert not self.sandboxes, "remake the runtime before starting sandboxes"
        self.runtime.close()
        self.runtime = make_runtime(self.name, self.owner, **{**self.case.options, **options})
        return self.runtime

    def spec(self, **fields: Any) -> SandboxSpec:
        """A SandboxSpec with this runtime's test image unless one is given."""
        fields.setdefault("image", self.case.image)
        return SandboxSpec(**fields)

    async def start(self, **fields: Any) -> Sandbox:
        """Start a sandbox from spec fields; it is closed at teardown if the test does not."""
        sandbox = await self.runtime.start(self.spec(**fields))
        self.sandboxes.append(sandbox)
        return sandbox

    def leftovers(self, ids: Iterable[str] | None = None, owner: str | None = None) -> dict[str, list[Any]]:
        """What these sandbox ids (default: all of the owner's, waiting launchers included) left behind."""
        return owner_leftovers(owner or self.owner, None if ids is None else set(ids))

    wait_until = staticmethod(wait_until)

    async def teardown(self) -> dict[str, list[Any]]:
        """Close everything; returns what was left behind (should be nothing)."""
        await asyncio.gather(*(s.close() for s in self.sandboxes), return_exceptions=True)
        close = getattr(self.runtime, "close", None)
        if close is not None:
            close()
        wait_until(lambda: not owner_leftovers(self.owner), timeout=5)
        leftovers = owner_leftovers(self.owner)
        reap(owner=self.owner)
        remove_owner_files(self.owner)
        return leftovers


async def _harness(name: str) -> AsyncIterator[Harness]:
    harness = Harness(name, CASES[name])
    yield harness
    leftovers = await harness.teardown()
    assert not leftovers, f"{name} sandboxes left things behind: {leftovers}"


@pytest.fixture(params=ISOLATING)
async def isolated(request) -> AsyncIterator[Harness]:
    """A harness per isolating runtime."""
    async for harness in _harness(request.param):
        yield harness


@pytest.fixture(params=ALL)
async def any_runtime(request) -> AsyncIterator[Harness]:
    """A harness per runtime, local included."""
    async for harness in _harness(request.param):
        yield harness
