"""The reaper finds sandbox processes by owner tag: after `kill -9` of a server, its restart leaves none."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

from prorl_server.sandbox import new_owner_id, reap, reap_orphans
from prorl_server.sandbox.containers import owner_containers
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR, owner_alive, tagged_processes

pytest_plugins = ("sandbox_fixtures",)

# A stand-in server: starts sandboxes (a few with processes that left the shell's session), reports its owner
# id and sandbox ids on stdout, then waits to be killed.
SERVER = """
import asyncio, json, sys
from prorl_server.sandbox import SandboxSpec, make_runtime, new_owner_id

name, image, count, options = json.loads(sys.argv[1])

async def bash(sandbox, command):
    reader, writer = await asyncio.open_unix_connection(str(sandbox.socket_path))
    writer.write(json.dumps({"id": 1, "action": "bash", "command": command}).encode() + b"\\n")
    await reader.readline()
    writer.close()

async def main():
    owner = new_owner_id()
    runtime = make_runtime(name, owner, **options)
    sandboxes = await asyncio.gather(*(runtime.start(SandboxSpec(image=image)) for _ in range(count)))
    await asyncio.gather(*(bash(s, "setsid sleep 600 & (sleep 601 &)") for s in sandboxes[:5]))
    print(json.dumps({"owner": owner, "ids": [s.id for s in sandboxes]}), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def start_server(name: str, image: str | None, count: int, options: dict) -> tuple[subprocess.Popen[str], dict]:
    """Run SERVER in its own process; returns it and what it reported once its sandboxes are up."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, json.dumps([name, image, count, options])],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    ready, _, _ = select.select([server.stdout], [], [], 120)
    assert ready, "the stand-in server did not start its sandboxes in 2 minutes"
    return server, json.loads(server.stdout.readline())


def test_owner_ids_name_a_live_process_or_a_dead_one():
    mine = new_owner_id()
    assert mine.startswith(f"prorl-{os.getpid()}-") and owner_alive(mine) is True
    pid, start, suffix = mine.removeprefix("prorl-").split("-")
    assert owner_alive(f"prorl-{pid}-{int(start) + 1}-{suffix}") is False  # same PID, other start: reused PID
    assert owner_alive("prorl-999999999-1-abc") is False
    assert owner_alive("someone-else") is None  # not ours: never reaped on start


def test_restart_after_kill_9_of_a_server_with_50_sandboxes_leaves_none(any_runtime):
    server, info = start_server(any_runtime.name, any_runtime.case.image, 50, any_runtime.case.options)
    owner, ids = info["owner"], set(info["ids"])
    try:
        assert {p.sandbox_id for p in tagged_processes() if p.owner == owner} >= ids
        restarted = new_owner_id()
        assert not [p for p in reap_orphans(restarted) if p.owner == owner]  # a live server is left alone
        assert {p.sandbox_id for p in tagged_processes() if p.owner == owner} >= ids
    finally:
        server.kill()
        server.wait()
    killed = reap_orphans(restarted)  # what a restarted server does first
    assert any_runtime.wait_until(lambda: not [p for p in tagged_processes() if p.owner == owner], timeout=10)
    assert not (DEFAULT_BASE_DIR / owner).exists()
    assert any_runtime.leftovers(owner=owner) == {}  # processes, private directories, cgroups
    assert owner_containers(owner) == []  # podman's, by owner label (none for the other runtimes)
    if any_runtime.name == "local":  # no pid namespace: the execution servers and escapees outlive the server
        assert len({p.sandbox_id for p in killed if p.owner == owner}) == 50
        assert len([p for p in killed if p.owner == owner]) >= 60


async def test_reap_on_stop_kills_what_the_own_sandboxes_left(any_runtime):
    sandbox = await any_runtime.start()
    await sandbox.bash("setsid sleep 602 & (sleep 603 &)")
    assert len([p for p in tagged_processes() if p.sandbox_id == sandbox.id]) >= 3
    killed = reap(owner=any_runtime.owner)  # the server stops without closing this sandbox
    assert {p.sandbox_id for p in killed} >= {sandbox.id}
    assert any_runtime.wait_until(lambda: not [p for p in tagged_processes() if p.sandbox_id == sandbox.id])


def test_a_container_monitor_podman_lost_is_killed_with_its_children(tmp_path):
    """A `podman run` client killed while it created its container can leave that container's conmon and its
    `runc init` behind, unknown to `podman rm`: they are found by the container pidfile in conmon's argv
    (under the owner's directory) and killed, children first. Here a bash named conmon, with a child, stands
    in for them."""
    import shutil
    import time

    from prorl_server.sandbox.containers import kill_monitors, mark, monitors
    from prorl_server.sandbox.reaper import remove_owner_files

    shutil.copy("/bin/bash", tmp_path / "conmon")
    owner = new_owner_id()
    base = tmp_path / "base"
    base.mkdir()
    mark(base / owner)
    ours = base / owner / "sbx-1"
    theirs = tmp_path / "other-owner" / "sbx-2"
    argv = [str(tmp_path / "conmon"), "-c", "sleep 600 & wait", "-n", "prorl-sbx"]
    mine = subprocess.Popen([*argv, "-p", str(ours / "container.pid")])
    other = subprocess.Popen([*argv, "-p", str(theirs / "container.pid")])
    try:
        deadline = time.monotonic() + 10
        while not all(monitors(d) for d in (ours, theirs)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert monitors(ours) == [mine.pid] and monitors(base / owner) == [mine.pid]
        child = subprocess.run(["pgrep", "-P", str(mine.pid)], capture_output=True, text=True).stdout.split()
        assert len(child) == 1  # its `sleep 600`, as a conmon's runc init
        remove_owner_files(owner, base)  # the reaper's end of an owner: its monitors go with it
        assert mine.wait(10) == -9 and not alive(int(child[0]))
        assert other.poll() is None and monitors(theirs) == [other.pid]  # another owner's is left alone
        assert kill_monitors(theirs) and other.wait(10) == -9
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()


def alive(pid: int) -> bool:
    """`pid` runs (neither gone nor a zombie waiting for its reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
