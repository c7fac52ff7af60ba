"""Start and close of real sandboxes, for every runtime: nothing is left behind, whoever closes and however."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from prorl_server.sandbox import Bind, SandboxError
from prorl_server.sandbox.reaper import tagged_processes
from prorl_server.tool_server.protocol import ENV_OWNER

pytest_plugins = ("sandbox_fixtures",)


# A Debian root directory with python3, as made by scripts/setup-apptainer.sh (its test image, unpacked).
ROOTFS = Path(os.environ.get("PRORL_TEST_ROOTFS", "/tmp/apptainer-test/imgroot"))


def sandbox_processes(sandbox_id: str) -> list[int]:
    """PIDs of live processes tagged with this sandbox id."""
    return [p.pid for p in tagged_processes() if p.sandbox_id == sandbox_id]


async def test_close_stops_every_process_and_removes_files_and_cgroups(any_runtime):
    sandbox = await any_runtime.start(network="loopback")
    await sandbox.bash("sleep 300 & sleep 301 &")
    assert len(sandbox_processes(sandbox.id)) >= 3

    def untagged_members() -> set[int]:
        members = sandbox.slot.cgroup.pids()
        tagged = set(sandbox_processes(sandbox.id))
        return (members & sandbox.slot.cgroup.pids()) - tagged  # alive before and after the scan

    # every process in its cgroup is tagged; a short-lived helper the shell forks (or a zombie not yet
    # reaped, whose environment reads empty) may show untagged for a moment, so look until none does
    assert not sandbox.slot.cgroup.directories or any_runtime.wait_until(lambda: not untagged_members())
    await sandbox.close()
    assert sandbox.closed and sandbox_processes(sandbox.id) == []
    assert not sandbox.slot.directory.exists()
    assert not any(d.exists() for d in sandbox.slot.cgroup.directories)
    assert any_runtime.runtime.loopback.in_use == 0


async def test_every_process_carries_the_owner_tag(any_runtime):
    sandbox = await any_runtime.start()
    out = await sandbox.bash(f"sh -c 'echo ${ENV_OWNER}'; echo $PRORL_SANDBOX_ID")
    assert out.output.split() == [any_runtime.owner, sandbox.id]
    tagged = {p.pid for p in tagged_processes() if p.owner == any_runtime.owner}
    assert sandbox.pid in tagged  # the top process (bwrap itself for bubblewrap)


async def test_close_is_idempotent_and_works_from_another_thread_and_loop(any_runtime):
    first, second = await any_runtime.start(), await any_runtime.start()
    await asyncio.gather(first.close(), first.close())
    await first.close()
    assert first.closed
    done = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.run(second.close()), done.set()))
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert done.is_set() and second.closed and sandbox_processes(second.id) == []


async def test_local_runtime_close_kills_processes_that_escaped_the_session(any_runtime):
    if any_runtime.name != "local":
        pytest.skip("only the local runtime lacks a pid namespace")
    sandbox = await any_runtime.start()
    await sandbox.bash("setsid sleep 301 & (sleep 302 &) ; sleep 0.2")
    escaped = [int(p) for p in (await sandbox.bash("pgrep -f 'sleep 30[12]'")).output.split()]
    assert len(escaped) == 2
    await sandbox.close()
    assert any_runtime.wait_until(lambda: not any(p in sandbox_processes(sandbox.id) for p in escaped), timeout=5)


async def test_a_start_that_fails_says_why_and_leaves_nothing(any_runtime, tmp_path):
    if any_runtime.name == "local":
        pytest.skip("the local runtime ignores images and binds")
    with pytest.raises(SandboxError, match="does not exist"):
        await any_runtime.start(binds=[Bind(source=str(tmp_path / "missing"), target="/data")])
    empty_root = tmp_path / "root"
    empty_root.mkdir()
    with pytest.raises(SandboxError, match="python3"):  # an image without Python cannot run the server
        await any_runtime.start(image=str(empty_root))
    any_runtime.runtime.close()  # prewarmed launchers, if any, are not leftovers of the failed starts
    assert any_runtime.leftovers() == {}


async def test_a_hundred_concurrent_sandboxes_start_answer_and_close(any_runtime):
    started = time.monotonic()
    sandboxes = await asyncio.gather(*(any_runtime.start() for _ in range(100)))
    outputs = await asyncio.gather(*(s.bash(f"echo {i}") for i, s in enumerate(sandboxes)))
    assert [o.output.strip() for o in outputs] == [str(i) for i in range(100)]
    assert len({s.id for s in sandboxes}) == 100
    await asyncio.gather(*(s.close() for s in sandboxes))
    assert any_runtime.leftovers(s.id for s in sandboxes) == {}
    assert time.monotonic() - started < 120


async def test_bwrap_runs_a_root_directory_image_with_its_own_python(any_runtime):
    if any_runtime.name != "bwrap":
        pytest.skip("root directory images are a bubblewrap feature")
    if not (ROOTFS / "usr" / "bin" / "python3").exists():
        pytest.skip(f"no root directory with python3 at {ROOTFS} (scripts/setup-apptainer.sh makes one)")
    sandbox = await any_runtime.start(image=str(ROOTFS))
    out = await sandbox.bash("grep ^ID= /etc/os-release; command -v python3; touch /workspace/x /var/tmp/y && echo OK")
    assert out.output.split() == ["ID=debian", "/usr/bin/python3", "OK"]
    assert "Read-only" in (await sandbox.bash("touch /usr/x")).output
