"""The Apptainer runtime with a real apptainer: start, tools, isolation, binds, owner tags, limits, close.

Skipped when no apptainer is found (PATH or PRORL_APPTAINER) or the test image is missing; as root on Debian,
`bash scripts/setup-apptainer.sh` installs both (about 1.5 minutes).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from prorl_server.sandbox import Bind, Sandbox, SandboxError, SandboxLimits, SandboxSpec
from prorl_server.sandbox.apptainer import (
    ENV_BINARY,
    ApptainerRuntime,
    copy_sparse,
    find_apptainer,
    stage_tool_packages,
)
from prorl_server.sandbox.process_sandbox import ProcessSandbox
from prorl_server.sandbox.reaper import new_owner_id, tagged_processes
from prorl_server.sandbox.slot import group_members

IMAGE = Path(os.environ.get("PRORL_APPTAINER_IMAGE", "/tmp/apptainer-test/images/py.sif"))
SCRATCH = Path("/tmp/prorl-test-apptainer")  # bind sources must be where the apptainer wrapper sees them

SKIP_REASON = (
    f"needs apptainer (PATH or {ENV_BINARY}) and the image {IMAGE} (PRORL_APPTAINER_IMAGE); "
    "as root: bash scripts/setup-apptainer.sh"
)


async def sh(sandbox: Sandbox, command: str) -> str:
    """Run a bash command inside; its output, stripped."""
    return (await sandbox.bash(command)).output.strip()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Unpacked images, shared by the module's tests (tmp_path is under /tmp, which apptainer sees)."""
    return tmp_path_factory.mktemp("apptainer-cache")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A host directory under /tmp for binds."""
    SCRATCH.mkdir(exist_ok=True)
    path = Path(SCRATCH / os.urandom(4).hex())
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def runtime(cache_dir: Path) -> AsyncIterator[ApptainerRuntime]:
    """An apptainer runtime of a fresh owner; its sandboxes are closed afterwards and no process may be left."""
    if find_apptainer() is None or not IMAGE.exists():
        pytest.skip(SKIP_REASON)
    rt = ApptainerRuntime(new_owner_id(), cache_dir=cache_dir)
    started: list[Sandbox] = []
    start = rt.start

    async def start_and_track(spec: SandboxSpec) -> Sandbox:
        started.append(await start(spec))
        return started[-1]

    rt.start = start_and_track  # type: ignore[method-assign]
    yield rt
    for sandbox in started:
        await sandbox.close()
    rt.close()
    left = [p for p in tagged_processes() if p.owner == rt.owner]
    shutil.rmtree(rt.base_dir / rt.owner, ignore_errors=True)
    assert not left, f"processes outlived their sandboxes: {left}"


def spec(**fields: Any) -> SandboxSpec:
    """A spec for the test image."""
    return SandboxSpec(**{"image": str(IMAGE), **fields})


def test_available_says_how_to_get_apptainer(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ENV_BINARY, "/nonexistent/apptainer")
    reason = ApptainerRuntime.available()
    assert reason is not None and ENV_BINARY in reason and "setup-apptainer.sh" in reason


async def test_start_ping_bash_close(runtime: ApptainerRuntime):
    sandbox = await runtime.start(spec())
    assert isinstance(sandbox, ProcessSandbox)
    assert await sandbox.tools.ping() > 0
    assert await sh(sandbox, "echo hello from $(cat /etc/debian_version | cut -d. -f1)") == "hello from 12"
    assert await sh(sandbox, "pwd; echo $HOME") == "/workspace\n/workspace"
    directory = sandbox.slot.directory
    await sandbox.close()
    assert sandbox.closed and not directory.exists()
    assert not group_members(sandbox.pid)
    await sandbox.close()  # idempotent


async def test_no_network_by_default_host_network_on_request(runtime: ApptainerRuntime):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()
    probe = (
        "python3 -c 'import socket,sys; s=socket.socket(); s.settimeout(3); "
        f'print(sorted(n for _, n in socket.if_nameindex()), s.connect_ex(("127.0.0.1", {port})) == 0)\''
    )
    try:
        isolated = await runtime.start(spec())
        host = await runtime.start(spec(network="host"))
        assert await sh(isolated, probe) == "['lo'] False"
        assert (await sh(host, probe)).endswith("True")
        await isolated.close()
        await host.close()
    finally:
        listener.close()


async def test_binds_read_only_and_read_write(runtime: ApptainerRuntime, scratch: Path):
    (scratch / "ro").mkdir()
    (scratch / "ro" / "data.txt").write_text("from the host\n")
    (scratch / "rw").mkdir()
    (scratch / "rw").chmod(0o777)  # a root server's sandboxes run as nobody
    binds = [
        Bind(source=str(scratch / "ro"), target="/data"),
        Bind(source=str(scratch / "rw"), target="/out", read_only=False),
    ]
    sandbox = await runtime.start(spec(binds=binds))
    assert await sh(sandbox, "cat /data/data.txt") == "from the host"
    assert "Read-only file system" in await sh(sandbox, "echo x > /data/new 2>&1; true")
    await sh(sandbox, "echo from the sandbox > /out/result.txt")
    assert (scratch / "rw" / "result.txt").read_text() == "from the sandbox\n"
    await sandbox.close()


async def test_host_files_stay_outside_and_the_writable_layer_is_private(runtime: ApptainerRuntime, scratch: Path):
    (scratch / "secret").write_text("host only")
    first = await runtime.start(spec())
    second = await runtime.start(spec())
    outside = await sh(first, f"ls {scratch} /work 2>&1; true")
    assert "secret" not in outside and outside.count("No such file or directory") == 2
    await sh(first, "echo one > /workspace/f; echo tmp > /tmp/t; echo var > /var/tmp/v")
    assert await sh(first, "cat /workspace/f /tmp/t /var/tmp/v") == "one\ntmp\nvar"
    assert await sh(second, "cat /workspace/f /tmp/t /var/tmp/v 2>/dev/null; true") == ""
    await first.close()
    await second.close()


async def test_owner_tag_reaches_every_process_and_close_leaves_none(runtime: ApptainerRuntime):
    sandbox = await runtime.start(spec())
    await sh(sandbox, "sleep 300 & setsid sleep 301 & (sleep 302 &) ; echo started")
    for _ in range(100):  # setsid may not have exec'd sleep yet
        tagged = {p.pid: p for p in tagged_processes() if p.sandbox_id == sandbox.id}
        commands = {pid: args for pid in tagged if (args := command_of(pid)) is not None}
        sleeps = {args[1] for args in commands.values() if args[0] == b"sleep"}
        if len(sleeps) == 3:
            break
        await asyncio.sleep(0.05)
    assert sleeps == {b"300", b"301", b"302"}, commands
    assert all(p.owner == runtime.owner for p in tagged.values())
    assert any(b"python3" in args[0] for args in commands.values())  # the execution server
    assert sandbox.pid in tagged  # the host-side top process too
    await sandbox.close()
    assert not [p for p in tagged_processes() if p.sandbox_id == sandbox.id]
    assert not [pid for pid in tagged if running(pid)]


def command_of(pid: int) -> list[bytes] | None:
    """The program and first argument of `pid`; None once it has exited (a short-lived subshell may go between
    listing the processes and reading this)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
    except OSError:
        return None


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (one whose parent died waits for init to collect it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


async def test_environment_is_scrubbed_and_values_arrive_literally(runtime: ApptainerRuntime, monkeypatch):
    monkeypatch.setenv("HOST_ONLY_SECRET", "x")
    tricky = {"A": "a $HOME `id` \"q\" 's' \\ $(id) ${PATH}", "B": "line1\nline2", "C": ""}
    sandbox = await runtime.start(spec(env=tricky))
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    env = json.loads(await sh(sandbox, f'python3 -c "{code}"'))
    assert {k: env.get(k) for k in tricky} == tricky
    assert "HOST_ONLY_SECRET" not in env and env["PRORL_SANDBOX_OWNER"] == runtime.owner
    assert env["PRORL_SANDBOX_ID"] == sandbox.id and "PRORL_BOOT" not in env
    assert not [k for k in env if k.startswith("APPTAINERENV_")]
    await sandbox.close()


async def test_disk_and_file_size_limits(runtime: ApptainerRuntime):
    sandbox = await runtime.start(spec(limits=SandboxLimits(disk_mb=64, file_size_mb=8)))
    big_file = await sh(sandbox, "dd if=/dev/zero of=/workspace/big bs=1M count=16 2>&1; true")
    assert "File too large" in big_file
    filled = await sh(sandbox, "for i in 1 2 3 4 5 6 7 8 9; do dd if=/dev/zero of=/tmp/f$i bs=1M count=8 2>&1; done")
    assert "No space left on device" in filled
    await sandbox.close()


async def test_sandboxes_of_one_overlay_template_each_write_their_own_disk(runtime: ApptainerRuntime):
    limits = SandboxLimits(disk_mb=64)
    first, second = await runtime.start(spec(limits=limits)), await runtime.start(spec(limits=limits))
    await sh(first, "echo one > /workspace/mine; dd if=/dev/zero of=/tmp/fill bs=1M count=40 2>/dev/null")
    assert await sh(second, "ls /workspace; df -m /tmp | tail -1 | awk '{print $3 < 10}'") == "1"
    assert await sh(first, "cat /workspace/mine") == "one"
    templates = list((runtime.base_dir / runtime.owner / "overlays").glob("*.img"))
    assert len(templates) == 1  # made once, copied per sandbox
    await first.close()
    await second.close()
    runtime.close()
    assert not (runtime.base_dir / runtime.owner / "overlays").exists()


def test_copy_sparse_copies_the_data_and_keeps_the_holes(tmp_path: Path):
    source, target = tmp_path / "source", tmp_path / "target"
    with open(source, "wb") as f:
        f.truncate(64 << 20)
        f.seek(1 << 20)
        f.write(b"a" * 5000)
        f.seek(40 << 20)
        f.write(b"b" * 3)
    copy_sparse(source, target)
    assert target.stat().st_size == source.stat().st_size
    with open(source, "rb") as a, open(target, "rb") as b:
        for offset in (0, 1 << 20, (1 << 20) + 4999, 40 << 20, (64 << 20) - 1):
            a.seek(offset)
            b.seek(offset)
            assert a.read(16) == b.read(16)
    assert target.stat().st_blocks * 512 < 1 << 20  # the holes were not written
    with pytest.raises(FileExistsError):
        copy_sparse(source, target)


def test_staged_tool_packages_carry_their_bytecode(tmp_path: Path):
    dest = stage_tool_packages(tmp_path / "lib")
    assert list((dest / "prorl_server" / "tool_server" / "__pycache__").glob("server.*.pyc"))
    assert list((dest / "ptyprocess" / "__pycache__").glob("*.pyc"))


async def test_rlimits_reach_the_agents_processes(runtime: ApptainerRuntime):
    sandbox = await runtime.start(spec(limits=SandboxLimits(memory_mb=512, cpu_seconds=30, file_size_mb=16)))
    assert await sh(sandbox, "ulimit -v; ulimit -t; ulimit -f") == f"{512 * 1024}\n30\n{16 * 1024}"
    await sandbox.close()


async def test_sandboxes_run_without_privileges(runtime: ApptainerRuntime):
    sandbox = await runtime.start(spec())
    status = await sh(sandbox, "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status | tr -s '\t' ' '")
    uid = "65534" if os.geteuid() == 0 else str(os.getuid())
    assert status.splitlines() == [uid, "CapEff: 0000000000000000", "CapBnd: 0000000000000000", "NoNewPrivs: 1"]
    # writing a host-wide setting back unchanged: refused (a root sandbox could, e.g. kernel.core_pattern)
    refused = await sh(sandbox, "cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness 2>&1 || echo refused")
    assert refused.endswith("refused")


async def test_fakeroot_only_for_a_server_that_is_not_root(runtime: ApptainerRuntime):
    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="fakeroot"):
            await runtime.start(spec(fakeroot=True))
        assert not list((runtime.base_dir / runtime.owner).glob("sbx-*"))
    else:
        sandbox = await runtime.start(spec(fakeroot=True))
        assert await sh(sandbox, "id -u") == "0"


async def test_idle_sandbox_without_tools(runtime: ApptainerRuntime):
    idle = await runtime.start(spec(tools=False))
    assert idle.alive() and not idle.socket_path.exists()
    await idle.close()
    assert not group_members(idle.pid)


async def test_sif_is_unpacked_once_per_image_version(runtime: ApptainerRuntime, scratch: Path):
    copy = scratch / "copy.sif"
    shutil.copy2(IMAGE, copy)
    first = runtime.prepare(str(copy))
    assert first.is_dir() and first.is_relative_to(runtime.cache_dir) and runtime.prepare(str(copy)) == first
    os.utime(copy, (1, 1))  # another version at the same path
    second = runtime.prepare(str(copy))
    assert second != first and (second / "usr" / "bin" / "python3").exists()
    sandbox = await runtime.start(spec(image=str(copy)))
    assert await sh(sandbox, "echo ok") == "ok"
    await sandbox.close()
    plain = ApptainerRuntime(runtime.owner, cache_dir=runtime.cache_dir, unpack_sif=False)
    assert plain.prepare(str(copy)) == copy


async def test_a_missing_image_says_what_to_do(runtime: ApptainerRuntime):
    with pytest.raises(SandboxError, match="build-image"):
        await runtime.start(spec(image="/tmp/no-such-image.sif"))
    with pytest.raises(SandboxError, match=r"spec\.image"):
        await runtime.start(SandboxSpec())
    assert not list((runtime.base_dir / runtime.owner).glob("sbx-*"))
