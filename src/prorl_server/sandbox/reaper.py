"""The reaper: finds sandbox processes by their owner tag (never by name) and kills them by PID.

Every process a sandbox starts has `PRORL_SANDBOX_OWNER=<owner id>` and `PRORL_SANDBOX_ID=<sandbox id>` in
its environment (`/proc/<pid>/environ`). An owner id names the server instance that started it:
`prorl-<pid>-<start time>-<random>`, the server's PID and its start time in clock ticks after boot
(`/proc/<pid>/stat` field 22). An owner is dead when no process has that PID *and* start time, so a reused
PID never keeps a dead owner alive.

- On server start, `reap_orphans(current_owner)` kills the processes of dead owners only, and removes their
  private directories, cgroups and podman containers (by label, containers.py): two servers on one node never kill each other's sandboxes. Tags that are
  not in this format are left alone (and logged).
- On server stop, `reap(owner=current_owner)` kills whatever its own sandboxes left behind.

The reaper must see the servers' PIDs: run servers that share a node in the same PID namespace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from prorl_server.sandbox import cgroups, containers
from prorl_server.sandbox.private_dir import user_dir
from prorl_server.tool_server.protocol import ENV_OWNER, ENV_SANDBOX_ID

log = logging.getLogger(__name__)

# private directories: <base>/<owner>/<sandbox id>/, in a directory of this user alone (private_dir.py)
DEFAULT_BASE_DIR = user_dir("/tmp/prorl-sandboxes")
# snapshots kept in memory (bubblewrap's, whose sandboxes' writable mounts are memory too): <dir>/<owner>/snap-<id>/
MEMORY_SNAPSHOT_DIR = user_dir("/dev/shm/prorl-snapshots")
_OWNER = re.compile(r"^prorl-(\d+)-(\d+)-[0-9a-f]+$")
_TAG_KEYS = (ENV_OWNER.encode(), ENV_SANDBOX_ID.encode())
_ENGINE_CONFIG = re.compile(rb"^ENGINE_CONFIG(\d+)$")


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks after boot, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


def new_owner_id() -> str:
    """An owner id for this server instance: its PID, its start time and a random suffix."""
    pid = os.getpid()
    return f"prorl-{pid}-{start_time(pid)}-{secrets.token_hex(3)}"


def owner_alive(owner: str) -> bool | None:
    """True if the owner's server process still runs, False if it is gone, None if the id is not ours."""
    match = _OWNER.match(owner)
    if match is None:
        return None
    return start_time(int(match.group(1))) == int(match.group(2))


@dataclass(frozen=True)
class Tagged:
    """A live process that carries an owner tag."""

    pid: int
    owner: str
    sandbox_id: str | None


def _environ(pid: int) -> dict[bytes, bytes]:
    """The tag variables of a process's initial environment (empty if unreadable or not tagged).

    Apptainer's `starter` and `appinit` replace their environment with the engine configuration
    (`ENGINE_CONFIG1`, `ENGINE_CONFIG2`, ... chunks of one JSON document) that holds the container's
    environment, tags included; those count as tagged too.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    if ENV_OWNER.encode() not in data:
        return {}
    found: dict[bytes, bytes] = {}
    engine_config: dict[int, bytes] = {}
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in _TAG_KEYS:
            found[key] = value
        elif (chunk := _ENGINE_CONFIG.match(key)) is not None:
            engine_config[int(chunk.group(1))] = value
    if not found and engine_config:
        config = b"".join(engine_config[i] for i in sorted(engine_config))
        for key in _TAG_KEYS:
            if (match := re.search(rb'"' + key + rb'":"([^"]+)"', config)) is not None:
                found[key] = match.group(1)
    return found


REAP_PASSES = 10
"""Most listing-and-killing passes one `reap` makes."""


def tagged_processes() -> list[Tagged]:
    """Every live process with an owner tag (this process excluded)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        env = _environ(int(name))
        owner = env.get(ENV_OWNER.encode())
        if owner is not None:
            sandbox = env.get(ENV_SANDBOX_ID.encode())
            found.append(Tagged(int(name), owner.decode(), sandbox.decode() if sandbox is not None else None))
    return found


def _kill_if_tagged(pid: int, key: str, value: str) -> bool:
    """SIGKILL `pid` if it still carries `key=value`; a pidfd makes sure it is the process that was checked."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd (old kernel): check, then kill by PID
        fd = None
    try:
        if _environ(pid).get(key.encode()) != value.encode():
            return False
        if fd is None:
            os.kill(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def kill_tagged(key: str, value: str) -> list[int]:
    """SIGKILL every process whose environment has `key=value`; returns their PIDs."""
    env_key = key.encode()
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and _environ(int(n)).get(env_key) == value.encode()]
    return [pid for pid in pids if pid != os.getpid() and _kill_if_tagged(pid, key, value)]


def reap(owner: str | None = None, exclude_owner: str | None = None) -> list[Tagged]:
    """SIGKILL tagged processes of `owner` except those of `exclude_owner`, pass after pass until a pass
    finds none left (at most REAP_PASSES): a process not yet killed can start another (a tool server
    replacing its killed shell) after the pass listed the processes.

    `owner=None` means every owner, live servers' included: on a shared node use `reap_orphans` instead.
    """
    killed: list[Tagged] = []
    for _ in range(REAP_PASSES):  # a process killed late in a pass may have spawned a child after the listing
        this_pass = []
        for proc in tagged_processes():
            wanted = (owner is None or proc.owner == owner) and proc.owner != exclude_owner
            if wanted and _kill_if_tagged(proc.pid, ENV_OWNER, proc.owner):
                this_pass.append(proc)
        if not this_pass:
            break
        killed += this_pass
    if killed:
        log.warning("reaped %d sandbox processes: %s", len(killed), sorted({p.owner for p in killed}))
    return killed


def remove_owner_files(owner: str, base_dir: Path = DEFAULT_BASE_DIR) -> None:
    """Remove an owner's podman containers (if it started any), kill what is left in its cgroups, remove them
    and its private directories (in-memory snapshots too)."""
    if containers.used(base_dir / owner):
        containers.remove_containers(owner)
        containers.kill_monitors(base_dir / owner)
    for directory in cgroups.owner_directories(cgroups.detect(warn=False, cpuset=True)).get(owner, []):
        with contextlib.suppress(OSError):
            leftover = cgroups.SandboxCgroup([d for d in directory.iterdir() if d.is_dir()])
            leftover.kill()
            leftover.remove()
            directory.rmdir()
    shutil.rmtree(base_dir / owner, ignore_errors=True)
    shutil.rmtree(MEMORY_SNAPSHOT_DIR / owner, ignore_errors=True)


def reap_orphans(current_owner: str | None = None, base_dir: Path = DEFAULT_BASE_DIR) -> list[Tagged]:
    """Server start: kill the processes of dead owners and remove their files; live owners are left alone."""
    owners = {p.owner for p in tagged_processes()}
    owners |= set(cgroups.owner_directories(cgroups.detect(warn=False, cpuset=True)))
    owners |= containers.container_owners()
    for directory in (base_dir, MEMORY_SNAPSHOT_DIR):
        with contextlib.suppress(OSError):
            owners |= {d.name for d in directory.iterdir()}
    killed: list[Tagged] = []
    for owner in sorted(owners - {current_owner}):
        alive = owner_alive(owner)
        if alive is None:
            log.info("leaving sandbox processes/files of owner %r alone: not a prorl owner id", owner)
        elif not alive:
            killed += reap(owner=owner)
            remove_owner_files(owner, base_dir)
    return killed
