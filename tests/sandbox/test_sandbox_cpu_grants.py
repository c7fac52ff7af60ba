"""CPU granted per action (ARL-Tangram) in real sandboxes: the cgroup quota and cpuset follow each tool action's
grant and drop to the idle share after; the grant reaches the command; a small pool makes actions take turns;
cancels and impossible demands leave the books balanced; without a pool nothing changes."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest

from prorl_server.actions import ActionRefused, ActionScheduler
from prorl_server.api.state import build_cpu_pool
from prorl_server.config import ServerSettings
from prorl_server.sandbox import SandboxError, SandboxLimits
from prorl_server.sandbox.cgroups import SandboxCgroup
from prorl_server.sandbox.cpu_grants import CpuPool, SandboxCpu, cpu_slice, format_cpus, parse_cpus, reserve_for

pytest_plugins = ("sandbox_fixtures",)

CPUS = tuple(sorted(os.sched_getaffinity(0)))
SPAN = "date +%s.%N; sleep {s}; date +%s.%N"  # prints when the command started and ended


def pool_of(cores: int, idle_cpus: float = 0.1) -> CpuPool:
    """A pool of this process's first `cores` CPUs."""
    if cores > len(CPUS):
        pytest.skip(f"needs {cores} usable cores, this process has {len(CPUS)}")
    return CpuPool(ActionScheduler(cpus=cores, memory_mb=0), CPUS[:cores], idle_cpus)


def quota_cores(sandbox) -> float | None:
    """The sandbox's cgroup CPU quota in cores, read on the host (None: unlimited or no cpu cgroup)."""
    cgroup = sandbox.slot.cgroup
    v2 = cgroup.read("cpu.max")
    if v2 is not None:
        quota, period = v2.split()
        return None if quota == "max" else int(quota) / int(period)
    v1 = cgroup.read("cpu.cfs_quota_us")
    if v1 is None or int(v1) < 0:
        return None
    return int(v1) / int(cgroup.read("cpu.cfs_period_us"))


def cpuset(sandbox) -> str | None:
    value = sandbox.slot.cgroup.read("cpuset.cpus")
    return None if value is None else value.strip()


def needs_cpu_cgroup(sandbox) -> None:
    if not sandbox.cpu.quota:
        pytest.skip("no writable cpu cgroup here: the quota cannot follow the grants (fallback tested below)")


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


def books_balanced(pool: CpuPool) -> None:
    books = pool.scheduler.books()
    assert (books.free_cpu, books.waiting, books.running) == (pool.scheduler.cpus, 0, 0)
    assert books.granted_total == books.released_total


async def test_a_bash_action_raises_the_quota_and_cpuset_and_lowers_them_after(isolated):
    pool = pool_of(1, idle_cpus=0.1)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start(limits=SandboxLimits(cpus=0.5))
    needs_cpu_cgroup(sandbox)
    assert quota_cores(sandbox) == pytest.approx(0.1)  # lowered once started: the static 0.5 is replaced
    running = asyncio.ensure_future(sandbox.bash("sleep 1"))
    await until(lambda: pool.scheduler.books().running == 1)
    assert quota_cores(sandbox) == pytest.approx(1.0)
    if sandbox.cpu.cpuset:
        assert cpuset(sandbox) == str(CPUS[0])
    assert (await running).exit_code == 0
    assert quota_cores(sandbox) == pytest.approx(0.1)
    if sandbox.cpu.cpuset:
        assert cpuset(sandbox) == str(CPUS[0])  # the whole (one-core) pool
    books_balanced(pool)
    assert pool.scheduler.models["bash"].observations == 1


async def test_the_command_sees_its_grant_in_prorl_dop_and_nproc(isolated):
    pool = pool_of(2)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start()
    wide = await sandbox.bash("echo $PRORL_DOP $(nproc)", dop=2)
    narrow = await sandbox.bash("echo $PRORL_DOP $(nproc)")
    dop, nproc = wide.output.split()
    assert dop == "2" and narrow.output.split()[0] == "1"
    if sandbox.cpu.cpuset:  # the cpuset follows the grant, and nproc (sched_getaffinity) with it
        assert (nproc, narrow.output.split()[1]) == ("2", "1")
    books_balanced(pool)


async def test_with_one_pool_core_two_sandboxes_actions_take_turns(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    first, second = await asyncio.gather(isolated.start(), isolated.start())
    outputs = await asyncio.gather(first.bash(SPAN.format(s=0.4)), second.bash(SPAN.format(s=0.4)))
    spans = sorted(tuple(map(float, o.output.split())) for o in outputs)
    assert spans[0][1] <= spans[1][0], spans  # the second started after the first ended
    assert pool.scheduler.books().granted_total == 4  # two starts, two commands
    books_balanced(pool)


async def test_an_action_cancelled_while_queued_leaves_the_queue_and_the_books_balanced(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    holder, waiter = await asyncio.gather(isolated.start(), isolated.start())
    held = asyncio.ensure_future(holder.bash("sleep 0.5"))
    await until(lambda: pool.scheduler.books().running == 1)
    queued = asyncio.ensure_future(waiter.bash("echo never"))
    await until(lambda: pool.scheduler.books().waiting == 1)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    books = pool.scheduler.books()
    assert (books.waiting, books.running, books.free_cpu) == (0, 1, 0)
    if waiter.cpu.quota:
        assert quota_cores(waiter) == pytest.approx(0.1)  # never raised
    await held
    books_balanced(pool)


async def test_an_action_cancelled_while_running_returns_its_cores_and_lowers_the_sandbox(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start()
    running = asyncio.ensure_future(sandbox.bash("sleep 0.5"))
    await until(lambda: pool.scheduler.books().running == 1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    books_balanced(pool)
    assert pool.scheduler.models["bash"].observations == 0  # a cancelled action teaches nothing
    if sandbox.cpu.quota:
        assert quota_cores(sandbox) == pytest.approx(0.1)
    # the command goes on at the idle share; the next action waits for the shell, with its own grant
    assert (await sandbox.bash("echo alive", timeout=10)).output.strip() == "alive"
    books_balanced(pool)


async def test_an_action_asking_more_cores_than_the_pool_has_is_refused_at_once(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start()
    with pytest.raises(ActionRefused, match="at least 2 cores and the pool has 1"):
        await asyncio.wait_for(sandbox.bash("echo too big", dop=(2, 4)), 5)
    assert pool.scheduler.books().refused_total == 1
    assert (await sandbox.bash("echo $PRORL_DOP", dop=(1, 64))).output.strip() == "1"  # a maximum is capped
    books_balanced(pool)


async def test_file_and_editor_actions_hold_a_grant_too(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start()
    await sandbox.write_file("notes.txt", "one\n")
    await sandbox.edit("str_replace", "notes.txt", old_str="one", new_str="two")
    assert (await sandbox.read_file("notes.txt")) == "two\n"
    assert await sandbox.tools.download("notes.txt") == b"two\n"
    assert set(pool.scheduler.models.kinds()) == {"start", "files", "edit"}
    assert pool.scheduler.books().granted_total == 5  # its start and four file or editor calls
    books_balanced(pool)


async def test_without_a_pool_sandboxes_keep_their_static_quota_and_no_dop(isolated):
    sandbox = await isolated.start(limits=SandboxLimits(cpus=0.5))
    assert sandbox.cpu is None
    assert not any("cpuset" in str(d) for d in sandbox.slot.cgroup.directories)
    static = quota_cores(sandbox)
    out = await sandbox.bash("echo dop=${PRORL_DOP:-unset}", dop=(1, 8))
    assert out.output.strip() == "dop=unset"
    assert quota_cores(sandbox) == static
    assert static in (None, pytest.approx(0.5))


def test_the_setting_turns_the_pool_off_and_sizes_it_from_the_usable_cores():
    assert build_cpu_pool(ServerSettings(action_scheduler=False)) is None
    pool = build_cpu_pool(ServerSettings())
    assert pool.cpu_ids == CPUS[reserve_for(len(CPUS)) :] and pool.scheduler.cpus == len(pool.cpu_ids)
    assert pool.idle_cpus == 0.1
    assert build_cpu_pool(ServerSettings(action_cpu_reserve=0, action_idle_cpus=0.25)).cpu_ids == CPUS
    assert (reserve_for(2), reserve_for(16), reserve_for(128)) == (0, 1, 8)
    with pytest.raises(SandboxError, match="leaves no core"):
        build_cpu_pool(ServerSettings(action_cpu_reserve=len(CPUS)))


async def test_a_cgroup_without_a_writable_cpu_controller_keeps_its_quota_and_says_so_once(tmp_path, caplog):
    pool = pool_of(1)
    caplog.set_level(logging.WARNING, logger="prorl_server.sandbox.cpu_grants")
    missing = [SandboxCpu(pool, SandboxCgroup([]), f"sbx-{i}") for i in range(2)]
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    broken = SandboxCpu(pool, SandboxCgroup([tmp_path]), "sbx-broken")
    assert broken.quota and not missing[0].quota
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu.max").mkdir()  # writes fail from now on
    for sandbox_cpu in [*missing, broken, broken]:
        async with sandbox_cpu.action("bash") as grant:  # the actions still queue for their cores
            assert grant.cpu == 1
    assert not broken.quota
    notes = [r.getMessage() for r in caplog.records]
    assert sum("no cgroup cpu controller" in n for n in notes) == 1, notes
    assert sum("cannot change the cpu cgroup" in n for n in notes) == 1, notes
    books_balanced(pool)


async def test_a_command_with_dop_0_holds_no_core_and_runs_beside_a_busy_pool(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    busy, waiting = await asyncio.gather(isolated.start(), isolated.start())
    held = asyncio.ensure_future(busy.bash("sleep 1"))
    await until(lambda: pool.scheduler.books().running == 1)
    out = await asyncio.wait_for(waiting.bash("echo dop=${PRORL_DOP:-unset}; sleep 0.2", dop=0), 5)
    assert out.output.strip() == "dop=unset"  # ran while the only core was held: it asked none
    assert not held.done()
    if waiting.cpu.quota:
        assert quota_cores(waiting) == pytest.approx(0.1)  # it ran on the idle share
    await held
    assert pool.scheduler.books().granted_total == 3  # two starts and the busy command
    books_balanced(pool)


async def test_a_sandbox_start_is_an_action_that_waits_for_its_core(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    busy = await isolated.start()
    held = asyncio.ensure_future(busy.bash("sleep 1"))
    await until(lambda: pool.scheduler.books().running == 1)
    starting = asyncio.ensure_future(isolated.start())
    await until(lambda: pool.scheduler.books().waiting == 1)
    assert not starting.done()
    await held
    started = await asyncio.wait_for(starting, 30)
    if started.cpu.quota:
        assert quota_cores(started) == pytest.approx(0.1)  # lowered once its execution server answered
    assert pool.scheduler.models["start"].observations == 2
    books_balanced(pool)


async def test_a_static_sandbox_keeps_its_quota_outside_the_pool(isolated):
    pool = pool_of(1)
    isolated.remake(cpu_pool=pool)
    sandbox = await isolated.start(limits=SandboxLimits(cpus=0.5), cpu_grants="static")
    assert sandbox.cpu is None
    static = quota_cores(sandbox)
    out = await sandbox.bash("echo dop=${PRORL_DOP:-unset}", dop=(1, 8))
    assert out.output.strip() == "dop=unset"
    assert quota_cores(sandbox) == static and static in (None, pytest.approx(0.5))
    assert pool.scheduler.books().granted_total == 0  # neither its start nor its command took a core


def test_a_cpu_list_names_the_pool_and_servers_sharing_a_node_get_disjoint_slices():
    assert parse_cpus("0-3,8, 10-11") == (0, 1, 2, 3, 8, 10, 11)
    for bad in ("", "a", "3-1", "-1", "1-"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpus(bad)
    ids = tuple(range(10))
    slices = [cpu_slice(ids, i, 3) for i in range(3)]
    assert [len(s) for s in slices] == [3, 3, 4] and sorted(sum(slices, ())) == list(ids)
    assert [cpu_slice((0, 1), i, 3) for i in range(3)] == [(0,), (1,), (0,)]  # more servers than CPUs
    with pytest.raises(ValueError, match="does not exist"):
        cpu_slice(ids, 3, 3)
    pool = build_cpu_pool(ServerSettings(action_cpus=format_cpus(CPUS[-1:])))
    assert pool.cpu_ids == CPUS[-1:] and pool.scheduler.cpus == 1
    with pytest.raises(SandboxError, match="not among those this process may use"):
        build_cpu_pool(ServerSettings(action_cpus="4096"))


def test_prorl_server_slurm_cpus_prints_a_servers_slice(capsys):
    from prorl_server.cli import main

    main(["slurm", "cpus", "--index", "0", "--count", "1"])
    assert parse_cpus(capsys.readouterr().out.strip()) == CPUS
    with pytest.raises(SystemExit, match="slice 2 of 2 does not exist"):
        main(["slurm", "cpus", "--index", "2", "--count", "2"])
