"""The Podman runtime with a real podman: start from a local image or a root directory, tools, no network,
limits, private working directories, binds, removal on close and after a crash, bad images; images built
from a Dockerfile (`podman build`) or imported from a root directory.

Needs podman (runc where crun cannot run) and the test image (scripts/setup-podman.sh, as root on Debian);
skipped with the reason otherwise, failed instead with PRORL_REQUIRE_PODMAN=1 (scripts/test.sh). The
isolation, limit, escape and reaper suites also run against podman (tests/sandbox_fixtures.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from prorl_server import cli
from prorl_server.imaging import ImageBuildError
from prorl_server.imaging.podman_images import build_dockerfile, import_rootfs
from prorl_server.sandbox import (
    Bind,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
    reap_orphans,
    remove_owner_files,
)
from prorl_server.sandbox import podman as podman_module
from prorl_server.sandbox.containers import ENV_BINARY, find_podman, owner_containers
from prorl_server.sandbox.podman import PodmanRuntime, container_name
from prorl_server.sandbox.reaper import new_owner_id, tagged_processes
from prorl_server.sandbox.registry import unavailable_reason

PODMAN_IMAGE = os.environ.get("PRORL_PODMAN_IMAGE", "localhost/prorl-test:py")  # as in sandbox_fixtures.py
ROOT_DIR = Path(os.environ.get("PRORL_PODMAN_ROOTFS", "/tmp/apptainer-test/imgroot"))  # setup-apptainer.sh


def _missing() -> str | None:
    """Why podman or its test image is not there (None: both are; with PRORL_REQUIRE_PODMAN=1, not asked)."""
    if os.environ.get("PRORL_REQUIRE_PODMAN") == "1":
        return None
    reason = unavailable_reason("podman")
    if (
        reason is None
        and subprocess.run([find_podman() or "podman", "image", "exists", PODMAN_IMAGE], capture_output=True).returncode
        != 0
    ):
        reason = f"test image {PODMAN_IMAGE} missing (scripts/setup-podman.sh imports it)"
    return reason


pytestmark = pytest.mark.skipif(_missing() is not None, reason=f"podman: {_missing()}")


def wait_until(predicate, timeout: float = 10.0) -> bool:
    """Poll `predicate` until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := predicate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(ok)


async def sh(sandbox: Sandbox, command: str) -> str:
    """Run a bash command inside; its output, stripped."""
    return (await sandbox.bash(command)).output.strip()


@pytest.fixture
async def runtime() -> AsyncIterator[PodmanRuntime]:
    owner = new_owner_id()
    runtime = PodmanRuntime(owner)
    yield runtime
    runtime.close()
    assert owner_containers(owner) == []
    remove_owner_files(owner)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    tmp_path.chmod(0o755)
    yield tmp_path


def spec(**fields: Any) -> SandboxSpec:
    fields.setdefault("image", PODMAN_IMAGE)
    return SandboxSpec(**fields)


def test_available_says_how_to_get_podman(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENV_BINARY, "/nonexistent/podman")
    podman_module.probe.cache_clear()
    try:
        assert "podman not found" in (PodmanRuntime.available() or "")
        with pytest.raises(SandboxError, match="apt-get install podman runc"):
            PodmanRuntime(new_owner_id())
    finally:
        podman_module.probe.cache_clear()


async def test_start_tools_close_from_an_image_and_from_a_root_directory(runtime: PodmanRuntime):
    images = [PODMAN_IMAGE] + ([str(ROOT_DIR)] if (ROOT_DIR / "usr/bin/python3").exists() else [])
    for image in images:
        sandbox = await runtime.start(spec(image=image))
        assert await sh(sandbox, "echo hello > f && cat f && pwd && id -u") == "hello\n/workspace\n65534"
        await sandbox.write_file("/workspace/a.txt", "written")
        assert await sandbox.read_file("/workspace/a.txt") == "written"
        name = container_name(sandbox.id)
        assert owner_containers(runtime.owner) == [name]
        await sandbox.close()
        assert owner_containers(runtime.owner) == []
        assert not [p for p in tagged_processes() if p.sandbox_id == sandbox.id]
    if len(images) > 1:
        assert not (ROOT_DIR / "workspace").exists()  # the directory is run under an overlay, never written


async def test_no_network_by_default_host_network_on_request(runtime: PodmanRuntime):
    probe = 'python3 -c "import socket; print(sorted({i[1] for i in socket.if_nameindex()}))"'
    boxed = await runtime.start(spec())
    assert await sh(boxed, probe) == "['lo']"
    assert await sh(boxed, "hostname") == "sandbox"
    host = await runtime.start(spec(network="host"))
    assert await sh(host, probe) == str(sorted({i[1] for i in __import__("socket").if_nameindex()}))
    for sandbox in (boxed, host):
        await sandbox.close()


async def test_read_only_image_private_writable_mounts_and_binds(runtime: PodmanRuntime, scratch: Path):
    (scratch / "in.txt").write_text("from the host")
    out = scratch / "out"
    out.mkdir()
    out.chmod(0o777)
    binds = [
        Bind(source=str(scratch / "in.txt"), target="/data/in.txt"),
        Bind(source=str(out), target="/out", read_only=False),
    ]
    first = await runtime.start(spec(binds=binds))
    second = await runtime.start(spec())
    assert "Read-only file system" in await sh(first, "touch /usr/x 2>&1; echo > /data/in.txt 2>&1")
    assert await sh(first, "cat /data/in.txt") == "from the host"
    await sh(first, "echo result > /out/r.txt; echo secret > /workspace/s; echo tmp > /tmp/t")
    assert (out / "r.txt").read_text() == "result\n"
    assert await sh(second, "ls /workspace/s /tmp/t 2>&1 | grep -c 'No such file'") == "2"  # not the first one's
    assert await sh(first, "stat -c %a /workspace") == "700"
    assert await sh(first, f"ls {scratch} {Path.cwd()} 2>&1 | grep -c 'No such file'") == "2"  # no host paths
    for sandbox in (first, second):
        await sandbox.close()


async def test_limits_reach_the_container(runtime: PodmanRuntime):
    limits = SandboxLimits(memory_mb=256, pids=40, disk_mb=8, file_size_mb=4, cpus=0.5)
    sandbox = await runtime.start(spec(limits=limits))
    big = await sh(sandbox, "head -c 20M /dev/zero > /workspace/big 2>&1; ls -l /workspace/big | cut -d' ' -f5")
    assert big.splitlines()[-1] == str(4 * 1024 * 1024)  # RLIMIT_FSIZE (under the 8 MB tmpfs)
    full = await sh(sandbox, "for i in 1 2 3; do head -c 3M /dev/zero > /tmp/f$i || echo FULL; done")
    assert "FULL" in full or "No space left" in full
    pids = {p.pid for p in tagged_processes() if p.sandbox_id == sandbox.id}
    members = sandbox.slot.cgroup.pids()
    if sandbox.slot.cgroup.directories:  # the container's processes live in the sandbox's own cgroups
        assert pids and pids <= members | {sandbox.pid}
        assert sandbox.slot.cgroup.read("pids.max").strip() == "40"
    hog = await sandbox.bash("python3 -c 'b = bytearray(400 * 1024 * 1024)' 2>&1; echo status $?", timeout=60)
    assert "MemoryError" in hog.output or "status 137" in hog.output, hog.output
    await sandbox.close()


async def test_bad_images_say_what_is_wrong(runtime: PodmanRuntime, tmp_path: Path):
    with pytest.raises(SandboxError, match="neither a root directory nor in podman's local storage"):
        await runtime.start(spec(image="localhost/no-such-image:never"))
    with pytest.raises(SandboxError, match=r"needs spec\.image"):
        await runtime.start(spec(image=None))
    empty = tmp_path / "root"
    (empty / "etc").mkdir(parents=True)
    with pytest.raises(SandboxError, match="exited with status"):
        await runtime.start(spec(image=str(empty)))  # no python3 to run the execution server
    assert owner_containers(runtime.owner) == []
    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="fakeroot"):
            await runtime.start(spec(fakeroot=True))


SERVER = """
import asyncio, sys
from prorl_server.sandbox import SandboxSpec, make_runtime, new_owner_id
async def main():
    owner = new_owner_id()
    runtime = make_runtime("podman", owner)
    await asyncio.gather(*(runtime.start(SandboxSpec(image=sys.argv[1])) for _ in range(3)))
    print(owner, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_a_crashed_servers_containers_are_removed_by_the_next_one():
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, PODMAN_IMAGE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        owner = server.stdout.readline().strip()
        assert len(owner_containers(owner)) == 3
    finally:
        server.kill()
        server.wait()
    assert len(owner_containers(owner)) == 3  # a SIGKILLed server removes nothing
    reap_orphans(new_owner_id())
    assert owner_containers(owner) == []
    assert wait_until(lambda: not [p for p in tagged_processes() if p.owner == owner])


DOCKERFILE = """\
FROM debian:bookworm
ARG GREETING=hello
WORKDIR /srv/task
COPY data.txt .
RUN echo "$GREETING from the build" > built.txt
"""


async def test_a_dockerfile_built_by_podman_runs_and_is_reused(runtime: PodmanRuntime, tmp_path: Path):
    if not (ROOT_DIR / "usr/bin/python3").exists():
        pytest.skip(f"needs the root directory {ROOT_DIR} as the base: bash scripts/setup-apptainer.sh")
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "data.txt").write_text("copied\n")
    base_map = {"debian:bookworm": ROOT_DIR}
    built = build_dockerfile(tmp_path / "Dockerfile", build_args={"GREETING": "hi"}, base_map=base_map)
    again = build_dockerfile(tmp_path / "Dockerfile", build_args={"GREETING": "hi"}, base_map=base_map)
    assert (again.reference, again.cached, built.workdir) == (built.reference, True, "/srv/task")
    sandbox = await runtime.start(spec(image=built.reference, workdir=built.workdir))
    assert await sh(sandbox, "cat data.txt built.txt") == "copied\nhi from the build"
    await sandbox.close()
    (tmp_path / "data.txt").write_text("changed\n")  # the context is part of the key
    assert build_dockerfile(tmp_path / "Dockerfile", build_args={"GREETING": "hi"}, base_map=base_map).key != built.key


def test_a_failed_podman_build_names_the_line_and_leaves_no_image(tmp_path: Path):
    if not (ROOT_DIR / "usr/bin/python3").exists():
        pytest.skip(f"needs the root directory {ROOT_DIR} as the base: bash scripts/setup-apptainer.sh")
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm\nRUN true\n\nRUN exit 3\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile:4: RUN failed the build") as failed:
        build_dockerfile(tmp_path / "Dockerfile", base_map={"debian:bookworm": ROOT_DIR})
    key = failed.value.log.name.removeprefix("podman-").removesuffix(".log")
    assert subprocess.run(["podman", "image", "exists", f"localhost/prorl-dockerfile:{key}"]).returncode == 1
    (tmp_path / "Dockerfile").write_text("FROM localhost/no-such-base:1\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile:1: FROM failed the build(.|\n)*image not known"):
        build_dockerfile(tmp_path / "Dockerfile")  # never pulled from a registry


def test_build_image_imports_a_root_directory_and_refuses_apptainer_options(capsys):
    if not (ROOT_DIR / "usr/bin/python3").exists():
        pytest.skip(f"needs the root directory {ROOT_DIR}: bash scripts/setup-apptainer.sh")
    cli.main(["build-image", "--runtime", "podman", "--base", str(ROOT_DIR)])
    reference = capsys.readouterr().out.split()[0]
    assert reference.startswith("localhost/prorl-rootfs:") and import_rootfs(ROOT_DIR).cached
    with pytest.raises(SystemExit, match="a template, --out: not for --runtime podman"):
        cli.main(["build-image", "--runtime", "podman", "python", "--out", "/tmp/x.sif"])
