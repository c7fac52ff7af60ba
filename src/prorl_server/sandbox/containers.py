"""Podman containers by owner label, for the reaper: which owners have some, and removing an owner's; and
the container monitors (conmon) a container podman lost track of leaves behind.

Kept apart from podman.py (the runtime) so the reaper can use it without importing the runtime. Every call
is a no-op, without running podman, where podman is not installed. A podman call costs 50 ms and more, so the
podman runtime leaves a marker (`MARKER`) in its owner's private directory, and an owner's containers are
looked for only where it is (`used`): the other runtimes' owners cost no podman call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

ENV_BINARY = "PRORL_PODMAN"  # path of the podman binary; else `podman` on PATH
LABEL = "prorl.owner"  # on every sandbox container: the owner id of the server that started it
REMOVE_TIMEOUT_S = 30.0
MARKER = "podman-containers"  # in <base dir>/<owner>/: this owner started podman containers


def mark(owner_dir: Path) -> None:
    """Record in an owner's private directory (made if missing, mode 0700) that it starts podman containers."""
    owner_dir.mkdir(mode=0o700, exist_ok=True)
    (owner_dir / MARKER).touch()


def used(owner_dir: Path) -> bool:
    """Whether the owner of this private directory started podman containers."""
    return (owner_dir / MARKER).exists()


def find_podman() -> str | None:
    """The podman binary: $PRORL_PODMAN, else `podman` on PATH."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("podman")


def _listed(binary: str, label: str, template: str) -> list[str]:
    """`podman ps -a` of containers with `label`, one formatted line each (empty if podman fails)."""
    try:
        listed = subprocess.run(
            [binary, "ps", "-a", "--filter", f"label={label}", "--format", template],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=REMOVE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return listed.stdout.split() if listed.returncode == 0 else []


def container_owners() -> set[str]:
    """Owner ids on the podman containers here."""
    binary = find_podman()
    return set() if binary is None else set(_listed(binary, LABEL, f'{{{{index .Labels "{LABEL}"}}}}'))


def owner_containers(owner: str) -> list[str]:
    """Names of the podman containers labelled with `owner`, running or not."""
    binary = find_podman()
    return [] if binary is None else _listed(binary, f"{LABEL}={owner}", "{{.Names}}")


def remove_containers(owner: str) -> list[str]:
    """`podman rm -f` every container labelled with `owner`; returns their names."""
    binary = find_podman()
    names = owner_containers(owner)
    if binary is not None and names:
        try:
            subprocess.run(
                [binary, "rm", "-f", "-t", "0", "--ignore", *names],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=REMOVE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
    return names


def _argv(pid: int) -> list[str]:
    """The command line of `pid` (empty if it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def monitors(directory: Path) -> list[int]:
    """PIDs of the conmon processes whose container pidfile (`-p`) lies under `directory`: the sandbox's slot
    directory, or an owner's private directory (podman writes it where `podman run --pidfile` said)."""
    prefix = f"{str(directory).rstrip('/')}/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        argv = _argv(int(name))
        is_conmon = bool(argv) and os.path.basename(argv[0]) == "conmon" and "-p" in argv[:-1]
        if is_conmon and argv[argv.index("-p") + 1].startswith(prefix):
            found.append(int(name))
    return found


def _children(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            children += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return children


def kill_monitors(directory: Path) -> list[int]:
    """SIGKILL the conmons of `monitors(directory)` and everything under them (the `runc init` of a container
    that was being created when podman's client was killed: `podman rm` no longer knows it, and it waits
    forever); returns the PIDs killed. The tree is listed first, then killed from the top: a conmon killed
    first runs no exit command, and its children, listed already, are killed after it."""
    killed = []
    for monitor in monitors(directory):
        tree, queue = [], [monitor]
        while queue:
            pid = queue.pop()
            tree.append(pid)
            queue += _children(pid)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
