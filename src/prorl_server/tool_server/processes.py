"""Finding and killing the processes of a session (Linux /proc), so a shell or kernel leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal


def proc_is_ours() -> bool:
    """True when /proc shows this process's PID namespace (a sandbox may have the host's /proc mounted)."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def session_members(sid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose session id is `sid`."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses): state ppid pgrp session ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            members.append(int(name))
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (its leader included). Without a /proc of our own PID
    namespace, only the leader's process group is killed: PIDs read from a foreign /proc would be wrong."""
    members = session_members(sid) if proc_is_ours() else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
