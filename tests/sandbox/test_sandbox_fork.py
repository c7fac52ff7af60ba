"""Snapshots and forks on the real runtimes: a fork starts from the snapshot's files, writes only into a
layer of its own, and sees nothing of its siblings (files, processes, network); a gone or corrupt snapshot
fails the fork with a clear SandboxError; nothing is left behind (the harness checks at teardown)."""

from __future__ import annotations

import shutil

import pytest

from prorl_server.sandbox import SandboxError
from prorl_server.sandbox.snapshot import MANIFEST

pytest_plugins = ("sandbox_fixtures",)

LISTEN = (
    'python3 -c \'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 8765)); s.listen(); '
    "time.sleep(600)' > /dev/null 2>&1 &"
)
CONNECT = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8765), timeout=2)' && echo reached"


def skip_unless_forks(harness) -> None:
    reason = harness.runtime.fork_unavailable()
    if reason is not None:
        pytest.skip(reason)


async def initialised(harness, **fields):
    """A snapshot of a sandbox whose INIT wrote files in its working directory and /tmp, deleted one, and
    left a process running."""
    template = await harness.start(**fields)
    out = await template.bash(
        "echo base > init.txt && mkdir -p /tmp/cache && echo c > /tmp/cache/c && echo gone > doomed.txt && "
        "rm doomed.txt && (sleep 1001 > /dev/null 2>&1 &) && echo ok"
    )
    assert out.output.strip().endswith("ok"), out
    return await harness.runtime.snapshot(template)


async def processes(sandbox) -> str:
    return (await sandbox.bash("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")).output


async def test_forks_start_from_the_snapshot_and_see_nothing_of_each_other(isolated):
    skip_unless_forks(isolated)
    snapshot = await initialised(isolated)
    assert (snapshot.directory / MANIFEST).exists()
    a, b = await isolated.runtime.fork(snapshot), await isolated.runtime.fork(snapshot)
    isolated.sandboxes += [a, b]
    for fork in (a, b):  # INIT's files, its deletion; not its process
        assert (await fork.read_file("init.txt")).strip() == "base"
        assert (await fork.read_file("/tmp/cache/c")).strip() == "c"
        assert (await fork.bash("test -e doomed.txt; echo $?")).output.strip() == "1"
        assert "sleep 1001" not in await processes(fork)
    await a.bash(f"echo a > init.txt && echo mine > a.txt && (sleep 777 > /dev/null 2>&1 &) && {LISTEN}")
    assert (await a.bash("sleep 1; " + CONNECT)).output.strip().endswith("reached")  # the listener works
    assert "sleep 777" in await processes(a)
    # b: its own copy of the snapshot, none of a's writes, processes or listening socket
    assert (await b.read_file("init.txt")).strip() == "base"
    assert (await b.bash("test -e a.txt; echo $?")).output.strip() == "1"
    assert "sleep 777" not in await processes(b)
    assert "reached" not in (await b.bash(CONNECT)).output
    # a later fork still starts from the snapshot as it was made
    c = await isolated.runtime.fork(snapshot)
    isolated.sandboxes.append(c)
    assert (await c.read_file("init.txt")).strip() == "base"
    snapshot.remove()
    assert not snapshot.directory.exists()


async def test_a_fork_keeps_the_disk_limit(isolated):
    skip_unless_forks(isolated)
    snapshot = await initialised(isolated, limits={"disk_mb": 16})
    fork = await isolated.runtime.fork(snapshot)
    isolated.sandboxes.append(fork)
    out = await fork.bash("head -c 40000000 /dev/zero > big; echo status=$?")
    assert "status=0" not in out.output, out
    snapshot.remove()


async def test_a_gone_or_corrupt_snapshot_fails_the_fork_clearly(isolated):
    skip_unless_forks(isolated)
    snapshot = await initialised(isolated)
    layer = snapshot.layer(0)
    if layer.is_dir():
        shutil.rmtree(layer)
    else:
        layer.unlink()
    with pytest.raises(SandboxError, match=f"snapshot {snapshot.id} is corrupt"):
        await isolated.runtime.fork(snapshot)
    (snapshot.directory / MANIFEST).write_text("{not json")
    with pytest.raises(SandboxError, match=f"snapshot {snapshot.id} is corrupt"):
        await isolated.runtime.fork(snapshot)
    snapshot.remove()
    with pytest.raises(SandboxError, match=f"snapshot {snapshot.id} is gone"):
        await isolated.runtime.fork(snapshot)


async def test_a_runtime_that_cannot_fork_says_why(any_runtime):
    if any_runtime.runtime.fork_unavailable() is None:
        pytest.skip("this runtime forks")
    sandbox = await any_runtime.start()
    with pytest.raises(SandboxError, match="fork"):
        await any_runtime.runtime.snapshot(sandbox)
    assert sandbox.closed
