"""Limits of real sandboxes, for every isolating runtime: each runaway is contained with a clear observation."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from prorl_server.sandbox import SandboxLimits

FORK_BOMB = "python3 -c 'import os\nwhile True: os.fork()' 2>&1 | sort | uniq -c | sort -rn | head -3"
MEMORY_HOG = "python3 -c 'import time; x = bytearray({mb} << 20); x[::4096] = b\"1\" * len(x[::4096]); time.sleep(5)'"

pytest_plugins = ("sandbox_fixtures",)


async def test_fork_bomb_is_stopped_at_the_pids_limit_and_the_sandbox_survives(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(pids=64))
    if sandbox.slot.cgroup.read("pids.max") is None and os.geteuid() == 0:
        pytest.skip("no writable pids cgroup and running as root: nothing would stop a fork bomb here")
    bomb = await sandbox.bash(FORK_BOMB, timeout=60)
    assert "Resource temporarily unavailable" in bomb.output, bomb.output  # fork() fails at the limit
    assert not bomb.timed_out
    events = sandbox.slot.cgroup.read("pids.events")
    assert events is None or int(events.split()[-1]) > 0  # the pids cgroup counted refusals
    assert (await sandbox.bash("echo alive")).output.strip() == "alive"


async def test_memory_bomb_fails_alone_or_is_killed_by_the_sandbox_memory_limit(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(memory_mb=256))
    alone = await sandbox.bash("python3 -c 'x = bytearray(1 << 30)'; echo rc=$?", timeout=30)
    assert "MemoryError" in alone.output and "rc=1" in alone.output  # RLIMIT_AS: one process, 1 GiB > 256 MB
    if sandbox.slot.cgroup.read("memory.limit_in_bytes") is None and sandbox.slot.cgroup.read("memory.max") is None:
        return  # no memory cgroup here: only the per-process limit applies
    # three processes of 150 MB each fit their own RLIMIT_AS but not the sandbox's memory together
    together = await sandbox.bash(" & ".join([MEMORY_HOG.format(mb=150)] * 3) + "; wait; echo done", timeout=60)
    assert "Killed" in together.output and "done" in together.output, together.output  # the OOM killer, inside
    assert (await sandbox.bash("echo alive")).output.strip() == "alive"


async def test_disk_fill_stops_at_disk_mb_with_enospc_in_workspace_and_tmp(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(disk_mb=32, file_size_mb=None))
    for path in ("/workspace/fill", "/tmp/fill"):
        out = await sandbox.bash(
            f"dd if=/dev/zero of={path} bs=1M count=100 2>&1; du -m --apparent-size {path}", timeout=60
        )
        assert "No space left on device" in out.output, out.output
        assert int(out.output.split()[-2]) <= 32
        await sandbox.bash(f"rm {path}")


async def test_a_file_larger_than_file_size_mb_cannot_be_written(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(disk_mb=64, file_size_mb=8))
    out = await sandbox.bash(
        "dd if=/dev/zero of=/workspace/big bs=1M count=20 2>&1; du -m --apparent-size /workspace/big", timeout=30
    )
    assert "File too large" in out.output or "File size limit exceeded" in out.output, out.output
    assert int(out.output.split()[-2]) <= 8


async def test_infinite_output_is_capped_and_the_command_stopped(isolated):
    sandbox = await isolated.start()
    out = await sandbox.bash("yes", timeout=3, max_output=10_000)
    assert out.truncated and out.timed_out
    assert len(out.output) <= 20_000  # the cap plus the note about truncation
    assert (await sandbox.bash("echo alive")).output.strip() == "alive"


async def test_a_command_that_never_returns_times_out_and_the_shell_goes_on(isolated):
    sandbox = await isolated.start()
    started = time.monotonic()
    out = await sandbox.bash("sleep 1000", timeout=1)
    assert out.timed_out and out.exit_code is None
    assert time.monotonic() - started < 30
    assert (await sandbox.bash("echo alive")).output.strip() == "alive"


async def test_cpu_seconds_kill_a_busy_process(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(cpu_seconds=1))
    out = await sandbox.bash("python3 -c 'while True: pass'; echo rc=$?", timeout=120)
    assert not out.timed_out  # one CPU second: a few wall seconds unless the machine is very busy
    assert "rc=137" in out.output or "rc=152" in out.output, out.output  # SIGKILL or SIGXCPU


async def test_cpus_quota_slows_a_busy_loop(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(cpus=0.2))
    if sandbox.slot.cgroup.read("cpu.cfs_quota_us") is None and sandbox.slot.cgroup.read("cpu.max") is None:
        return  # no cpu cgroup here: not enforced (documented)
    busy = "import os, time\nend = time.time() + 2\nwhile time.time() < end: pass\nprint(round(sum(os.times()[:2]), 2))"
    out = await sandbox.bash(f"python3 -c '{busy}'", timeout=30)
    assert float(out.output.strip()) < 1.0, out.output  # 2 s of wall time, at most ~0.4 s of CPU


async def test_wall_clock_limit_kills_the_sandbox(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(wall_clock_s=1.0))
    await sandbox.bash("sleep 300 &")
    await asyncio.sleep(1.0)
    assert isolated.wait_until(lambda: sandbox.expired and not sandbox.alive(), timeout=10)
    await sandbox.close()
    assert sandbox.closed
