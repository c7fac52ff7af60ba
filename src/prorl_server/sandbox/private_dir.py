"""Private directories under shared places such as /tmp: made by this user, mode 0700, never a link.

A directory another local user could have made first (world-writable, a symlink to their directory) must
never be trusted: a root server would otherwise put its sandboxes, sockets and images where that user can
swap them. `ensure_private_dir` makes the directory if it is missing and otherwise checks, without
following links, that it is a real directory owned by this process's user and closed to everyone else.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from prorl_server.sandbox.errors import SandboxError


def user_dir(prefix: str) -> Path:
    """`<prefix>-<euid>`: one private directory per user, so two users' servers never share one."""
    return Path(f"{prefix}-{os.geteuid()}")


def ensure_private_dir(path: Path) -> Path:
    """Make `path` (mode 0700, parents as needed) or check that the existing one is private; returns it.

    Raises SandboxError, saying what to do, when it is a link, not a directory, owned by another user or
    writable by group or others; one of ours that others may only read is closed to them.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to this server's uid {os.geteuid()}"
    elif stat.S_IMODE(info.st_mode) & 0o022:
        problem = f"has mode {stat.S_IMODE(info.st_mode):04o}: others may write in it (0700 expected)"
    if problem is None and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)  # ours, readable by others (an older version made it so)
    if problem is not None:
        raise SandboxError(
            f"refusing to use {path}: it {problem}. Another user may have made it to take over this server's "
            "sandboxes; remove it (or give the server another directory) and start again"
        )
    return path
